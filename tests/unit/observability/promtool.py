"""Finding promtool/prometheus for the observability tests, and small PromQL helpers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Set
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "helm/mpjob/rules/mpjob-alerts.yaml"
DASHBOARDS = REPO / "helm/mpjob/dashboards"
RUNBOOKS = REPO / "docs/runbooks"
METRICS_DOC = REPO / "docs/metrics.md"


def require(binary: str) -> str:
    """Path of `binary`; skip when absent on a developer machine, fail in CI (CI=true)."""
    path = shutil.which(binary)
    if path:
        return path
    hint = f"{binary} not on PATH (install with scripts/install-prometheus.sh)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(hint + " and CI=true: the observability checks must run in CI")
    pytest.skip(hint)


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def check_exprs(exprs: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run `promtool check rules` on a rule file with one recording rule per expression."""
    rules = [{"record": f"check:{re.sub(r'[^a-zA-Z0-9_]', '_', key)}", "expr": e} for key, e in exprs.items()]
    path = tmp / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}, sort_keys=False))
    return promtool("check", "rules", str(path))


# Words in a PromQL expression that are not metric names.
_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2", "start", "end",
}  # fmt: skip
_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'  # strings
    r"|\{[^}]*\}"  # label matchers
    r"|\[[^\]]*\]"  # ranges and subqueries
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"  # label lists
    r"|(?P<num>\d[\w.]*)"  # numbers and durations
    r"|(?P<id>[a-zA-Z_:][\w:]*)(?P<call>\s*\(|\s+(?=(?:by|without)\s*\())?"  # calls, `sum by (..) (`
)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (identifiers that are not functions or keywords)."""
    names = set()
    for match in _TOKEN.finditer(expr):
        ident = match.group("id")
        if ident and not match.group("call") and ident.lower() not in _KEYWORDS:
            names.add(ident)
    return names


# Labels Prometheus adds to every series of a scrape target (the chart's PodMonitor and
# ServiceMonitor): a query may select or group by them on any of our metrics.
TARGET_LABELS = frozenset({"job", "namespace", "instance", "pod", "container", "endpoint", "service"})
_ROW = re.compile(r"^\| `(?P<name>[a-zA-Z_:][\w:]*)` \| (?P<type>\w+) \| (?P<labels>[^|]*) \|")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def documented(section: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{name: (type, labels)} from docs/metrics.md's table under '## <section>'."""
    body = METRICS_DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in body.splitlines():
        if match := _ROW.match(line):
            labels = tuple(re.findall(r"[a-z_][a-z0-9_]*", match["labels"])) if match["labels"].strip() != "—" else ()
            assert match["name"] not in rows, f"{match['name']} documented twice"
            rows[match["name"]] = (match["type"], labels)
    return rows


def series_labels() -> dict[str, frozenset[str] | None]:
    """Each series name a query may select -> the labels it carries (None: an exporter's own,
    not known here). A histogram is only its _bucket (with `le`), _sum and _count series."""
    found: dict[str, frozenset[str] | None] = {}
    for name, (kind, labels) in {**documented("Trainer"), **documented("Operator")}.items():
        if kind == "histogram":
            found |= {f"{name}_sum": frozenset(labels), f"{name}_count": frozenset(labels)}
            found[f"{name}_bucket"] = frozenset((*labels, "le"))
        else:
            found[name] = frozenset(labels)
    external = METRICS_DOC.read_text().split("\n## External", 1)[1]
    found |= {name: None for name in re.findall(r"^\| `([a-zA-Z_:][\w:]*)` \|", external, re.M)}
    return found


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, the label names its matchers test) for each metric an expression selects."""
    found: list[tuple[str, set[str]]] = []
    tokens = list(_TOKEN.finditer(expr))
    for match, after in zip(tokens, [*tokens[1:], None], strict=True):
        ident = match.group("id")
        if ident and not match.group("call") and ident.lower() not in _KEYWORDS:
            adjacent = after is not None and not expr[match.end() : after.start()].strip()
            braces = after.group(0) if after is not None and adjacent and after.group(0).startswith("{") else ""
            matchers = _STRING.sub('""', braces)
            found.append((ident, set(_MATCHER.findall(matchers))))
    return found


def grouping(expr: str) -> set[str]:
    """Label names of the expression's by/without/on/ignoring/group_* lists."""
    text = _STRING.sub('""', expr)
    return {label.strip() for group in _GROUPING.findall(text) for label in group.split(",") if label.strip()}


def aggregated(expr: str) -> set[str] | None:
    """The labels the expression's by (...) lists keep, None when it has none."""
    lists = re.findall(r"\bby\s*\(([^)]*)\)", _STRING.sub('""', expr))
    return {label.strip() for group in lists for label in group.split(",") if label.strip()} if lists else None


def label_problems(expr: str, known: dict[str, frozenset[str] | None], shown: Set[str] = frozenset()) -> list[str]:
    """Labels the expression (or `shown`: a legend's, an annotation's) uses that its metrics
    never carry; empty where an exporter's metric (labels unknown) takes part."""
    found = selectors(expr)
    problems = [f"{name} is no known series" for name, _ in found if name not in known]
    carried: set[str] = set(TARGET_LABELS)
    for name, matched in found:
        labels = known.get(name)
        if labels is None:
            return problems
        carried |= labels
        problems += [f"{name} has no label {label}" for label in sorted(matched - labels - TARGET_LABELS)]
    if "label_replace" not in expr and "label_join" not in expr:
        problems += [f"no metric carries {label} (grouping)" for label in sorted(grouping(expr) - carried)]
        kept = aggregated(expr)
        problems += [f"{label} is not in the result" for label in sorted(shown - (carried if kept is None else kept))]
    return problems
