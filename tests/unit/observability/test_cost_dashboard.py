"""The executive dashboard's "what recoveries cost" row reads the operator's cost counters."""

from __future__ import annotations

import pytest

from tests.unit.observability.test_dashboards import exprs, load, panels

pytestmark = pytest.mark.unit


def test_the_executive_dashboard_shows_what_recoveries_cost() -> None:
    board = load("executive")
    rows = [p for p in panels(board) if p["type"] == "row" and "What recoveries cost" in p["title"]]
    assert len(rows) == 1
    below = [p for p in panels(board) if p["gridPos"]["y"] > rows[0]["gridPos"]["y"] and p["type"] != "row"]
    queries = "\n".join(e for key, e in exprs(board).items() if any(key.startswith(p["title"]) for p in below))
    for metric in ("mpjob_operator_gpu_seconds_total", "mpjob_operator_wasted_gpu_seconds_total"):
        assert metric in queries, metric
    assert "mpjob_operator_wasted_gpu_cost_total" in queries and "$gpu_hour_cost" in queries
