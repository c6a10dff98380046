"""The code's shape, as docs/architecture.md states it: small files and functions, and each
part importing only the parts below it (a module never imports one above it)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PARTS = ("operator", "trainer-image", "contract")
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60
#: Trainer modules that sit above the session (they run on it); everything else is below it.
ABOVE_SESSION = ("mpjob_trainer/loop.py", "mpjob_trainer/__main__.py", "mpjob_trainer/adapters/")
#: package prefix -> the packages it must never import.
NEVER: dict[str, tuple[str, ...]] = {
    "mpjob_contract": ("mpjob", "mpjob_trainer", "torch", "kopf", "kubernetes"),
    "mpjob/planning": ("mpjob.controller", "mpjob.localrun", "kopf", "kubernetes", "torch"),
    "mpjob/builders": ("mpjob.controller", "mpjob.localrun", "kopf", "kubernetes", "torch"),
    "mpjob_trainer": ("mpjob", "kopf", "kubernetes"),
}


def sources() -> Iterator[tuple[str, ast.Module, int]]:
    for part in PARTS:
        for path in sorted((REPO / part).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            text = path.read_text()
            yield str(path.relative_to(REPO / part)), ast.parse(text), text.count("\n")


def imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_file_over_300_lines_and_no_function_over_60() -> None:
    long_files = [(name, lines) for name, _, lines in sources() if lines > MAX_FILE_LINES]
    long_functions = [
        (name, node.name, node.end_lineno - node.lineno + 1)
        for name, tree, _ in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long_files == [] and long_functions == []


def test_no_module_imports_a_part_above_it() -> None:
    wrong = []
    for name, tree, _ in sources():
        for prefix, banned in NEVER.items():
            if name.startswith(prefix):
                wrong += [(name, m) for m in imported(tree) if any(m == b or m.startswith(b + ".") for b in banned)]
        below_session = name.startswith("mpjob_trainer/") and not name.startswith(
            ("mpjob_trainer/session/", *ABOVE_SESSION)
        )
        if below_session:
            wrong += [(name, m) for m in imported(tree) if m.startswith("mpjob_trainer.session")]
    assert wrong == []
