"""launch.script: which commands are python running a script that is not there (the launcher
ends them as a configuration error before any rank starts), and which it leaves alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mpjob_trainer.launch.script import missing_script

pytestmark = pytest.mark.unit

MISSING = {
    "python": ["python", "train.py", "--lr", "0.1"],
    "python3 with flags": ["python3", "-u", "-OO", "train.py"],
    "a versioned python by its path": ["/usr/bin/python3.11", "-W", "ignore", "-Xdev", "train.py"],
    "this interpreter, after --": [sys.executable, "--", "train.py"],
    "a path in a folder": ["python", "src/train.py"],
}

NOT_JUDGED = {
    "a module": ["python", "-m", "train"],
    "code": ["python", "-c", "import train"],
    "code after joined flags": ["python", "-uc", "import train"],
    "stdin": ["python", "-", "train.py"],
    "the version": ["python", "-V", "train.py"],
    "an option not known here": ["python", "--check-hash-based-pycs", "always", "train.py"],
    "no script": ["python", "-u"],
    "not python": ["torchrun", "train.py"],
    "a name that only starts with python": ["python3.x", "train.py"],
    "a script that is there": ["python", "here.py"],
    "a folder python runs": ["python", "app"],
}


@pytest.mark.parametrize("command", MISSING.values(), ids=MISSING.keys())
def test_python_with_a_script_that_is_not_there_is_named_with_its_command(tmp_path: Path, command: list[str]) -> None:
    said = missing_script(command, str(tmp_path))
    script = next(arg for arg in command if arg.endswith("train.py"))
    assert said == f"task.command {command!r}: its script {script!r} does not exist (working directory: {tmp_path})"


@pytest.mark.parametrize("command", NOT_JUDGED.values(), ids=NOT_JUDGED.keys())
def test_anything_else_is_left_to_start(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "here.py").write_text("pass\n")
    (tmp_path / "app").mkdir()
    assert missing_script(command, str(tmp_path)) is None


def test_a_relative_script_is_looked_for_in_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("pass\n")
    assert missing_script(["python", "src/train.py"], str(tmp_path)) is None
    assert missing_script(["python", "src/train.py"], str(tmp_path / "src")) is not None
