"""Refresh tests/durations.json from a run's per-test times: the seconds each test file took,
which the root conftest uses to hand the slowest files to the parallel workers first.

    python scripts/test_durations.py .test-report.xml      # the junit file scripts/test.sh writes

Files the report does not hold keep their old figure; files gone from the tree are dropped."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "durations.json"


def per_file(report: Path) -> Counter[str]:
    """Seconds by test file (setup, call and teardown together) in a junit report."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        if (path := test_file(case.get("classname", ""))) is not None:
            seconds[path] += float(case.get("time") or 0.0)
    return seconds


def test_file(classname: str) -> str | None:
    """The file of a junit classname (`tests.unit.test_x` or `tests.unit.test_x.TestClass`)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    return None


def main(report: str) -> int:
    table: dict[str, float] = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    table.update({path: round(s, 1) for path, s in per_file(Path(report)).items()})
    kept = {path: s for path, s in sorted(table.items()) if (ROOT / path).exists()}
    TABLE.write_text(json.dumps(kept, indent=1) + "\n")
    print(f"{TABLE.relative_to(ROOT)}: {len(kept)} files, {sum(kept.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
