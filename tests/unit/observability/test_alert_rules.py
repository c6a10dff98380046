"""The alert rules: promtool accepts them, every alert is unit-tested with synthetic series
(firing and quiet cases), and each carries severity, summary, description and a runbook."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.observability.promtool import (
    REPO,
    RULES,
    RUNBOOKS,
    label_problems,
    metric_names,
    promtool,
    selectors,
    series_labels,
)

pytestmark = pytest.mark.unit

ALERTS = {
    "NumericFaultHalt": "page",
    "FallbackStorm": "page",
    "TrainingStalled": "page",
    "CheckpointFailing": "page",
    "CheckpointCommitFailing": "ticket",
    "LossScaleCollapsing": "ticket",
    "EvalLossDrift": "ticket",
    "DataSkipped": "ticket",
    "AttemptsBackingOff": "page",
    "PodsNotStarting": "ticket",
    "OperatorDown": "page",
    "ReconcileErrors": "ticket",
}
PROMTOOL_TESTS = Path(__file__).with_name("mpjob-alerts.test.yaml")


def rules() -> list[dict[str, Any]]:
    """Every rule of the file, recording rules included."""
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def test_promtool_accepts_the_rule_file() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_every_alert_passes_its_promtool_unit_tests() -> None:
    result = promtool("test", "rules", PROMTOOL_TESTS.name, cwd=PROMTOOL_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_would_catch_a_wrong_expectation(tmp_path: Path) -> None:
    """Guards against a test file promtool passes vacuously."""
    tests = yaml.safe_load(PROMTOOL_TESTS.read_text())
    tests["rule_files"] = [str(RULES)]
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            check["exp_alerts"] = [] if check["exp_alerts"] else [{"exp_labels": {"severity": "page"}}]
    path = tmp_path / "inverted.test.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(path))
    assert result.returncode != 0
    checks = sum(len(case["alert_rule_test"]) for case in tests["tests"])
    assert (result.stdout + result.stderr).count("alertname:") == checks, "every single check must fail once inverted"


def test_the_alert_set_and_severities_are_the_documented_ones() -> None:
    assert {r["alert"]: r["labels"]["severity"] for r in alert_rules()} == ALERTS


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_alert_has_a_runbook_summary_description_and_for(rule: dict[str, Any]) -> None:
    annotations = rule["annotations"]
    assert annotations["summary"] and annotations["description"]
    assert annotations["runbook_url"] == f"docs/runbooks/{rule['alert']}.md"
    assert (REPO / annotations["runbook_url"]).is_file()
    assert rule["for"], "a for: duration keeps one bad scrape from paging"


def test_every_alert_has_firing_and_quiet_promtool_cases() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fires == set(ALERTS) and quiet == set(ALERTS)


def known_series() -> dict[str, frozenset[str] | None]:
    """docs/metrics.md's series, and the rule file's recorded ones with their metrics' labels."""
    known = series_labels()
    for rule in rules():
        if "record" in rule:
            labels = [known.get(name) for name, _ in selectors(rule["expr"])]
            known[rule["record"]] = None if None in labels else frozenset().union(*labels)  # type: ignore[arg-type]
    return known


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r.get("alert") or r["record"])
def test_rules_use_only_documented_series_and_labels_they_carry(rule: dict[str, Any]) -> None:
    """Every series is on docs/metrics.md (a histogram by its _bucket/_sum/_count), and every
    matcher, by/on list and $labels.x of the annotations names a label the result has."""
    texts = " ".join(rule.get("annotations", {}).values())
    shown = set(re.findall(r"\$labels\.(\w+)", texts)) - set(rule.get("labels", {}))
    assert label_problems(rule["expr"], known_series(), shown) == []


def test_per_job_alerts_group_by_job_not_by_pod_or_rule() -> None:
    """One alert per job (and precision/attempt), never one per pod, scrape target or guard rule."""
    for rule in alert_rules():
        if any(name.startswith("mpjob_trainer_") for name in metric_names(rule["expr"])):
            assert "by (namespace, job" in rule["expr"], rule["alert"]


def test_runbooks_exist_for_alerts_and_the_f4_f5_f6_failure_modes() -> None:
    expected = {f"{a}.md" for a in ALERTS} | {
        "F4-UnsupportedOpInLowPrecision.md",
        "F5-ReproducibilityDrift.md",
        "F6-AmpSlowerThanFp32.md",
    }
    assert expected <= {p.name for p in RUNBOOKS.glob("*.md")}
    for name in expected:
        text = (RUNBOOKS / name).read_text()
        assert "kubectl get mpj" in text and "kubectl describe mpj" in text, name
