"""The GPU check's pytest step, test by test: a pytest plugin (`-p scripts.gpu.pytest_progress
--progress-log PATH`) that writes what was collected, each test's start and each of its phases'
outcomes to PATH as JSON lines, flushed as they happen, and `progress`, which reads them back.

JUnit XML is written only when pytest ends; a step stopped at its budget (the first run on an
H200: 49 of 52 tests done, the 3 still running not named) loses it. These lines survive the
stop, so the step's result still counts what finished and names what was collected but never
finished, and the slowest tests say where the budget went. With pytest-xdist the controller
writes them (its workers' reports reach it); a worker writes nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

import pytest

#: A test's outcomes, as `outcome` names them, and the result's field counting each.
OUTCOMES = {"passed": "passed", "failed": "failures", "error": "errors", "skipped": "skipped",
            "unfinished": "unfinished", "not started": "notStarted"}  # fmt: skip
#: Of the slowest tests (all phases), in the step's result.
SLOWEST = 5


class ProgressLog:
    def __init__(self, path: Path) -> None:
        self.sink: IO[str] = path.open("a")
        self.began = time.monotonic()

    def write(self, event: str, **fields: Any) -> None:
        line = {"event": event, "t": round(time.monotonic() - self.began, 3), **fields}
        self.sink.write(json.dumps(line) + "\n")
        self.sink.flush()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.write("collected", tests=[item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.write("collected", tests=list(ids))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a test file that does not import: pytest then runs nothing
            self.write("collectError", test=report.nodeid)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.write("start", test=nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.write("report", test=report.nodeid, when=report.when, outcome=report.outcome,
                   seconds=round(report.duration, 3))  # fmt: skip

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.sink.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--progress-log", metavar="PATH", help="each test's start and outcomes, as JSON lines")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--progress-log")
    if path and not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller
        config.pluginmanager.register(ProgressLog(Path(path)), "mpjob-progress-log")


# ---------------------------------------------------------------- reading it back
def outcome(started: bool, reports: list[dict[str, Any]]) -> str:
    """A test's outcome from its phases' reports: failed (its call), error (setup or teardown),
    skipped, passed, unfinished (started, no teardown reported: running when stopped), or not
    started."""
    if not started:
        return "not started"
    for report in reports:
        if report["outcome"] == "failed":
            return "failed" if report["when"] == "call" else "error"
    if not any(report["when"] == "teardown" for report in reports):
        return "unfinished"
    return "skipped" if any(report["outcome"] == "skipped" for report in reports) else "passed"


def events(path: Path) -> list[dict[str, Any]]:
    """The log's lines; a last one torn by the step's stop is left out."""
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found


def progress(path: Path) -> dict[str, Any]:
    """The step's counts, the tests that failed or never finished, the slowest ones, and the
    test files that failed to collect."""
    collected: list[str] = []
    reports: dict[str, list[dict[str, Any]]] = {}
    started: dict[str, float] = {}
    uncollected: list[str] = []
    for event in events(path):
        if event["event"] == "collected" and not collected:  # each xdist worker says it; all alike
            collected = event["tests"]
        elif event["event"] == "start":
            started[event["test"]] = event["t"]
        elif event["event"] == "report":
            reports.setdefault(event["test"], []).append(event)
        elif event["event"] == "collectError" and event["test"] not in uncollected:
            uncollected.append(event["test"])
    tests = collected or list(started)
    outcomes = {test: outcome(test in started, reports.get(test, [])) for test in tests}
    counts = {field: sum(1 for o in outcomes.values() if o == kind) for kind, field in OUTCOMES.items()}
    seconds = {test: round(sum(r["seconds"] for r in rs), 1) for test, rs in reports.items()}
    slowest = sorted(seconds.items(), key=lambda item: -item[1])[:SLOWEST]
    return {
        "tests": len(tests),
        **counts,
        "failedTests": [test for test, o in outcomes.items() if o in ("failed", "error")],
        "unfinishedTests": [
            f"{test}: started at {started[test]} s" for test, o in outcomes.items() if o == "unfinished"
        ],
        "slowestTests": [f"{test}: {s} s" for test, s in slowest],
        "collectErrors": uncollected,
    }
