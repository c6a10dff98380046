"""The suite's own scheduling: parallel workers get the slowest test files first."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tests.conftest as root

pytestmark = pytest.mark.unit


def items(*nodeids: str) -> list[Any]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_slow_files_go_first_and_each_file_keeps_its_tests_together_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"tests/b.py": 300.0, "tests/c.py": 20.0}))
    monkeypatch.setattr(root, "DURATIONS", table)
    given = items("tests/a.py::one", "tests/b.py::one", "tests/a.py::two", "tests/c.py::one", "tests/b.py::two")
    ordered = [i.nodeid for i in root.slowest_files_first(given)]
    assert ordered == ["tests/b.py::one", "tests/b.py::two", "tests/c.py::one", "tests/a.py::one", "tests/a.py::two"]


def test_the_table_names_files_that_exist() -> None:
    table: dict[str, float] = json.loads(root.DURATIONS.read_text())
    assert table and all((root.REPO / path).is_file() for path in table)
    assert all(seconds >= 0 for seconds in table.values())
