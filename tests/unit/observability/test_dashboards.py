"""The Grafana dashboards: every panel's PromQL parses (promtool, template variables
substituted) and selects only metrics from docs/metrics.md (ours, DCGM, kube-state-metrics)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.observability.promtool import (
    DASHBOARDS,
    RULES,
    check_exprs,
    label_problems,
    metric_names,
    series_labels,
)

pytestmark = pytest.mark.unit

BOARDS = ("executive", "oncall", "debug")
# Grafana's built-in variables that stand for durations in PromQL.
GRAFANA_DURATIONS = {"__rate_interval", "__interval", "__range"}
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|([A-Za-z_]\w*))")


def load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / f"{name}.json").read_text())


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exprs(board: dict[str, Any]) -> dict[str, str]:
    return {
        f"{panel['title']} {target['refId']}": target["expr"]
        for panel in panels(board)
        for target in panel.get("targets", [])
    }


def variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def substitute(expr: str, board: dict[str, Any]) -> str:
    """Replace Grafana variables the way Grafana would, with a plausible value for each."""
    defined = variables(board)

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in GRAFANA_DURATIONS:
            return "5m"
        assert name in defined, f"${name} is not a template variable of {board['uid']}"
        return defined[name]["query"] if defined[name]["type"] == "textbox" else "x"

    # `$1` in label_replace is PromQL's, not Grafana's: variables start with a letter or _.
    return _VARIABLE.sub(value, expr)


def catalogue() -> set[str]:
    """Series docs/metrics.md lists: a histogram as its _bucket/_sum/_count series only."""
    return set(series_labels())


def legend_labels(target: dict[str, Any]) -> set[str]:
    """Labels a target's legend shows, as Grafana reads {{ label }}."""
    return set(re.findall(r"\{\{\s*(.+?)\s*\}\}", target.get("legendFormat") or ""))


def test_metric_name_extraction_ignores_functions_labels_strings_and_durations() -> None:
    expr = (
        'sum by (le, pod) (rate(a_seconds_bucket{job="x", pod=~"y-a[0-9]+"}[5m] offset 1h)) / on (pod) '
        'group_left () label_replace(DCGM_FI_DEV_GPU_UTIL, "job", "$1", "pod", "(.+)") and b > bool 2e3'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "DCGM_FI_DEV_GPU_UTIL", "b"}


