"""The quick tier's guard (conftest.starts_trainer): which commands start a trainer process, so a
test that runs one must be marked `process`, and which start only a launcher or stand-ins."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.unit.trainer.conftest import starts_trainer
from tests.unit.trainer.launcher_pods import LAUNCHER, stand_ins

pytestmark = pytest.mark.unit

HERE = Path(__file__).parent


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-m", "mpjob_trainer"],
        [sys.executable, str(HERE / "shutdown_script.py"), "0", "1234", "meet"],  # gloo ranks on torch
        [str(LAUNCHER), "--nproc-per-worker", "2", "--", sys.executable, "-m", "mpjob_trainer"],
    ],
)
def test_a_trainer_or_a_script_of_torch_ranks_is_a_trainer_process(argv: list[str]) -> None:
    assert starts_trainer(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [str(LAUNCHER), "--", *stand_ins(HERE, "env", "env")],  # standard library only: milliseconds
        [sys.executable, "-c", "import mpjob_trainer.__main__"],  # an import probe
        [sys.executable, "-m", "no_such_module"],
        ["git", "status"],
    ],
)
def test_a_launcher_over_stand_ins_or_a_probe_is_not(argv: list[str]) -> None:
    assert not starts_trainer(argv)
