"""Finding promtool/prometheus for the observability tests, and small PromQL helpers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
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
