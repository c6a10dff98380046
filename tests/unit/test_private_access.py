"""No module reaches into another's underscore attributes (operator/ and trainer-image/).

A name with a leading underscore is its module's or class's own: another module that reads
it couples itself to an implementation that may change under it without notice (the way a
framework adapter once lived on the trainer Session's private state). This test reads the
source trees and fails on

- `obj._name` where `obj` is not `self`, `cls` or `super()` (a dunder like `__name__` is a
  language protocol, not a private attribute);
- `getattr(obj, "_name")` (and setattr, hasattr, delattr) with a literal private name;
- `from module import _name`.

Library privates with no public equivalent go in ALLOWED, each with the reason; keep it tiny.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
TREES = ("operator", "trainer-image")

#: The expression as written -> why it is allowed (wherever it is written: library names).
ALLOWED: dict[str, str] = {
    "os._exit": (
        "documented public API (exit now, without cleanup or flushing), for a forked child "
        "that must not run its parent's exit handlers; the underscore is historical"
    ),
    "torch._dynamo": (
        "torch._dynamo.config.suppress_errors (mpjob_trainer.speed) is the switch torch.compile's "
        "troubleshooting guide documents for running frames that fail to compile eagerly; "
        "torch.compiler.config has no public equivalent"
    ),
    "torch._functorch": (
        "torch._functorch.config.enable_autograd_cache (mpjob_trainer.speed) is the AOTAutograd "
        "cache's switch; its environment variable is read at import, too late for a running "
        "process, and torch.compiler.config has no public equivalent. torch 2.11's cache ignores "
        "the autocast dtype, so the trainer turns it off there"
    ),
    "hasattr(value, '_fields')": (
        "data.py is_namedtuple: `_fields` is the documented public API of namedtuples (the underscore keeps "
        "field names free), how torch's default_collate itself tells a namedtuple, which takes its fields by position"
    ),
    "AcceleratorState._reset_state": (
        "adapters/accelerated.py: accelerate keeps one AcceleratorState per process, which refuses an "
        "Accelerator of another mixed precision; transformers' own hyperparameter search resets it so "
        "before it rebuilds a Trainer's accelerator, and accelerate has no public equivalent"
    ),
    "trainer._save_checkpoint": (
        "adapters/hf.py: transformers.Trainer has no public method that writes the checkpoint its own "
        "resume_from_checkpoint reads (weights, optimizer, scheduler, scaler, RNG, trainer "
        "state); save_model and save_state write parts of it only"
    ),
    "trainer._maybe_log_save_evaluate": (
        "adapters/hf_tracking.py: transformers.Trainer logs, evaluates (best metric, early stopping) and "
        "saves a step in this method, right after the step's on_step_end, and calls no callback after it; "
        "mpjob's checkpoint of the step must hold that evaluation, and there is no public hook there"
    ),
    "trainer._train_batch_size": (
        "adapters/hf_arguments.py: transformers.Trainer takes its training micro-batch from this attribute at "
        "train(), set once from the arguments in its __init__ (its own auto_find_batch_size sets it so); an "
        "attempt the operator split must train in its smaller micro-batch, and there is no public setter"
    ),
}

ACCESSORS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own(node: ast.expr) -> bool:
    """Is `node` the object or class the code is written in (self, cls, super())?"""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def reaches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, expression) of every reach into another module's private names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and not own(node.value):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS:
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and private(name.value):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if private(alias.name):
                    yield node.lineno, f"from {'.' * node.level}{node.module or ''} import {alias.name}"


def sources() -> list[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py") if ".venv" not in p.parts)


def test_no_module_reaches_into_another_modules_private_names() -> None:
    found, used = [], set()
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        for line, expr in reaches(ast.parse(path.read_text(), filename=rel)):
            if expr in ALLOWED:
                used.add(expr)
            else:
                found.append(f"{rel}:{line}: {expr}")
    assert not found, "reaching into another module's private names (use a public API, or ALLOWED with a reason):\n" + (
        "\n".join(found)
    )
    assert set(ALLOWED) == used, f"ALLOWED entries no longer needed: {sorted(set(ALLOWED) - used)}"


@pytest.mark.parametrize(
    ("code", "hits"),
    [
        ("self._x; cls._y; super()._z(); obj.__class__; obj.__len__()", []),
        ("run._scaler", ["run._scaler"]),
        ("self.run._checkpoints = c", ["self.run._checkpoints"]),
        ("getattr(scaler, '_scale', None); getattr(x, '__doc__')", ["getattr(scaler, '_scale', None)"]),
        (
            "from mpjob_trainer.session.run import _helper\nfrom . import _private",
            [
                "from mpjob_trainer.session.run import _helper",
                "from . import _private",
            ],
        ),
    ],
)
def test_the_check_tells_own_names_from_another_modules(code: str, hits: list[str]) -> None:
    assert [expr for _, expr in reaches(ast.parse(code))] == hits
