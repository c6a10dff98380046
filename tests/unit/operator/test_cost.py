"""The cost arithmetic (planning.cost): GPU-seconds seen, steps trained twice, sums and money."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from mpjob.planning import cost
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.accounting import JobCost
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def stamp(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_spec(**over: Any) -> MixedPrecisionJobSpec:
    base = {
        "task": {"builtin": "gpt"},
        "training": {"batchSize": 4},
        "resources": {"gpusPerWorker": 2},
        "checkpoint": CLAIM,
    }
    return MixedPrecisionJobSpec.model_validate({**base, **over})


def ended(index: int, start: int, end: int, *, reason: str = "NumericFault") -> AttemptStatus:
    """An ended attempt with no GPU-seconds yet (settle gives it those it is handed)."""
    return AttemptStatus(
        index=index,
        precision="fp16",
        start_step=start,
        end_step=end,
        world_size=1,
        reason=reason,
        finish_time=stamp(0),
    )


def ran(index: int, start: str | None, finish: str | None, *, alive: bool = False) -> PodView:
    return PodView(f"p{index}", index, "Running" if alive else "Failed", alive, started_at=start, finished_at=finish)


# ---------------------------------------------------------------- GPU-seconds seen


def test_gpu_seconds_are_pods_times_gpus_times_the_seconds_each_ran() -> None:
    pods = [ran(0, stamp(0), stamp(30)), ran(1, stamp(5), stamp(30))]
    assert cost.gpu_seconds(pods, gpus_per_worker=2, now=T0 + timedelta(seconds=99)) == 2 * (30 + 25)


def test_time_not_seen_is_not_counted() -> None:
    now = T0 + timedelta(seconds=50)
    assert cost.pod_seconds(ran(0, None, None), now) == 0  # never seen starting
    assert cost.pod_seconds(ran(0, stamp(0), None), now) == 0  # ended, finish not seen
    assert cost.pod_seconds(ran(0, "not a time", stamp(9)), now) == 0
    assert cost.pod_seconds(ran(0, stamp(10), None, alive=True), now) == 40  # running: seen up to now


def test_an_ended_attempt_is_charged_once_from_its_job_and_never_again() -> None:
    spec = job_spec()
    status = MixedPrecisionJobStatus(attempts=[ended(0, 0, 30)])
    jobs = {0: JobView(0, "Failed", pods=(ran(0, stamp(0), stamp(45)),))}
    usage = cost.seen_usage(status, jobs, spec, T0)
    assert usage == {0: 90.0}
    cost.settle(status, spec, usage)
    assert status.attempts[0].gpu_seconds == 90.0
    assert cost.seen_usage(status, jobs, spec, T0) == {}  # it has its figure now
    cost.settle(status, spec, {0: 50.0})  # never fewer
    assert status.attempts[0].gpu_seconds == 90.0 and status.cost is not None and status.cost.gpu_seconds == 90.0


def test_a_pod_is_charged_the_gpus_it_asked_not_a_count_edited_since() -> None:
    """resources.gpusPerWorker edited while the attempt's pods ran (as PodsScheduled asks, its Job
    not made again once a trainer started): each pod held what its Job asked. Before, the ended
    attempt was charged the edited count (2 GPUs here, a quarter of what its pods held)."""
    status = MixedPrecisionJobStatus(attempts=[ended(0, 0, 30)])
    held = PodView("p0", 0, "Failed", False, started_at=stamp(0), finished_at=stamp(45), gpus=8)
    assert cost.seen_usage(status, {0: JobView(0, "Failed", pods=(held,))}, job_spec(), T0) == {0: 8 * 45}


# ---------------------------------------------------------------- waste


def test_a_fallback_wastes_the_steps_between_the_last_good_checkpoint_and_the_fault() -> None:
    status = MixedPrecisionJobStatus(
        attempts=[ended(0, 0, 30), AttemptStatus(index=1, precision="bf16", start_step=20)]
    )
    cost.settle(status, job_spec(), {0: 60.0})
    first = status.attempts[0]
    assert first.wasted_steps == 10 and first.wasted_gpu_seconds == 20.0  # 60 s x 10 / 30 steps
    assert first.samples == 30 * 4
    assert status.cost is not None
    assert (status.cost.gpu_seconds, status.cost.wasted_gpu_seconds, status.cost.wasted_steps) == (60.0, 20.0, 10)


def test_settling_twice_changes_nothing_and_a_corrected_start_moves_the_sums() -> None:
    spec = job_spec()
    status = MixedPrecisionJobStatus(
        attempts=[ended(0, 0, 30), AttemptStatus(index=1, precision="bf16", start_step=20)]
    )
    cost.settle(status, spec, {0: 60.0})
    before = status.model_copy(deep=True)
    cost.settle(status, spec, {})
    assert status == before
    status.attempts[1].start_step = 25  # the trainer found a newer checkpoint of its own
    cost.settle(status, spec, {})
    assert status.attempts[0].wasted_steps == 5
    assert status.cost is not None and (status.cost.wasted_steps, status.cost.wasted_gpu_seconds) == (5, 10.0)


def test_an_attempt_that_trained_nothing_wastes_its_set_up() -> None:
    status = MixedPrecisionJobStatus(attempts=[ended(0, 0, 0, reason="ConfigError")])
    cost.settle(status, job_spec(), {0: 12.0})
    assert status.attempts[0].wasted_gpu_seconds == 12.0 and status.attempts[0].wasted_steps is None
    assert cost.waste_of(status.attempts[0], None).reason == "setup"


def test_a_success_and_a_preemption_resumed_where_it_stopped_waste_nothing() -> None:
    status = MixedPrecisionJobStatus(
        attempts=[
            ended(0, 0, 40, reason="Preempted"),
            ended(1, 40, 60, reason="Succeeded"),
        ]
    )
    cost.settle(status, job_spec(), {0: 80.0, 1: 40.0})
    assert [a.wasted_steps for a in status.attempts] == [0, None]
    assert status.cost is not None and status.cost.wasted_gpu_seconds == 0 and status.cost.gpu_seconds == 120


def test_the_sums_keep_what_dropped_entries_added() -> None:
    spec = job_spec()
    status = MixedPrecisionJobStatus(
        attempts=[
            ended(0, 0, 30),
            ended(1, 20, 50),
            AttemptStatus(index=2, precision="fp32", start_step=40),
        ]
    )
    cost.settle(status, spec, {0: 60.0, 1: 60.0})
    assert status.cost is not None and (status.cost.wasted_steps, status.cost.gpu_seconds) == (20, 120.0)
    status.attempts = [status.attempts[0], status.attempts[2]]  # attempts[] keeps the first and the newest
    cost.settle(status, spec, {})
    assert status.attempts[0].wasted_steps == 10  # attempt 2 is not its next: left as it was
    assert (status.cost.wasted_steps, status.cost.gpu_seconds) == (20, 120.0)


def test_money_at_the_price_of_a_gpu_hour() -> None:
    spec = job_spec(costPerGpuHour={"amount": 2.5, "currency": "EUR"})
    status = MixedPrecisionJobStatus(
        attempts=[ended(0, 0, 30), AttemptStatus(index=1, precision="bf16", start_step=15)]
    )
    cost.settle(status, spec, {0: 7200.0})
    assert status.cost is not None
    assert (status.cost.currency, status.cost.amount, status.cost.wasted_amount) == ("EUR", 5.0, 2.5)


@pytest.mark.parametrize(
    ("price", "field"),
    [({"amount": -1, "currency": "EUR"}, "amount"), ({"amount": 1, "currency": "euro"}, "currency")],
)
def test_a_bad_price_is_refused_naming_the_field(price: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        job_spec(costPerGpuHour=price)
    assert f"costPerGpuHour.{field}" in str(caught.value)


# ---------------------------------------------------------------- counters


def test_the_counters_get_each_change_once_by_ending_and_why() -> None:
    before = MixedPrecisionJobStatus(attempts=[ended(0, 0, 30)])
    after = before.model_copy(deep=True)
    after.attempts.append(AttemptStatus(index=1, precision="bf16", start_step=20))
    cost.settle(after, job_spec(), {0: 60.0})
    change = cost.changes(before, after)
    assert change.gpu_seconds == {"NumericFault": 60.0} and change.wasted_gpu_seconds == {"rollback": 20.0}
    assert cost.changes(after, after) == cost.Change({}, {})  # read back after a restart: nothing new
    corrected = after.model_copy(deep=True)
    corrected.attempts[1].start_step = 25
    cost.settle(corrected, job_spec(), {})
    assert cost.changes(after, corrected).wasted_gpu_seconds == {}  # a counter never goes down


# ---------------------------------------------------------------- through the reconcile


def fault_report() -> str:
    ref = CheckpointRef(step=20, path="/c/step-20", sha256="ab", precision="fp16")
    report = TerminationReport(
        reason=Reason.NUMERIC_FAULT,
        step=27,
        precision="fp16",
        last_good_checkpoint=ref,
        loss_scales=[(20, 65536.0), (27, 512.0)],
    )
    return report.to_message()


def test_a_fallback_through_the_reconcile_charges_its_pods_and_its_rollback() -> None:
    spec = job_spec(workers=2, precision={"mode": "fp16", "fallback": ["bf16"]})
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    pods = tuple(
        PodView(f"p{i}", i, "Failed", False, 42, fault_report(), started_at=stamp(2), finished_at=stamp(32))
        for i in range(2)
    )
    status = reconcile(spec, status, 1, {0: JobView(0, "Failed", pods=pods)}, T0 + timedelta(seconds=40)).status
    first, second = status.attempts
    assert first.gpu_seconds == 2 * 2 * 30 and second.start_step == 20
    assert first.wasted_steps == 7 and first.wasted_gpu_seconds == pytest.approx(120 * 7 / 27, abs=1e-3)
    assert status.cost is not None and status.cost.gpu_seconds == 120
    assert status.timeline is not None
    assert [(p.step, p.scale, p.attempt) for p in status.timeline.loss_scale] == [(20, 65536, 0), (27, 512, 0)]
    spans = [(s.attempt, s.precision, s.from_step, s.to_step) for s in status.timeline.precision]
    assert spans == [(0, "fp16", 0, 27), (1, "bf16", 20, None)]


def test_a_job_deleted_by_hand_and_created_again_adds_its_pods_seconds_to_the_attempt_s() -> None:
    spec = job_spec()
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    first = (PodView("p0", 0, "Running", True, started_at=stamp(2)),)
    status = reconcile(spec, status, 1, {0: JobView(0, pods=first)}, T0 + timedelta(seconds=5)).status
    assert status.phase == "Running"
    stopped = {0: JobView(0, pods=(ran(0, stamp(2), stamp(12)),))}  # its Job deleted, its pod stopped
    again = reconcile(spec, status, 1, {}, T0 + timedelta(seconds=15), stopped=stopped)
    assert [a.index for a in again.create] == [0] and again.status.attempts[0].deleted_jobs_gpu_seconds == 2 * 10
    status = reconcile(spec, again.status, 1, {}, T0 + timedelta(seconds=16), stopped=stopped).status
    assert status.attempts[0].deleted_jobs_gpu_seconds == 2 * 10  # seen once, not at each reconcile
    done = PodView("p0", 0, "Succeeded", False, 0, started_at=stamp(20), finished_at=stamp(50))
    status = reconcile(spec, status, 1, {0: JobView(0, "Complete", pods=(done,))}, T0 + timedelta(seconds=55)).status
    (attempt,) = status.attempts
    assert attempt.gpu_seconds == 2 * (10 + 30) and status.cost is not None and status.cost.gpu_seconds == 80


def test_an_attempt_ended_while_its_pods_ran_is_charged_their_whole_time_once_they_have_stopped() -> None:
    """Suspended: charged what was seen at once (its pod running), then, once its Job is gone and
    its pod has stopped after checkpointing on SIGTERM, the whole time it ran: once."""
    spec = job_spec()
    suspended = job_spec(runPolicy={"suspend": True})
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    running = (PodView("p0", 0, "Running", True, started_at=stamp(2)),)
    status = reconcile(spec, status, 1, {0: JobView(0, pods=running)}, T0 + timedelta(seconds=5)).status
    status = reconcile(suspended, status, 2, {0: JobView(0, pods=running)}, T0 + timedelta(seconds=12)).status
    assert status.attempts[0].gpu_seconds == 2 * 10 and status.cost is not None and status.cost.gpu_seconds == 20
    stopped = {0: JobView(0, pods=(ran(0, stamp(2), stamp(42)),))}
    for seconds in (45, 46):  # each reconcile while it is kept
        status = reconcile(suspended, status, 2, {}, T0 + timedelta(seconds=seconds), stopped=stopped).status
        assert status.attempts[0].gpu_seconds == 2 * 40 and status.cost is not None and status.cost.gpu_seconds == 80


def stray_case(
    seconds: float | None, recorded: str | None = "u0"
) -> tuple[MixedPrecisionJobSpec, MixedPrecisionJobStatus, dict[int, JobView]]:
    """Attempt 0 ended (its Job `recorded`, charged `seconds`), attempt 1 running in its Job u1."""
    first = ended(0, 0, 30).model_copy(update={"job_uid": recorded, "gpu_seconds": seconds})
    running = AttemptStatus(index=1, precision="bf16", start_step=20, world_size=1, job_uid="u1", start_time=stamp(50))
    status = MixedPrecisionJobStatus(phase="Running", attempts=[first, running], cost=JobCost(gpu_seconds=seconds or 0))
    alive = (PodView("p1", 0, "Running", True, started_at=stamp(55)),)
    return job_spec(), status, {1: JobView(1, pods=alive, uid="u1")}


@pytest.mark.parametrize("recorded", ["u0", None], ids=["another-job-recorded", "none-recorded"])
@pytest.mark.parametrize("seconds", [20.0, None], ids=["charged", "not-charged-yet"])
def test_a_stray_job_of_an_ended_attempt_is_not_charged_to_it(seconds: float | None, recorded: str | None) -> None:
    """A Job made for attempt 0 after the status had ended it, by an operator acting on an older
    status (controller/strays.py deletes it): its pods, running or stopped once it is deleted,
    are not attempt 0's, whose cost stays what it was when it ended; its own Job's stay charged.
    Where the entry records no Job, the stray's creationTimestamp, after the entry's finishTime, tells."""
    spec, status, jobs = stray_case(seconds, recorded)
    stray = JobView(0, pods=(ran(0, stamp(60), None, alive=True),), uid="stray", created=stamp(55))
    gone = JobView(0, pods=(ran(0, stamp(60), stamp(260)),), uid="stray", created=stamp(55))
    for now, held, stopped in (
        (100, {**jobs, 0: stray}, {}),  # running beside attempt 1
        (300, jobs, {0: gone}),  # deleted, stopped
    ):
        after = reconcile(spec, status, 1, held, T0 + timedelta(seconds=now), stopped=stopped).status
        assert after.attempts[0].gpu_seconds == seconds, now
        assert after.cost is not None and after.cost.gpu_seconds == (seconds or 0.0), now
    own = {0: JobView(0, "Failed", pods=(ran(0, stamp(0), stamp(45)),), uid="u0")}
    after = reconcile(spec, status, 1, jobs, T0 + timedelta(seconds=300), stopped=own).status
    assert after.attempts[0].gpu_seconds == 2 * 45  # its own Job's pods, as last seen once they stopped
