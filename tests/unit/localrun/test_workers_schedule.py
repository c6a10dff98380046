"""`mpjob run --workers-available`'s schedule: the workers that fit as the job moves on, its
clock the furthest step reached, so steps trained again after a resume keep today's capacity."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from mpjob.localrun.cli import run_command
from mpjob.localrun.elastic import BadSchedule, CapacityWatch, WorkersSchedule
from mpjob.planning.elastic import Verdict
from mpjob.planning.planner import BatchShape, StartAttempt
from mpjob_contract import events
from mpjob_contract.api import AttemptStatus, MixedPrecisionJob, MixedPrecisionJobStatus
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit

JOB = tiny_job("fixed")


def test_the_workers_that_fit_follow_the_furthest_step_reached() -> None:
    schedule = WorkersSchedule.parse("3,20:2,35:3")
    assert [schedule.available(step) for step in (0, 19, 20, 21)] == [3, 3, 2, 2]
    # Resumed from the step-10 checkpoint after the loss at step 20: steps 11-19 come later in
    # time, when only 2 fit (a schedule read by the step alone grew the job back there).
    assert [schedule.available(step) for step in (11, 19, 34)] == [2, 2, 2]
    assert schedule.available(35) == 3 and schedule.available(23) == 3


@pytest.mark.parametrize("text", ["x", "3,20", "3,20:2,20:3", "3,30:2,20:3", "3,20:0"])
def test_a_schedule_that_cannot_be_read_is_refused(text: str) -> None:
    with pytest.raises(BadSchedule):
        WorkersSchedule.parse(text)


def test_a_schedule_for_a_job_without_elastic_is_refused_naming_the_flag_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    assert run_command([str(job), "--workers-available", "2", "--out", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().out
    assert said == "error: --workers-available needs spec.elastic: without it every attempt has `workers` pods\n"
    assert not (tmp_path / "out").exists()


def test_a_count_no_size_of_the_job_can_run_at_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3 workers of 1 sample (3 a step): 2 workers cannot keep the global batch and minWorkers is
    2, so a cluster of 2 would leave the job waiting; a local run cannot wait, and training on
    with 3 processes would not be what the schedule says."""
    spec = {**JOB["spec"], "workers": 3, "training": {"steps": 2, "batchSize": 1}, "elastic": {"minWorkers": 2}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**JOB, "spec": spec}))
    assert run_command([str(job), "--workers-available", "3,10:2", "--out", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().out
    assert said == (
        "error: --workers-available 2 worker(s) from step 10: no size from elastic.minWorkers=2 up keeps"
        " the global batch of 3 samples: a local run has no cluster to wait for\n"
    )
    assert not (tmp_path / "out").exists()


class Signalled:
    """The attempt's processes as the watch drives them: the signals sent, the workers killed."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.killed = 0

    def signal(self, sig: int) -> None:
        self.signals.append(sig)

    def kill_last(self, count: int) -> None:
        self.killed += count


def step(n: int) -> events.TrainerEvent:
    return events.Step.model_validate({"step": n})


def checkpoint(n: int) -> events.TrainerEvent:
    ckpt = {"step": n, "path": f"/ckpt/step-{n}", "sha256": "ab", "seconds": 0.1, "bytes": 1, "async": False}
    return events.Checkpoint.model_validate(ckpt)


def watch(
    schedule: str, attempts: list[AttemptStatus] | None = None, status: MixedPrecisionJobStatus | None = None
) -> tuple[CapacityWatch, Signalled]:
    spec = {**JOB["spec"], "workers": 2, "training": {"steps": 40, "batchSize": 3}, "elastic": {"minWorkers": 1}}
    job = MixedPrecisionJob.model_validate({**JOB, "spec": spec})
    start = StartAttempt(1, "fp16", None, 0, micro_batch=3, grad_accumulation=2, workers=1)
    workers = Signalled()
    status = status or MixedPrecisionJobStatus(attempts=attempts or [])
    capacity = CapacityWatch(job.spec, WorkersSchedule.parse(schedule), start, workers, status)  # type: ignore[arg-type]
    return capacity, workers


def test_a_growth_is_called_off_when_the_room_goes_before_the_next_checkpoint() -> None:
    # 2 fit at step 14, only 1 again from 16: the checkpoint at 20 must not stop the attempt to grow.
    capacity, workers = watch("1,14:2,16:1")
    for event in (step(13), step(14), step(15), step(16), step(17), checkpoint(20), step(21)):
        capacity.seen(event)
    assert capacity.resize is None and workers.signals == []


def test_a_growth_stops_the_attempt_at_its_next_checkpoint_while_the_room_lasts() -> None:
    capacity, workers = watch("1,14:2")
    for event in (step(13), step(14), step(15)):
        capacity.seen(event)
    assert capacity.resize is None and workers.signals == []
    capacity.seen(checkpoint(20))
    assert capacity.resize is not None and capacity.resize.verdict is Verdict.GROW
    assert (capacity.resize.workers, capacity.resize.shape) == (2, BatchShape(3, 1))
    assert workers.signals == [signal.SIGTERM] and workers.killed == 0


def test_a_growth_keeps_below_a_micro_batch_the_job_ran_out_of_memory_in() -> None:
    ran_out = AttemptStatus(index=0, precision="fp16", start_step=0, micro_batch=3, reason="OutOfDeviceMemory")
    capacity, _ = watch("1,14:2", [ran_out])
    for event in (step(14), checkpoint(20)):
        capacity.seen(event)
    assert capacity.resize is not None and (capacity.resize.workers, capacity.resize.shape) == (2, BatchShape(1, 3))


def test_a_growth_does_not_stop_the_attempt_at_the_jobs_last_checkpoint() -> None:
    # Room from step 35; the next checkpoint is step 40, the job's last: the attempt ends Succeeded
    # there (a SIGTERM made it end Preempted, and a bigger attempt started with no step to train).
    capacity, workers = watch("1,35:2")
    for event in (step(35), step(36), checkpoint(40)):
        capacity.seen(event)
    assert capacity.resize is None and workers.signals == []


def test_a_growth_after_a_micro_batch_split_in_place_keeps_the_split() -> None:
    # Attempt 1 (fp16, 1 worker, 3 x 2) ran out of memory at micro-batch 3 and split to 1 x 6 in
    # its processes (attempt 2, same workers): growing at the checkpoint after must keep below 3,
    # as the operator's `grows` does from the job's newest attempt.
    running = AttemptStatus(index=1, precision="fp16", start_step=0, micro_batch=3, grad_accumulation=2, workers=1)
    status = MixedPrecisionJobStatus(attempts=[running])
    capacity, _ = watch("1,14:2", status=status)
    capacity.seen(step(5))
    ran_out = running.model_copy(update={"end_step": 6, "reason": "OutOfDeviceMemory"})
    split = AttemptStatus(index=2, precision="fp16", start_step=6, micro_batch=1, grad_accumulation=6, workers=1)
    status.attempts = [ran_out, split]  # what RunRecord.change_in_place records
    for event in (step(14), checkpoint(20)):
        capacity.seen(event)
    assert capacity.resize is not None and (capacity.resize.workers, capacity.resize.shape) == (2, BatchShape(1, 3))
