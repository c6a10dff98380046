"""A fallback in the running processes (session.inplace): the fp16 overflow that ends an attempt
today instead goes on in bf16 in the same process, from the same checkpoint, and ends where the
restart path ends, bit for bit."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.conftest import run_trainer, spec
from tests.unit.trainer.test_numerics import OVERFLOWING

pytestmark = pytest.mark.unit

JOB = spec(**OVERFLOWING, precision={"mode": "fp16", "fallback": ["bf16", "fp32"]})


def final_state(ckpt: Path) -> dict:
    return torch.load(ckpt / "step-000000050" / "state.pt", weights_only=True)


def digest(ckpt: Path) -> str:
    return hashlib.sha256((ckpt / "step-000000050" / "state.pt").read_bytes()).hexdigest()


def changed_fields(line: dict) -> dict:
    return {k: v for k, v in line.items() if k not in ("event", "time", "rank")}


@pytest.mark.process
def test_an_fp16_overflow_goes_on_in_bf16_in_the_same_process_and_ends_as_a_restart_does(tmp_path: Path) -> None:
    # The restart path: attempt 0 ends NumericFault, attempt 1 starts in bf16 from its checkpoint.
    first = run_trainer(tmp_path / "restart", JOB, "fp16")
    assert first.code == ExitCode.NUMERIC_FAULT, first.stderr
    assert first.report is not None and first.report.last_good_checkpoint is not None
    resumed_from = first.report.last_good_checkpoint
    second = run_trainer(tmp_path / "restart", JOB, "bf16", attempt=1, resume_from=resumed_from.path)
    assert second.code == ExitCode.SUCCESS, second.stderr

    # In place: one process, one start, the change logged as attempt 1.
    inplace = run_trainer(tmp_path / "inplace", JOB, "fp16", in_place_to=["bf16", "fp32"])
    assert inplace.code == ExitCode.SUCCESS, inplace.stderr
    assert len(inplace.of("start")) == 1 and inplace.of("fault") == []
    (changed,) = inplace.of("precisionChanged")
    assert (changed["attempt"], changed["fromPrecision"], changed["toPrecision"]) == (1, "fp16", "bf16")
    assert changed["startStep"] == resumed_from.step and changed["rule"] == first.report.rule
    assert 0 <= changed["recoverySeconds"] < 60
    assert "the precision is at fault" in changed["message"]
    report = inplace.report
    assert report is not None and report.precision == "bf16" and report.start_step == resumed_from.step
    # the report lists the change too: an operator that read none of it still records it
    assert [c.model_dump(by_alias=True) for c in report.precision_changes] == [changed_fields(changed)]

    assert digest(tmp_path / "inplace" / "ckpt") == digest(tmp_path / "restart" / "ckpt")
    ours, theirs = final_state(tmp_path / "inplace" / "ckpt"), final_state(tmp_path / "restart" / "ckpt")
    assert all(torch.equal(ours["model"][k], theirs["model"][k]) for k in theirs["model"])


@pytest.mark.process
def test_with_in_place_off_the_overflow_ends_the_attempt_as_before(tmp_path: Path) -> None:
    off = spec(**OVERFLOWING, precision={"mode": "fp16", "fallback": ["bf16"], "inPlace": False})
    run = run_trainer(tmp_path, off, "fp16", in_place_to=["bf16"])
    assert run.code == ExitCode.NUMERIC_FAULT and run.of("precisionChanged") == [], run.stderr
