"""What the attempts cost, as data: GPU-seconds, samples and the steps trained twice.

Pure arithmetic over the status (the definitions are mpjob_contract.accounting's): the operator
hands in the GPU-seconds it saw of each attempt's pods (`seen_usage`), `mpjob run` those of its
worker processes; `settle` writes each attempt's figures and keeps `status.cost` as their sums.

The sums are kept by difference, not recomputed from attempts[]: attempts[] keeps only the first
and the newest entries, so `settle` adds to status.cost what changed in each entry it still
holds (an attempt's waste moves when the next attempt's trainer corrects where it resumed) and a
dropped entry's share stays in the sums. Running `settle` twice changes nothing. The operator's
counters add the same differences (`changes`), once, at the reconcile whose status write made
them, so an operator restart (which reads them back from the status) never counts twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from mpjob.planning import history, timeline
from mpjob.planning import status as st
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.figures import round_sig
from mpjob_contract.accounting import JobCost, WasteReason
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus, world_size
from mpjob_contract.codes import Reason

SECONDS_PER_HOUR = 3600.0


#: The device a cluster's trainer pod runs on: the GPUs it asked for are its (nvidia.com/gpu).
ON_GPU = "cuda"


def gpus_per_worker(spec: MixedPrecisionJobSpec, device: str | None = ON_GPU) -> int:
    """The GPUs each worker of an attempt is charged for: spec.resources.gpusPerWorker when its
    trainers ran on a GPU (`device`, as the trainer's start line names it: a cluster's pods hold
    the GPUs they asked for), none when they ran on the CPU or never said (`mpjob run` on a
    machine without a GPU trains on the CPU whatever the spec asks: no GPU-seconds claimed)."""
    return spec.resources.gpus_per_worker if device is not None and device.startswith(ON_GPU) else 0


def gpus_held(spec: MixedPrecisionJobSpec, workers: int, devices: Iterable[str]) -> int:
    """The GPUs a local attempt's `workers` are charged for: the distinct CUDA devices their
    trainers' start lines named (`devices`), at most workers x `gpus_per_worker`. Local workers
    share the machine's GPUs (each worker's local rank 0 takes cuda:0): two workers that asked
    for a GPU each but trained on one are charged one, not two; none on the CPU."""
    on_gpu = {device for device in devices if gpus_per_worker(spec, device)}
    return min(workers * gpus_per_worker(spec), len(on_gpu))


def pod_seconds(pod: PodView, now: datetime, until: datetime | None = None) -> float:
    """Seconds the pod's trainer container ran as seen: start to finish; one still running, to
    `now`; one never seen starting (or ended with no finish time) adds nothing; none after
    `until` (an attempt that ended while its pods went on in place)."""
    start = st.moment(pod.started_at)
    end = now if pod.alive else st.moment(pod.finished_at)
    if start is None or end is None:
        return 0.0
    end = min(end, until) if until is not None else end
    return max(0.0, (end - start).total_seconds())


def gpu_seconds(
    pods: Iterable[PodView], *, gpus_per_worker: int, now: datetime, until: datetime | None = None
) -> float:
    """Pods x GPUs x wall time: each pod's seconds (up to `until`) times the GPUs it holds, those
    its Job asked for (`PodView.gpus`: a spec edited since does not change them), else
    `gpus_per_worker` where not known."""
    return sum((pod.gpus or gpus_per_worker) * pod_seconds(pod, now, until) for pod in pods)


def seen_usage(
    status: MixedPrecisionJobStatus,
    jobs: Mapping[int, JobView],
    spec: MixedPrecisionJobSpec,
    now: datetime,
    stopped: Mapping[int, JobView] | None = None,
) -> dict[int, float]:
    """GPU-seconds of the ended attempts that have no figure yet and whose Job is still seen (an
    attempt's Job outlives its ending by at least one reconcile, so each ending is seen once), and
    of those whose Job is gone with its pods all stopped (`stopped`, as last seen): the whole time
    they ran, more than was seen of an attempt ended while they ran on to checkpoint (a
    suspension, a resize; `settle` raises its figure). Attempts begun in place share their chain's
    Job: each is charged what the Job's pods ran up to its end (the trainer's moment of the
    change) beyond the figures of the attempts before it in that Job."""
    gpus, usage, stopped = gpus_per_worker(spec), dict[int, float](), stopped or {}
    for attempt in status.attempts:
        at = history.job_index(status, attempt.index)
        final = stopped.get(attempt.index) or stopped.get(at)
        job = final or jobs.get(attempt.index) or jobs.get(at)
        if attempt.finish_time is None or (attempt.gpu_seconds is not None and final is None) or job is None:
            continue
        before = _charged_before(status, attempt, job, usage)
        until = st.moment(attempt.finish_time) if history.job_index(status, attempt.index + 1) == job.index else None
        ran = gpu_seconds(job.pods, gpus_per_worker=gpus, now=now, until=until)  # its Job went on in place: to its end
        usage[attempt.index] = max(0.0, ran - before) + (attempt.deleted_jobs_gpu_seconds or 0.0)
    return usage


def own_jobs(status: MixedPrecisionJobStatus, views: Mapping[int, JobView]) -> dict[int, JobView]:
    """`views` less the stray Jobs among them (`history.strays`, by their uids: made for an
    attempt `status` has ended, which records another Job, or none and ended before it was made;
    the operator deletes them): their pods are not the attempt's, whose cost stays what it was when it ended. `status`
    is the one read, before this reconcile ends anything: an attempt ending now whose Job's uid
    is not recorded yet (`lifecycle.made`) is charged its own Job. A view without a uid is kept."""
    strays = history.strays(status, {i: history.HeldJob(v.uid, v.created) for i, v in views.items() if v.uid})
    return {index: view for index, view in views.items() if index not in strays}


def deleted_job(
    status: MixedPrecisionJobStatus, attempt: AttemptStatus, job: JobView, spec: MixedPrecisionJobSpec, now: datetime
) -> None:
    """The running `attempt`'s Job `job` was deleted by hand, its pods have stopped, and it is
    created again in the same attempt: what they ran (beyond the figures of the attempts before it
    in that Job, as `seen_usage` counts) is kept for the attempt's gpuSeconds."""
    ran = gpu_seconds(job.pods, gpus_per_worker=gpus_per_worker(spec), now=now)
    more = max(0.0, ran - _charged_before(status, attempt, job, {}))
    attempt.deleted_jobs_gpu_seconds = round((attempt.deleted_jobs_gpu_seconds or 0.0) + more, 3)


