"""A re-promotion in place whose target names a split (launch.promoteInPlaceTo microBatch x
gradAccumulation: the full micro-batch a fallback into fp32 split, taken back) hands it to the
loop's registered reshape at the re-promotion's checkpoint, before the next step, and the change
the trainer tells carries it; a loop that registered no reshape ends the attempt Repromote, and
the operator restarts it as before."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch, InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 8, "batchSize": 4, "logEvery": 4},
    precision={"mode": "bf16", "fallback": ["fp32"], "repromoteAfterSteps": 4},
    checkpoint={"everySteps": 4},
)


def fp32_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    """The fp32 attempt in the split 2 x 2, re-promoted in place to bf16 in 4 x 1."""
    fp32 = in_process_launch(tmp_path, monkeypatch, JOB, "fp32")
    promote = InPlaceTarget(precision="bf16", micro_batch=4, grad_accumulation=1)
    return fp32.model_copy(
        update={"repromote_after_steps": 4, "micro_batch": 2, "grad_accumulation": 2, "promote_in_place_to": promote}
    )


def train(launch: AttemptLaunch, *, reshapes: bool, repromotes: bool = False) -> list[tuple]:
    """Train the attempt to its end (`repromotes`: its Repromote exit): what the loop saw, in order
    (each step with the batch size the session's spec says, each reshape)."""
    seen: list[tuple] = []
    ends = pytest.raises(SystemExit) if repromotes else contextlib.nullcontext()
    with ends as ended, mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            seen.append(("step", i, run.spec.training.batch_size, run.precision))
            with run.autocast():
                loss = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)

        def reshape(micro: int, accumulation: int) -> None:
            seen.append(("reshape", micro, accumulation))

        run.register_step(one_step, samples=lambda i: [i], reshape=reshape if reshapes else None)
        for i in range(start, run.total_steps):
            run.run_step(i)
            run.end_step(i + 1, samples=4)
    if repromotes:
        assert ended is not None and ended.value.code == ExitCode.REPROMOTE
    return seen


def test_a_repromotion_naming_a_split_reshapes_the_loop_at_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = fp32_split(tmp_path, monkeypatch)
    seen = train(launch, reshapes=True)
    assert seen == [
        *(("step", i, 2, "fp32") for i in range(4)),
        ("reshape", 4, 1),  # at the checkpoint of step 4, before step 4 (0-based) runs
        *(("step", i, 4, "bf16") for i in range(4, 8)),
    ]
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    (change,) = report.precision_changes
    assert (change.kind, change.step, change.from_precision, change.to_precision) == ("repromote", 4, "fp32", "bf16")
    assert (change.micro_batch, change.grad_accumulation) == (4, 1)


def test_a_loop_that_cannot_reshape_restarts_the_repromotion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = train(fp32_split(tmp_path, monkeypatch), reshapes=False, repromotes=True)
    assert seen == [("step", i, 2, "fp32") for i in range(4)]  # ended at the checkpoint, still in 2 x 2
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    assert report.reason == "Repromote" and report.precision_changes == []


def test_a_repromotion_in_the_same_split_needs_no_reshape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launch = fp32_split(tmp_path, monkeypatch)
    same = launch.model_copy(update={"promote_in_place_to": InPlaceTarget(precision="bf16")})
    seen = train(same, reshapes=False)
    assert seen[3:5] == [("step", 3, 2, "fp32"), ("step", 4, 2, "bf16")]
