"""A fallback in place whose target names a split (launch.inPlaceTo microBatch x gradAccumulation:
a fallback into fp32 that splits the micro-batch, precision.fallbackKeepsBatch) rewinds to the
last good checkpoint, hands the split to the loop's registered reshape before the steps since run
again, and the change the trainer tells carries it; a loop that registered no reshape ends the
attempt NumericFault, saying why, and the operator restarts it as before."""

from __future__ import annotations

import contextlib
import math
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

#: Steps 5..7 overflow in fp16; three non-finite losses end fp16 at the read of step 8, while the
#: last good checkpoint is step 4's.
JOB = spec(
    training={"steps": 12, "batchSize": 4, "logEvery": 2},
    precision={"mode": "fp16", "fallback": ["fp32"], "guard": {"onBadData": "fail"}},
    checkpoint={"everySteps": 4},
)


def fp16_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    """The fp16 attempt in 4 x 1, falling back in place to fp32 in 2 x 2."""
    fp16 = in_process_launch(tmp_path, monkeypatch, JOB, "fp16")
    split = InPlaceTarget(precision="fp32", micro_batch=2, grad_accumulation=2)
    return fp16.model_copy(update={"in_place_to": [split]})


def train(launch: AttemptLaunch, *, reshapes: bool, faults: bool = False) -> list[tuple]:
    """Train the attempt to its end (`faults`: its NumericFault exit): what the loop saw, in order
    (each step with the batch size the session's spec says and the precision, each reshape)."""
    seen: list[tuple] = []
    ends = pytest.raises(SystemExit) if faults else contextlib.nullcontext()
    with ends as ended, mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            seen.append(("step", i, run.spec.training.batch_size, run.precision))
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
            if run.precision == "fp16" and i in (4, 5, 6):
                x[0, 0] = math.inf
            with run.autocast():
                loss = model(x).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)

        def reshape(micro: int, accumulation: int) -> None:
            seen.append(("reshape", micro, accumulation, run.precision))

        run.register_step(one_step, samples=lambda i: [i], reshape=reshape if reshapes else None)
        for i in range(start, run.total_steps):
            run.run_step(i)
            run.end_step(i + 1, samples=4)
    if faults:
        assert ended is not None and ended.value.code == ExitCode.NUMERIC_FAULT
    return seen


def test_a_fallback_naming_a_split_reshapes_the_loop_before_the_steps_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = train(fp16_split(tmp_path, monkeypatch), reshapes=True)
    at = seen.index(("reshape", 2, 2, "fp32"))
    before, after = seen[:at], seen[at + 1 :]
    # fp16 ran its overflowing steps, then the replay ran step 5 in fp32 in the attempt's split
    assert [s for s in before if s[3] == "fp16"] == [("step", i, 4, "fp16") for i in range(8)]
    assert [s for s in before if s[3] != "fp16"] == [("step", 4, 4, "fp32")]
    # rewound to step 4's checkpoint: steps 4.. run again, all in fp32 and the split, to the end
    assert after == [("step", i, 2, "fp32") for i in range(4, 12)]
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    assert report.reason == "Succeeded" and report.precision == "fp32", report.message
    (change,) = report.precision_changes
    assert (change.kind, change.start_step, change.to_precision) == ("fallback", 4, "fp32")
    assert (change.micro_batch, change.grad_accumulation) == (2, 2)


def test_a_loop_that_cannot_reshape_restarts_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = train(fp16_split(tmp_path, monkeypatch), reshapes=False, faults=True)
    assert {size for _, _, size, _ in seen} == {4} and "reshape" not in {s[0] for s in seen}  # never split
    assert [s for s in seen if s[3] == "fp16"] == [("step", i, 4, "fp16") for i in range(8)]
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    assert report.reason == "NumericFault" and report.precision_changes == []
    assert "not in place (the loop registered no reshape for its micro-batch)" in report.message, report.message


def test_a_fallback_in_the_same_split_needs_no_reshape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    same = fp16_split(tmp_path, monkeypatch).model_copy(update={"in_place_to": [InPlaceTarget(precision="fp32")]})
    seen = train(same, reshapes=False)
    assert seen[-1] == ("step", 11, 4, "fp32")
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    (change,) = report.precision_changes
    assert change.micro_batch is None and change.grad_accumulation is None
