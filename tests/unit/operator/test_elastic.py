"""spec.elastic: the keep/shrink/grow decision as a table, and the lifecycle it drives (the
attempts' reasons, sizes and batch shapes, charging, the ladder after a size change)."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.builders.attempt import attempt_job
from mpjob.planning import lifecycle as lc
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.elastic import (
    Capacity,
    Resize,
    Verdict,
    decide,
    global_batch,
    grows,
    shape_for,
    workers_of,
)
from mpjob.planning.endings import PodView
from mpjob.planning.inplace import InPlacePlan
from mpjob.planning.launch import attempt_launch
from mpjob.planning.lifecycle import Plan, When
from mpjob.planning.planner import BatchShape, StartAttempt, first_attempt
from mpjob.planning.shortage import node_lost
from mpjob.summary import summary_lines
from mpjob_contract.api import MAX_ATTEMPT_ENTRIES, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT, AttemptLaunch
from tests.unit.operator import carried_out

pytestmark = pytest.mark.unit


def spec(**over: Any) -> MixedPrecisionJobSpec:
    doc: dict[str, Any] = {
        "workers": 3,
        "task": {"builtin": "mlp"},
        "training": {"batchSize": 4, "gradAccumulation": 1},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "elastic": {"minWorkers": 2, "waitSeconds": 60},
        "resources": {"gpusPerWorker": 0},
    }
    doc.update(over)
    return MixedPrecisionJobSpec.model_validate({k: v for k, v in doc.items() if v is not None})


FULL = BatchShape(4, 1)
# (id, spec overrides, running workers, its shape, capacity, verdict, workers after, shape after)
TABLE: list[tuple[str, dict[str, Any], int, BatchShape, Capacity, Verdict, int, BatchShape]] = [
    ("not-elastic", {"elastic": None}, 3, FULL, Capacity(1, node_lost=True), Verdict.KEEP, 3, FULL),
    ("all-there", {}, 3, FULL, Capacity(3), Verdict.KEEP, 3, FULL),
    ("unschedulable-within-wait", {}, 3, FULL, Capacity(2, unschedulable_seconds=30), Verdict.KEEP, 3, FULL),
    # 12 samples a step: 6 per process on 2, micro-batches of at most 4 -> 3 x 2.
    (
        "unschedulable-past-wait",
        {},
        3,
        FULL,
        Capacity(2, unschedulable_seconds=61),
        Verdict.SHRINK,
        2,
        BatchShape(3, 2),
    ),
    ("node-lost-shrinks-at-once", {}, 3, FULL, Capacity(2, node_lost=True), Verdict.SHRINK, 2, BatchShape(3, 2)),
    ("node-lost-but-room-elsewhere", {}, 3, FULL, Capacity(3, node_lost=True), Verdict.KEEP, 3, FULL),
    ("below-min-workers-waits", {}, 3, FULL, Capacity(1, node_lost=True), Verdict.WAIT, 3, FULL),
    ("grow-back", {}, 2, BatchShape(3, 2), Capacity(3), Verdict.GROW, 3, FULL),
    ("grow-no-further-than-workers", {}, 2, BatchShape(3, 2), Capacity(8), Verdict.GROW, 3, FULL),
    ("full-size-never-grows", {}, 3, FULL, Capacity(8), Verdict.KEEP, 3, FULL),
    # 4 workers x 1 sample: 3 does not divide 4, so 2 workers with 2 micro-batches of one.
    (
        "skip-a-size-that-splits-a-sample",
        {"workers": 4, "training": {"batchSize": 1}, "elastic": {"minWorkers": 1}},
        4,
        BatchShape(1, 1),
        Capacity(3, node_lost=True),
        Verdict.SHRINK,
        2,
        BatchShape(1, 2),
    ),
    # No size from minWorkers up keeps 3 samples a step on 2 workers: wait instead.
    (
        "no-size-keeps-the-batch",
        {"training": {"batchSize": 1}},
        3,
        BatchShape(1, 1),
        Capacity(2, node_lost=True),
        Verdict.WAIT,
        3,
        BatchShape(1, 1),
    ),
    # Shrinking never makes a micro-batch larger than the attempt's (one split after running out of memory).
    (
        "shrink-keeps-a-split-micro-batch",
        {},
        3,
        BatchShape(2, 2),
        Capacity(2, node_lost=True),
        Verdict.SHRINK,
        2,
        BatchShape(2, 3),
    ),
    # Two processes a worker: 2 x 2 x 4 = 16 samples; on one worker 8 per process, 4 x 2.
    (
        "processes-per-worker",
        {"workers": 2, "resources": {"gpusPerWorker": 0, "processesPerWorker": 2}, "elastic": {"minWorkers": 1}},
        2,
        FULL,
        Capacity(1, unschedulable_seconds=400),
        Verdict.SHRINK,
        1,
        BatchShape(4, 2),
    ),
]


@pytest.mark.parametrize(
    ("over", "workers", "shape", "capacity", "verdict", "after", "after_shape"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_the_decision_table(
    over: dict[str, Any],
    workers: int,
    shape: BatchShape,
    capacity: Capacity,
    verdict: Verdict,
    after: int,
    after_shape: BatchShape,
) -> None:
    job = spec(**over)
    resize = decide(job, workers=workers, shape=shape, capacity=capacity)
    assert (resize.verdict, resize.workers, resize.shape) == (verdict, after, after_shape), resize.why
    per_worker = job.resources.processes_per_worker or 1
    assert resize.workers * per_worker * resize.shape.micro_batch * resize.shape.grad_accumulation == global_batch(job)


@pytest.mark.parametrize(
    ("min_workers", "workers", "available", "said"),
    [
        (3, 3, 2, "the cluster holds 2 of 3 worker(s): elastic.minWorkers=3 allows no fewer than 3: waiting"),
        (2, 2, 1, "the cluster holds 1 of 2 worker(s): elastic.minWorkers=2 allows no fewer than 2: waiting"),
        (2, 3, 1, "the cluster holds 1 of 3 worker(s): that is fewer than elastic.minWorkers=2: waiting"),
    ],
)
def test_a_wait_for_want_of_any_smaller_size_says_so_not_that_the_global_batch_is_kept(
    min_workers: int, workers: int, available: int, said: str
) -> None:
    """A wait at minWorkers (none smaller is allowed) or below it (none fits) is not the batch's:
    the message names the cause; only sizes that exist but divide no batch blame the batch."""
    job = spec(elastic={"minWorkers": min_workers, "waitSeconds": 60})
    shape = shape_for(job, workers, 4)
    assert shape is not None
    resize = decide(job, workers=workers, shape=shape, capacity=Capacity(available, node_lost=True))
    assert (resize.verdict, resize.why) == (Verdict.WAIT, said)
    batch = spec(workers=12, training={"batchSize": 1, "gradAccumulation": 1}, elastic={"minWorkers": 5})
    waits = decide(batch, workers=12, shape=BatchShape(1, 1), capacity=Capacity(5, node_lost=True))
    assert waits.why.endswith("no size from elastic.minWorkers=5 up keeps the global batch of 12 samples: waiting")


def test_a_world_that_does_not_divide_the_global_batch_has_no_shape() -> None:
    assert shape_for(spec(training={"batchSize": 1}), 2, 1) is None
    assert shape_for(spec(), 2, 4) == BatchShape(3, 2)


# ---------------------------------------------------------------- the lifecycle it drives

WHEN = When("2026-11-28T12:00:00Z")


def _start(job: MixedPrecisionJobSpec) -> tuple[Plan, StartAttempt]:
    plan = Plan(status=MixedPrecisionJobStatus())
    lc.begin(plan, job, first_attempt(job), WHEN)
    return plan, plan.create[0]


def _end(plan: Plan, job: MixedPrecisionJobSpec, start: StartAttempt, outcome: AttemptOutcome) -> StartAttempt:
    nxt = Plan(status=plan.status)
    lc.conclude(nxt, job, attempt=start, outcome=outcome, when=WHEN, capability=None)
    plan.status = nxt.status
    plan.events = carried_out.made(job, nxt).told  # a resize says so once the next attempt's Job is made
    assert nxt.create, nxt.status.message
    return nxt.create[0]


def _resize(job: MixedPrecisionJobSpec, start: StartAttempt, capacity: Capacity) -> Resize:
    workers = start.workers or job.workers
    return decide(job, workers=workers, shape=start.shape or BatchShape.of(job), capacity=capacity)


def test_shrink_fault_and_grow_through_the_lifecycle() -> None:
    job = spec()
    plan, first = _start(job)
    assert (plan.status.workers, plan.status.attempts[0].world_size) == (3, 3)

    lost = _resize(job, first, Capacity(2, node_lost=True))
    smaller = _end(plan, job, first, AttemptOutcome(137, platform_reason="NodeLost", resize=lost))
    ended = plan.status.attempts[0]
    assert (ended.reason, ended.charged) == (Reason.SCALED_DOWN.value, False)
    assert (smaller.precision, smaller.workers, smaller.shape) == ("fp16", 2, BatchShape(3, 2))
    assert (plan.status.workers, plan.status.attempts[1].world_size) == (2, 2)
    scaled = [e for e in plan.events if e.reason == "ScaledDown"]
    assert [(e.type, e.message) for e in scaled] == [("Warning", "3 -> 2 processes (2 worker(s))")]

    # An fp16 fault on 2 workers: bf16 on 2 workers, the same global batch.
    fallback = _end(plan, job, smaller, AttemptOutcome(42))
    assert (fallback.precision, fallback.workers, fallback.shape) == ("bf16", 2, BatchShape(3, 2))
    assert plan.status.attempts[-1].world_size == 2

    # The cluster holds 3 again: the attempt stopped at its checkpoint (SIGTERM, exit 44) grows.
    grow = _resize(job, fallback, Capacity(3))
    bigger = _end(plan, job, fallback, AttemptOutcome(44, resize=grow))
    assert plan.status.attempts[-2].reason == Reason.SCALED_UP.value
    assert [(e.type, e.reason) for e in plan.events if e.reason == "ScaledUp"] == [("Normal", "ScaledUp")]
    assert plan.status.attempts[-2].charged is False
    assert (bigger.precision, bigger.workers, bigger.shape) == ("bf16", None, FULL)
    assert (plan.status.workers, plan.status.attempts[-1].world_size) == (3, 3)
    assert plan.status.attempt_counts is not None and plan.status.attempt_counts.charged == 1


def test_a_numeric_fault_keeps_its_reason_when_the_cluster_shrank_too() -> None:
    job = spec()
    plan, first = _start(job)
    lost = _resize(job, first, Capacity(2, node_lost=True))
    nxt = _end(plan, job, first, AttemptOutcome(42, resize=lost))
    assert plan.status.attempts[0].reason == Reason.NUMERIC_FAULT.value
    assert (nxt.precision, nxt.workers) == ("bf16", None)


def test_resuming_a_suspended_small_attempt_keeps_its_size() -> None:
    job = spec()
    plan, first = _start(job)
    lost = _resize(job, first, Capacity(2, node_lost=True))
    smaller = _end(plan, job, first, AttemptOutcome(137, platform_reason="NodeLost", resize=lost))
    again = lc.again(job, plan.status, plan.status.attempts[-1], index=smaller.index, start_step=0)
    assert again.workers == 2


def test_a_smaller_attempts_job_has_its_workers_and_keeps_the_global_batch() -> None:
    job = spec()
    start = StartAttempt(1, "fp16", None, 20, micro_batch=3, grad_accumulation=2, workers=2)
    made = attempt_job(job="j", namespace="ml", uid="u", spec=job, start=start, image="i")
    assert made["spec"]["completions"] == made["spec"]["parallelism"] == 2
    container = made["spec"]["template"]["spec"]["containers"][0]
    args = container.get("command", []) + container.get("args", [])
    assert args[args.index("--workers") + 1] == "2"
    launch = AttemptLaunch.model_validate_json(
        next(e["value"] for e in container["env"] if e["name"] == "MPJOB_LAUNCH")
    )
    assert (launch.workers, launch.attempt_spec().workers, launch.spec.workers) == (2, 2, 3)


def test_the_summary_names_each_attempts_processes_when_the_size_changed() -> None:
    job = spec()
    plan, first = _start(job)
    lost = _resize(job, first, Capacity(2, node_lost=True))
    _end(plan, job, first, AttemptOutcome(137, platform_reason="NodeLost", resize=lost))
    lines = summary_lines("elastic", plan.status)
    assert lines[1].startswith("  attempt 0: fp16 on 3 process(es) steps 0-0 ScaledDown (a node was lost")
    assert lines[2] == "  attempt 1: fp16 on 2 process(es) steps 0-? running"


@pytest.mark.parametrize(
    "edit",
    [{"resources": {"gpusPerWorker": 0, "processesPerWorker": 1}}, {"workers": 1}],
    ids=["processesPerWorker", "workers"],
)
def test_the_attempt_after_an_edit_of_the_world_runs_with_the_edited_spec(edit: dict[str, Any]) -> None:
    """docs/sdk.md: under fsdp a user may edit workers and processesPerWorker of a running job,
    and the next attempt runs with the new ones (not a size read back from the last one's world)."""
    resources = {"gpusPerWorker": 0, "processesPerWorker": 2}
    two = {"workers": 2, "elastic": None, "parallelism": {"strategy": "fsdp"}, "resources": resources}
    job = spec(**two)
    plan, _ = _start(job)
    edited = spec(**{**two, **edit})
    ended = Plan(status=plan.status)  # preempted, as the operator reads it: the same precision, the new world
    lc.conclude(ended, edited, attempt=plan.status.attempts[-1], outcome=AttemptOutcome(44), when=WHEN)
    [nxt] = ended.create
    assert nxt.workers is None and ended.status.workers == edited.workers
    launch = attempt_launch(
        edited, nxt, InPlacePlan(), job_name="j", namespace="ml", checkpoint_dir=CHECKPOINT_MOUNT, resume_from=None
    )
    assert launch.attempt_spec().workers == edited.workers


def test_the_attempt_after_a_raised_min_workers_is_not_smaller_than_it() -> None:
    """2 workers after a node was lost, then elastic.minWorkers edited to 3 while it ran: the
    next attempt (a fault's) runs with spec.workers, not the 2 the spec now forbids."""
    job = spec()
    plan, first = _start(job)
    lost = _resize(job, first, Capacity(2, node_lost=True))
    smaller = _end(plan, job, first, AttemptOutcome(137, platform_reason="NodeLost", resize=lost))
    assert smaller.workers == 2
    raised = spec(elastic={"minWorkers": 3, "waitSeconds": 60})
    nxt = _end(plan, raised, smaller, AttemptOutcome(42))
    assert (nxt.precision, nxt.workers, nxt.shape) == ("bf16", None, FULL)
    assert plan.status.attempts[-1].world_size == 3


def test_growing_back_keeps_below_a_micro_batch_that_ran_out_of_memory() -> None:
    """2 workers of 4 samples ran out of memory (split to 2 x 2), a node was lost (1 worker, 2 x 4):
    growing back to 2 keeps micro-batches of 2, not batchSize's 4, which ran out of memory."""
    job = spec(workers=2, elastic={"minWorkers": 1})
    plan, first = _start(job)
    split = _end(plan, job, first, AttemptOutcome(46))  # OutOfDeviceMemory
    assert (split.workers, split.shape) == (None, BatchShape(2, 2))
    smaller = _end(plan, job, split, AttemptOutcome(137, resize=_resize(job, split, Capacity(1, node_lost=True))))
    assert (smaller.workers, smaller.shape) == (1, BatchShape(2, 4))
    grow = grows(job, plan.status.attempts[-1], 2, plan.status)
    assert grow is not None and (grow.workers, grow.shape) == (2, BatchShape(2, 2))
    # Without that ending the job grows back to batchSize's micro-batch.
    assert decide(job, workers=1, shape=BatchShape(2, 4), capacity=Capacity(2)).shape == BatchShape(4, 1)


def test_growing_back_in_fp32_keeps_the_split_of_precision_fallbackkeepsbatch() -> None:
    """fp16, bf16, then fp32 in micro-batches of 2 (fallbackKeepsBatch: fp32 activations take twice
    the memory), a node lost (1 worker, 2 x 4): growing back keeps fp32's split, as the fallback did."""
    job = spec(workers=2, elastic={"minWorkers": 1})
    plan, first = _start(job)
    bf16 = _end(plan, job, first, AttemptOutcome(42))
    fp32 = _end(plan, job, bf16, AttemptOutcome(42))
    assert (fp32.precision, fp32.shape) == ("fp32", BatchShape(2, 2))
    smaller = _end(plan, job, fp32, AttemptOutcome(137, resize=_resize(job, fp32, Capacity(1, node_lost=True))))
    assert (smaller.precision, smaller.workers, smaller.shape) == ("fp32", 1, BatchShape(2, 4))
    grow = grows(job, plan.status.attempts[-1], 2, plan.status)
    assert grow is not None and (grow.workers, grow.shape) == (2, BatchShape(2, 2))
    # Without fallbackKeepsBatch the fp32 fallback kept batchSize's micro-batch, and so does growing.
    keeps = spec(workers=2, elastic={"minWorkers": 1}, precision={"mode": "fp16", "fallback": ["bf16", "fp32"],
                                                                    "fallbackKeepsBatch": False})  # fmt: skip
    assert grows(keeps, plan.status.attempts[-1], 2, plan.status).shape == BatchShape(4, 1)  # type: ignore[union-attr]


def test_growing_back_keeps_below_a_micro_batch_that_ran_out_of_memory_once_its_entry_is_gone() -> None:
    """attempts[] keeps the first and the newest entries: an ending out of memory dropped from it
    still keeps a grown attempt below its micro-batch (the counts keep it)."""
    job = spec(workers=2, elastic={"minWorkers": 1})
    evicted = AttemptOutcome(44, platform_reason="EvictionByEvictionAPI")
    plan, start = _start(job)
    start = _end(plan, job, start, evicted)  # the first entry, always kept: not the one that runs out
    start = _end(plan, job, start, AttemptOutcome(46))  # OutOfDeviceMemory in micro-batches of 4: 2 x 2
    start = _end(plan, job, start, AttemptOutcome(137, resize=_resize(job, start, Capacity(1, node_lost=True))))
    for _ in range(MAX_ATTEMPT_ENTRIES):
        start = _end(plan, job, start, evicted)
    assert (start.workers, start.shape) == (1, BatchShape(2, 4))
    assert "OutOfDeviceMemory" not in {a.reason for a in plan.status.attempts}
    grow = grows(job, plan.status.attempts[-1], 2, plan.status)
    assert grow is not None and (grow.workers, grow.shape) == (2, BatchShape(2, 2))


def test_a_running_attempt_keeps_its_workers_through_an_edit_of_processes_per_worker() -> None:
    """An elastic fsdp job of 3 workers x 2 processes, processesPerWorker edited to 4 while it runs:
    the running attempt still has 3 pods (its record says so, not 6 processes over the new 4), so
    a lost node shrinks it to 2 workers, and an older record without workers reads as before."""
    fsdp = {"parallelism": {"strategy": "fsdp"}, "elastic": {"minWorkers": 1, "waitSeconds": 60}}
    job = spec(**fsdp, resources={"gpusPerWorker": 0, "processesPerWorker": 2})
    plan, _ = _start(job)
    running = plan.status.attempts[-1]
    edited = spec(**fsdp, resources={"gpusPerWorker": 0, "processesPerWorker": 4})
    assert (running.world_size, workers_of(edited, running)) == (6, 3)
    pods = [PodView("j-0", 0, "Failed", alive=False, platform_reason="NodeLost")]
    resize = node_lost(edited, running, pods)
    assert resize is not None and (resize.verdict, resize.workers) == (Verdict.SHRINK, 2), resize
    older = running.model_copy(update={"workers": None})
    assert workers_of(job, older) == 3