def _charged_before(
    status: MixedPrecisionJobStatus, attempt: AttemptStatus, job: JobView, usage: Mapping[int, float]
) -> float:
    """The GPU-seconds charged to the attempts before `attempt` that ran in its Job `job` (begun in
    place: its chain), with `usage`'s figures where it has them."""
    return sum(
        usage.get(a.index, a.gpu_seconds or 0.0)
        for a in status.attempts
        if job.index <= a.index < attempt.index and history.job_index(status, a.index) == job.index
    )


@dataclass(frozen=True)
class Waste:
    steps: int | None
    gpu_seconds: float | None
    reason: WasteReason | None


def trained_steps(attempt: AttemptStatus) -> int:
    """Steps the attempt trained past where it began."""
    return max(0, (attempt.end_step or attempt.start_step) - attempt.start_step)


def waste_of(attempt: AttemptStatus, following: AttemptStatus | None) -> Waste:
    """The attempt's wasted steps and GPU-seconds, given the attempt after it (None: none yet)."""
    trained, seconds = trained_steps(attempt), attempt.gpu_seconds
    if attempt.finish_time is None:
        return Waste(None, None, None)
    if trained == 0 and attempt.reason != Reason.SUCCEEDED.value:
        return Waste(0 if following is not None else None, seconds, WasteReason.SETUP)
    if following is None or attempt.end_step is None:
        return Waste(None, None, None)
    steps = max(0, attempt.end_step - following.start_step)
    share = min(1.0, steps / trained) if trained else 0.0
    return Waste(steps, None if seconds is None else seconds * share, WasteReason.ROLLBACK)


def samples_of(attempt: AttemptStatus, spec: MixedPrecisionJobSpec) -> int:
    """Samples the attempt trained on: its steps x samples per optimizer step (every process's)."""
    micro = attempt.micro_batch or spec.training.batch_size
    accumulation = attempt.grad_accumulation or spec.training.grad_accumulation
    return trained_steps(attempt) * micro * accumulation * (attempt.world_size or world_size(spec))


