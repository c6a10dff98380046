"""The last good checkpoint an attempt's ending names is the newest any of its pods reported: rank
0 writes a DDP job's checkpoints, and another worker's report names the one it resumed from. A
re-promotion under `mpjob run` with two workers, its worker 1 ending first and worker 0 stopped by
the peer watch, took worker 1's report, and the next attempt resumed ten steps back."""

from __future__ import annotations

import pytest

from mpjob.planning.endings import JobView, PodView, outcome_of
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, TerminationReport

pytestmark = pytest.mark.unit


def pod(index: int, code: int, checkpoint: int | None, reason: Reason = Reason.REPROMOTE) -> PodView:
    ref = None
    if checkpoint is not None:
        ref = CheckpointRef(step=checkpoint, path=f"/ckpt/step-{checkpoint:09d}", sha256="ab", precision="fp32")
    said = TerminationReport(reason=reason, step=25, precision="fp32", last_good_checkpoint=ref)
    return PodView(f"worker{index}", index, "Failed", False, code, said.to_message())


def test_the_pod_that_explains_the_ending_takes_the_newest_checkpoint_its_peers_reported() -> None:
    stopped, first = pod(0, 128 + 15, 25), pod(1, 47, 15)  # worker 0 wrote step 25, then was stopped
    outcome = outcome_of(JobView(index=1, pods=(stopped, first)))
    assert outcome.report is not None and outcome.report.reason == "Repromote"
    assert outcome.report.last_good_checkpoint is not None
    assert outcome.report.last_good_checkpoint.step == 25


@pytest.mark.parametrize("others", [(15,), (None,), ()], ids=["older", "none", "alone"])
def test_a_newer_or_only_checkpoint_of_the_explaining_pod_stands(others: tuple[int | None, ...]) -> None:
    pods = (pod(0, 47, 25), *(pod(1 + i, 128 + 15, c) for i, c in enumerate(others)))
    outcome = outcome_of(JobView(index=1, pods=pods))
    assert outcome.report is not None and outcome.report.last_good_checkpoint is not None
    assert outcome.report.last_good_checkpoint.step == 25
