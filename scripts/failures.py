"""Where each failed or errored test of a run stopped, in a few lines per test, from the junit
reports scripts/test.sh writes: a CI page shows only a run's last lines, and a test's own
traceback is far above them.

    python scripts/failures.py .test-report.xml .test-report-e2e.xml

Prints, per failure: the test, the phase and message, and the last frames of its traceback
(`path:line: in function`); nothing when every test passed. A report that is missing (a run cut
short before writing it) is named, not an error."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

#: A traceback's location lines in pytest's long format: `tests/x.py:12: in wait` or `x.py:9: Failed`.
LOCATION = re.compile(r"^(\S+\.py):(\d+): (.+)$")
FRAMES = 4


def failures(report: Path) -> Iterator[tuple[str, str, list[str]]]:
    """(test id, message, last frames) for each failed or errored test case in `report`."""
    for case in ET.parse(report).iter("testcase"):
        for outcome in case:
            if outcome.tag not in ("failure", "error"):
                continue
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            message = (outcome.get("message") or "").split("\n", 1)[0][:300]
            frames = [line for line in (outcome.text or "").splitlines() if LOCATION.match(line)]
            yield test, f"{outcome.tag}: {message}", frames[-FRAMES:]


def main(paths: list[str]) -> int:
    for name in paths:
        report = Path(name)
        if not report.exists():
            print(f"(no report at {report}: that run did not finish)")
            continue
        for test, message, frames in failures(report):
            print(test)
            print(f"  {message}")
            for frame in frames:
                print(f"    {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