def settle(status: MixedPrecisionJobStatus, spec: MixedPrecisionJobSpec, usage: Mapping[int, float]) -> None:
    """Each ended attempt's figures (with `usage`: GPU-seconds seen of attempts that had none, or
    more than they had: never fewer), and status.cost as their sums (in place; idempotent)."""
    cost = status.cost or JobCost()
    entries = status.attempts
    for position, entry in enumerate(entries):
        if entry.finish_time is None:
            continue
        if entry.index in usage and (entry.gpu_seconds is None or usage[entry.index] > entry.gpu_seconds):
            seconds = round(usage[entry.index], 3)
            cost.gpu_seconds += seconds - (entry.gpu_seconds or 0.0)
            entry.gpu_seconds = seconds
        entry.samples = samples_of(entry, spec)
        after = entries[position + 1] if position + 1 < len(entries) else None
        if after is not None and after.index != entry.index + 1:
            continue  # its next attempt's entry was dropped: its waste was settled while it was there
        waste = waste_of(entry, after)
        cost.wasted_steps += (waste.steps or 0) - (entry.wasted_steps or 0)
        new_seconds = None if waste.gpu_seconds is None else round(waste.gpu_seconds, 3)
        cost.wasted_gpu_seconds += (new_seconds or 0.0) - (entry.wasted_gpu_seconds or 0.0)
        entry.wasted_steps, entry.wasted_gpu_seconds = waste.steps, new_seconds
    if entries or status.cost is not None:
        status.cost = priced(cost, spec)


def account(status: MixedPrecisionJobStatus, spec: MixedPrecisionJobSpec, usage: Mapping[int, float]) -> None:
    """After any transition, for the operator and `mpjob run` alike: the attempts' cost figures
    and sums, and their precision spans in status.timeline."""
    settle(status, spec, usage)
    timeline.spans(status)


def priced(cost: JobCost, spec: MixedPrecisionJobSpec) -> JobCost:
    """The sums rounded, and in money at spec.costPerGpuHour (none without a price)."""
    price = spec.cost_per_gpu_hour
    cost = cost.model_copy(
        update={"gpu_seconds": round(cost.gpu_seconds, 3), "wasted_gpu_seconds": round(cost.wasted_gpu_seconds, 3)}
    )
    if price is None:
        return cost.model_copy(update={"currency": None, "amount": None, "wasted_amount": None})
    return cost.model_copy(
        update={
            "currency": price.currency,
            "amount": money(cost.gpu_seconds, price.amount),
            "wasted_amount": money(cost.wasted_gpu_seconds, price.amount),
        }
    )


def money(seconds: float, per_hour: float) -> float:
    """GPU-seconds at a price per GPU-hour, to five significant digits."""
    return round_sig(seconds / SECONDS_PER_HOUR * per_hour)


@dataclass(frozen=True)
class Change:
    """What one status write added to the sums, for the operator's counters."""

    #: GPU-seconds of attempts that ended, by their ending (the attempt's reason).
    gpu_seconds: dict[str, float]
    #: Wasted GPU-seconds, by why.
    wasted_gpu_seconds: dict[str, float]


def changes(before: MixedPrecisionJobStatus, after: MixedPrecisionJobStatus) -> Change:
    """What `after` adds to `before`'s figures, per attempt it holds (never negative: a counter)."""
    old = {a.index: a for a in before.attempts}
    used: dict[str, float] = {}
    wasted: dict[str, float] = {}
    for entry in after.attempts:
        was = old.get(entry.index)
        more = (entry.gpu_seconds or 0.0) - ((was.gpu_seconds or 0.0) if was else 0.0)
        if more > 0:
            used[entry.reason or ""] = used.get(entry.reason or "", 0.0) + more
        more = (entry.wasted_gpu_seconds or 0.0) - ((was.wasted_gpu_seconds or 0.0) if was else 0.0)
        if more > 0:
            why = WasteReason.SETUP if trained_steps(entry) == 0 else WasteReason.ROLLBACK
            wasted[why.value] = wasted.get(why.value, 0.0) + more
    return Change(used, wasted)