@pytest.mark.parametrize("name", BOARDS)
def test_every_panel_query_parses(name: str, tmp_path: Path) -> None:
    board = load(name)
    queries = {key: substitute(expr, board) for key, expr in exprs(board).items()}
    assert len(queries) >= 8
    result = check_exprs(queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", BOARDS)
def test_panels_use_only_catalogued_metrics(name: str) -> None:
    board = load(name)
    allowed = catalogue()
    used = {key: metric_names(substitute(expr, board)) for key, expr in exprs(board).items()}
    for var in variables(board).values():
        if var["type"] == "query":
            series = re.fullmatch(r"label_values\((.+), *\w+\)", var["definition"])
            assert series, var["definition"]
            used[f"${var['name']}"] = metric_names(substitute(series.group(1), board))
    unknown = {key: names - allowed for key, names in used.items() if names - allowed}
    assert not unknown, f"not in docs/metrics.md: {unknown}"
    assert all(used.values()), "every query selects at least one metric"


@pytest.mark.parametrize("name", BOARDS)
def test_panels_select_group_and_show_only_labels_their_metrics_carry(name: str) -> None:
    """A matcher, a by/on list or a legend naming a label no selected series has shows nothing."""
    board, known = load(name), series_labels()
    problems = {
        f"{panel['title']} {target['refId']}": found
        for panel in panels(board)
        for target in panel.get("targets", [])
        if (found := label_problems(substitute(target["expr"], board), known, legend_labels(target)))
    }
    assert not problems


def test_label_check_sees_a_label_never_set() -> None:
    known = series_labels()
    assert label_problems('mpjob_trainer_loss{rule="x"}', known) == ["mpjob_trainer_loss has no label rule"]
    assert label_problems("sum by (phase) (mpjob_trainer_loss)", known) == ["no metric carries phase (grouping)"]
    assert label_problems("sum by (job) (mpjob_trainer_loss)", known, {"attempt"}) == ["attempt is not in the result"]
    assert label_problems("mpjob_trainer_step_seconds", known) == ["mpjob_trainer_step_seconds is no known series"]
    assert not label_problems('DCGM_FI_DEV_GPU_UTIL{gpu="0"}', known, {"gpu"})


def test_dashboards_have_unique_uids_and_panel_ids() -> None:
    boards = [load(n) for n in BOARDS]
    assert len({b["uid"] for b in boards}) == len(boards)
    for board in boards:
        ids = [p["id"] for p in panels(board)]
        assert len(ids) == len(set(ids)), board["uid"]
        assert all(p["datasource"]["uid"] == "${datasource}" for p in panels(board) if p["type"] != "row")


def test_debug_dashboard_is_per_job_with_the_panels_an_investigation_needs() -> None:
    board = load("debug")
    assert {"namespace", "job", "attempt"} <= set(variables(board))
    titles = {p["title"]: p for p in panels(board)}
    scale = titles["Loss scale (log axis)"]
    assert scale["fieldConfig"]["defaults"]["custom"]["scaleDistribution"]["type"] == "log"
    trainer_queries = [e for e in exprs(board).values() if "mpjob_trainer_" in e]
    assert trainer_queries and all('job="$job"' in e for e in trainer_queries)
    metrics = ["loss", "loss_scale", "grad_norm", "step_seconds", "mfu_ratio", "peak_device_memory_bytes"]
    metrics += ["checkpoint_save_seconds", "checkpoint_failures_total", "precision"]
    for metric in metrics:
        assert any(f"mpjob_trainer_{metric}" in e for e in trainer_queries), metric


def test_gpu_panels_use_dcgm_joined_to_jobs_by_pod() -> None:
    for name in BOARDS:
        for expr in exprs(load(name)).values():
            if "DCGM_" in expr:
                assert re.search(r'pod=~"[^"]*-a\[0-9\]\+-', expr), expr
    assert any("DCGM_FI_DEV_GPU_UTIL" in e for e in exprs(load("executive")).values())
    assert any("DCGM_FI_DEV_GPU_UTIL" in e for e in exprs(load("debug")).values())


def test_executive_compares_precisions_against_fp32_and_oncall_covers_operator_health() -> None:
    executive = "\n".join(exprs(load("executive")).values())
    assert 'precision="fp32"' in executive and "$gpu_hour_cost" in executive
    assert "mpjob_operator_jobs" in executive and "mpjob_operator_precision_fallbacks_total" in executive
    oncall = "\n".join(exprs(load("oncall")).values())
    needles = ["non_finite_losses_total", "overflow_steps_total", 'up{job="mpjob-operator"}']
    needles += ["reconcile_duration_seconds_bucket", "errors_total", "changes(mpjob_trainer_step[15m])"]
    for needle in needles:
        assert needle in oncall, needle


def test_the_oncall_board_shows_each_jobs_current_precision_fp8_included() -> None:
    titles = {p["title"]: p for p in panels(load("oncall"))}
    current = titles["Current precision by job"]
    (target,) = current["targets"]
    assert target["expr"] == "max by (namespace, job, attempt, precision) (mpjob_trainer_precision)"
    assert "fp8" in current["description"] and "fp8" in titles["Attempts by precision"]["description"]


def test_the_oncall_board_lists_every_alert_of_the_rule_file() -> None:
    """The firing-alerts table selects each alert the rules define, and only those."""
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    (expr,) = [e for e in exprs(load("oncall")).values() if e.startswith("ALERTS{")]
    listed = re.search(r'alertname=~"([^"]*)"', expr)
    assert listed and set(listed.group(1).split("|")) == alerts
