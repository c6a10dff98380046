"""The MixedPrecisionJob's status (operator-written): phase, live figures, the attempts and
their counts, conditions, cost and timeline."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from mpjob_contract.accounting import JobCost
from mpjob_contract.skipping import Skipped
from mpjob_contract.timeline import PrecisionTimeline
from mpjob_contract.tracking import ProfileStatus
from mpjob_contract.vocabulary import Phase, RequestedPrecision
from mpjob_contract.wire import ApiModel

#: The Jobs an attempt's entry remembers beyond its newest (`AttemptStatus.former_job_uids`).
MAX_FORMER_JOBS = 8


class CheckpointStatus(ApiModel):
    step: int
    sha256: str = ""
    precision: str = ""
    path: str = ""


class AttemptStatus(ApiModel):
    index: int
    precision: RequestedPrecision
    start_step: int = 0
    #: The trainer's own start step replaced the planned one (from a live reading): taken once
    #: per attempt, so a trainer whose reported start flaps costs one Event and one write.
    start_step_reported: bool | None = None
    end_step: int | None = None
    #: Training processes of the attempt: workers x processesPerWorker.
    world_size: int | None = None
    #: Workers (pods) of the attempt, as its Job was made: an edit of processesPerWorker since
    #: then does not change them (None: recorded by an operator before this field, world_size
    #: over the spec's processesPerWorker).
    workers: int | None = None
    #: Samples per micro-batch per process and micro-batches per optimizer step in this attempt
    #: (fallback to fp32 and running out of GPU memory split the micro-batch; their product
    #: stays training.batchSize x training.gradAccumulation).
    micro_batch: int | None = None
    grad_accumulation: int | None = None
    #: This attempt went back up to a faster precision after a fallback (Repromote).
    repromoted: bool | None = None
    #: The trainer changed to this attempt's precision in its running processes (no pod restarted).
    in_place: bool | None = None
    #: Seconds from the fault the previous attempt ended on (the trainer's detection) to this
    #: attempt's first step, in place or through a restart.
    recovery_seconds: float | None = None
    #: It began in new pods over the checkpoint the status named, which went with the old pods
    #: (kept in emptyDir): planned from step 0 though the job had one (None: nothing went). Its
    #: AttemptStarted Event, said once its Job is made, says so.
    checkpoints_lost: bool | None = None
    #: When the attempt before it ended, by its trainer's clock (Unix seconds; None: not a
    #: recovery): a Job made again for this attempt hands it to its trainer as the first did.
    recovering_since: float | None = None
    #: `auto` attempts: seconds per step the trainer measured on its node, by precision (None:
    #: non-finite); `precision` is the one it chose ("auto" until it has measured).
    measured_step_seconds: dict[str, float | None] | None = None
    reason: str | None = None
    exit_code: int | None = None
    message: str | None = None
    #: Whether the attempt used one of runPolicy.maxAttempts: false only when the cluster showed
    #: a disruption (the pod's DisruptionTarget, its queue suspending the Job, the node gone) or
    #: the user suspended the job; a trainer's own word (exit 44, a Preempted report) is charged.
    charged: bool | None = None
    start_time: str | None = None
    finish_time: str | None = None
    #: The UID of the Job made for this attempt (its newest, if made again; none for an attempt
    #: in place, which runs in an earlier attempt's Job), written as soon as it is made: an
    #: operator that restarts knows by it which pods and objects a Job deleted with
    #: --cascade=orphan left are its own.
    job_uid: str | None = None
    #: The UIDs of the Jobs made for it before its newest (each deleted while the attempt ran and
    #: made again in it), oldest first, the newest MAX_FORMER_JOBS: their trainers' checkpoints
    #: are the attempt's own, which a later attempt may resume from (AttemptLaunch.lineage).
    former_job_uids: list[str] | None = Field(None, max_length=MAX_FORMER_JOBS)
    #: When a live reading first showed the attempt, and then each time it showed its step move:
    #: runPolicy.progressDeadlineSeconds counts from it, so an operator that restarts meanwhile
    #: goes on counting where the one before it left off.
    progress_time: str | None = None
    #: Its last loss and loss scale (fp16 only), as status.loss and status.lossScale held them
    #: when it ended: a finished job whose last attempt logged none shows these.
    loss: float | None = None
    loss_scale: float | None = None
    #: What it cost (mpjob_contract.accounting): GPU-seconds seen, samples trained, and the steps
    #: (and their share of GPU-seconds) a later attempt trained again.
    gpu_seconds: float | None = None
    #: GPU-seconds of its Jobs deleted by hand while it ran (each created again in the same
    #: attempt), as seen once their pods had stopped: its gpuSeconds adds them to its last Job's.
    deleted_jobs_gpu_seconds: float | None = None
    samples: int | None = None
    wasted_steps: int | None = None
    wasted_gpu_seconds: float | None = None


class AttemptCounts(ApiModel):
    """Every attempt of the job, counted: attempts[] keeps only the first and the newest
    (MAX_ATTEMPT_ENTRIES in all), so these counts, not the entries, decide the attempt budget."""

    #: Attempts begun (the next one's index, as attempts are numbered from 0).
    started: int = 0
    #: Ended attempts that used runPolicy.maxAttempts.
    charged: int = 0
    #: Attempts that went back up to a faster precision (precision.maxRepromotions).
    repromotions: int = 0
    #: The first attempt each precision was re-promoted into, by precision; and the precisions
    #: that faulted again after it, which a re-promotion never goes back up to.
    repromoted_at: dict[str, int] = Field(default_factory=dict)
    barred: list[str] = Field(default_factory=list, max_length=8)
    #: Ended attempts by reason (NumericFault, Preempted, ...).
    by_reason: dict[str, int] = Field(default_factory=dict)
    #: Entries dropped from attempts[] (between the first and the newest).
    omitted: int = 0
    #: The smallest micro-batch an attempt ran out of device memory in (OutOfDeviceMemory), by the
    #: attempt's precision: a later attempt (re-promoted, grown back) in that precision or a wider
    #: one (fp32 after bf16) stays below it; a narrower one (bf16 after fp32) is not held by it.
    out_of_memory_micro_batches: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict, max_length=8)
    #: The same, as statuses written before the precision was kept hold it: it holds every
    #: precision (None: none did; no longer written).
    out_of_memory_micro_batch: int | None = Field(None, ge=1)


class Condition(ApiModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class MixedPrecisionJobStatus(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: Phase = "Pending"
    precision: RequestedPrecision | None = None
    attempt: int = 0
    #: Workers (pods) of the current attempt: spec.workers, or fewer while an elastic job runs
    #: smaller (spec.elastic).
    workers: int | None = None
    #: spec.elastic: more workers fit again since the attempt was at this step; it ends at its
    #: first checkpoint past it and the next attempt runs with more (None: no growth pending).
    grow_after_step: int | None = None
    step: int = 0
    total_steps: int | None = None
    loss: float | None = None
    loss_scale: float | None = None
    overflow_steps: int | None = None
    samples_per_second: float | None = None
    #: The quality gate's last evaluation: eval loss in the attempt's precision, and its relative
    #: delta to fp32 at the same weights.
    eval_loss: float | None = None
    eval_loss_delta: float | None = None
    #: Steps and samples skipped as bad data or loss spikes (guard.onBadData, guard.spike).
    skipped: Skipped | None = None
    last_checkpoint: CheckpointStatus | None = None
    attempts: list[AttemptStatus] = Field(default_factory=list)
    attempt_counts: AttemptCounts | None = None
    cost: JobCost | None = None
    timeline: PrecisionTimeline | None = None
    conditions: list[Condition] = Field(default_factory=list)
    #: Profiles asked for with the mpjob.dev/profile-steps annotation, newest last (bounded).
    profiles: list[ProfileStatus] = Field(default_factory=list)
    observed_generation: int | None = None
    message: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
