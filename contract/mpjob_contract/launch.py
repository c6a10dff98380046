"""What the operator (or the local runner) tells one trainer process about its attempt.

The operator writes it as JSON into the `MPJOB_LAUNCH` environment variable of the trainer
container; the local runner does the same for its child processes. `mpjob-trainer --launch
FILE` reads it from a file instead.

`checkpointDir` is the job's own folder of the checkpoint store: on a cluster
`<mount>/<namespace>/<job>/<job uid>` (`job_checkpoint_dir`), so jobs that share a volume never
see, prune or replace each other's checkpoints, and a job created again under the same name
starts clean. `resumeFrom` comes, through the planner, from a trainer's termination report: it
is held to that folder here, where both sides build or read a launch.
"""

from __future__ import annotations

import posixpath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mpjob_contract.api import MixedPrecisionJobSpec, Precision, RequestedPrecision
from mpjob_contract.environment import LAUNCH_ENV as LAUNCH_ENV  # re-exported: its home is the light module
from mpjob_contract.pod_volumes import CHECKPOINT_MOUNT as CHECKPOINT_MOUNT  # re-exported: the rules read it too
from mpjob_contract.status import MAX_FORMER_JOBS
from mpjob_contract.vocabulary import MAX_ATTEMPT_ENTRIES


def contract_version() -> str:
    """This mpjob-contract's release: what a launch says it was written with (`contract`)."""
    from importlib.metadata import PackageNotFoundError, version  # only where a launch is written or refused

    try:
        return version("mpjob-contract")
    except PackageNotFoundError:
        return "unknown"


#: `auto` attempts: a low precision is chosen only when its measured step is this much faster
#: than fp32's (0.05: 5 % less time per step).
AUTO_MARGIN = 0.05


def job_checkpoint_dir(*, namespace: str, name: str, uid: str, root: str = CHECKPOINT_MOUNT) -> str:
    """The job's own folder below the checkpoint volume's mount. Kubernetes names and UIDs
    hold no `/` and are never `.` or `..`, so each is one path segment."""
    for field, value in (("namespace", namespace), ("name", name), ("uid", uid)):
        if not value or "/" in value or value in (".", "..") or "\0" in value:
            raise ValueError(f"the job's {field} {value!r} cannot name a checkpoint folder")
    return posixpath.join(root, namespace, name, uid)


def checkpoint_root(spec: MixedPrecisionJobSpec) -> str:
    """Below what the job's checkpoint folder lies: the bucket's `s3://<bucket>/<prefix>`, or
    the volume's mount (the same per-job folder rule for both)."""
    s3 = spec.checkpoint.s3
    return s3.url if s3 is not None else CHECKPOINT_MOUNT


def inside_checkpoint_dir(path: str, checkpoint_dir: str) -> bool:
    """Whether `path` names something below `checkpoint_dir`, judged on the names (`..`
    resolved; both absolute or both relative). Links inside the volume are its owner's."""
    if "\0" in path or posixpath.isabs(path) != posixpath.isabs(checkpoint_dir):
        return False
    relative = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(checkpoint_dir))
    return relative != "." and relative != ".." and not relative.startswith("../")


class InPlaceTarget(BaseModel):
    """A precision an attempt may fall back to in its running processes, and the re-promotion
    the planner gives the attempt that trains in it (None: none), with the precision that
    re-promotion goes to in place when the planner allows that too (`promoteTo`). A `promoteTo`
    target names in turn the precisions its re-promoted attempt may fall back to in place
    (`inPlaceTo`, as the launch's own); a fallback target's are the ones after it in its list.
    A fallback into fp32 that splits the micro-batch (precision.fallbackKeepsBatch), and the
    re-promotion that takes it back, name that split (`microBatch` x `gradAccumulation`, the same
    samples per step; None: the attempt keeps the one it trains in). A trainer of an older
    release refuses the launch that names one (its targets allow no other field) rather than
    train on in the wrong split."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    precision: Precision
    repromote_after_steps: int | None = Field(None, alias="repromoteAfterSteps", ge=1)
    promote_to: InPlaceTarget | None = Field(None, alias="promoteTo")
    in_place_to: list[InPlaceTarget] = Field(default_factory=list, alias="inPlaceTo", max_length=8)
    micro_batch: int | None = Field(None, alias="microBatch", ge=1)
    grad_accumulation: int | None = Field(None, alias="gradAccumulation", ge=1)

    @model_validator(mode="after")
    def _whole_split(self) -> InPlaceTarget:
        if (self.micro_batch is None) != (self.grad_accumulation is None):
            raise ValueError("microBatch and gradAccumulation name a split together: set both or neither")
        return self

    @property
    def shape(self) -> tuple[int, int] | None:
        """The split the target's attempt trains in (None: the one the attempt trains in now)."""
        if self.micro_batch is None or self.grad_accumulation is None:
            return None
        return self.micro_batch, self.grad_accumulation

    def targets(self) -> list[InPlaceTarget]:
        """This target and every one below it (its promoteTo, its inPlaceTo), depth first."""
        below = [self.promote_to] if self.promote_to is not None else []
        return [self, *(t for target in [*below, *self.in_place_to] for t in target.targets())]


class InPlaceSplit(BaseModel):
    """A smaller micro-batch an attempt may go on in, in its running processes, after it ran out
    of device memory: the planner's next attempt after an OutOfDeviceMemory ending (the same
    precision and samples per step), with that attempt's re-promotion (None: none), where the
    re-promotion goes in place (None: it restarts) and the precisions that attempt may fall back
    to in place (`inPlaceTo`, as the launch's own)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    micro_batch: int = Field(alias="microBatch", ge=1)
    grad_accumulation: int = Field(alias="gradAccumulation", ge=1)
    repromote_after_steps: int | None = Field(None, alias="repromoteAfterSteps", ge=1)
    promote_to: InPlaceTarget | None = Field(None, alias="promoteTo")
    in_place_to: list[InPlaceTarget] = Field(default_factory=list, alias="inPlaceTo", max_length=8)


class InPlaceChanges(BaseModel):
    """What an attempt may change in its running processes: the launch's own three fields
    (`inPlaceTo`, `promoteInPlaceTo`, `inPlaceSplits`); an `auto` attempt's for each precision it
    may measure on its node (`inPlaceMeasured`), as the planner makes them for an attempt
    launched in that precision."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    in_place_to: list[InPlaceTarget] = Field(default_factory=list, alias="inPlaceTo", max_length=8)
    promote_in_place_to: InPlaceTarget | None = Field(None, alias="promoteInPlaceTo")
    in_place_splits: list[InPlaceSplit] = Field(default_factory=list, alias="inPlaceSplits", max_length=8)

    def targets(self) -> list[InPlaceTarget]:
        """Every in-place target it names, at any depth."""
        tops = [*self.in_place_to, *([self.promote_in_place_to] if self.promote_in_place_to is not None else [])]
        for split in self.in_place_splits:
            tops += [*split.in_place_to, *([split.promote_to] if split.promote_to is not None else [])]
        return [t for top in tops for t in top.targets()]


class AttemptLaunch(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    job_name: str = Field(alias="jobName")
    namespace: str = "default"
    #: The MixedPrecisionJob's UID (None: a local run): part of the identity its checkpoints carry.
    job_uid: str | None = Field(None, alias="jobUid")
    attempt: int = Field(0, ge=0)
    #: Precision of this attempt; "auto" lets the trainer pick from the device it finds.
    precision: RequestedPrecision
    #: Checkpoint directory to resume from; None means "newest valid one in checkpointDir".
    resume_from: str | None = Field(None, alias="resumeFrom")
    checkpoint_dir: str = Field(CHECKPOINT_MOUNT, alias="checkpointDir")
    #: This attempt's samples per micro-batch and micro-batches per optimizer step, when the
    #: planner split spec.training's (None: as the spec says). `attempt_spec` applies them.
    micro_batch: int | None = Field(None, alias="microBatch", ge=1)
    grad_accumulation: int | None = Field(None, alias="gradAccumulation", ge=1)
    #: End this attempt with Repromote (exit 47) at the first checkpoint written after this
    #: many clean steps (None: never; the planner sets it on fallback attempts).
    repromote_after_steps: int | None = Field(None, alias="repromoteAfterSteps", ge=1)
    #: The step the precision before this one faulted at, for a fallback attempt (or one restarted
    #: in its precision): its clean steps (repromoteAfterSteps) count from there, not from its start,
    #: so the steps it runs again from the checkpoint before the fault do not take it back up before
    #: it has passed that step (None: from its start, or the last trouble its checkpoint records).
    repromote_counts_from: int | None = Field(None, alias="repromoteCountsFrom", ge=0)
    #: The precisions this attempt may fall back to in its running processes, in order (the
    #: planner's next attempts after a numeric fault that need no restart, within the attempt
    #: budget); empty: every fallback ends the attempt (precision.inPlace false, or nothing left).
    in_place_to: list[InPlaceTarget] = Field(default_factory=list, alias="inPlaceTo", max_length=8)
    #: Where this attempt's own re-promotion (repromoteAfterSteps) goes in its running processes
    #: (None: it ends the attempt, exit 47, and the operator restarts it).
    promote_in_place_to: InPlaceTarget | None = Field(None, alias="promoteInPlaceTo")
    #: The smaller micro-batches this attempt may go on in, in its running processes, after
    #: running out of device memory, in order (each the planner's next attempt after the one
    #: before); empty: an out-of-memory ends the attempt (exit 46) and the next one restarts.
    in_place_splits: list[InPlaceSplit] = Field(default_factory=list, alias="inPlaceSplits", max_length=8)
    #: An `auto` attempt's: what it may change in place (the three fields above, which it leaves
    #: empty), by the precision it measures; a precision not named: every change restarts.
    in_place_measured: dict[Precision, InPlaceChanges] = Field(default_factory=dict, alias="inPlaceMeasured")
    #: Workers (pods) of this attempt when spec.elastic runs it with fewer than spec.workers (None:
    #: spec.workers); its microBatch x gradAccumulation then keeps the spec's global batch.
    workers: int | None = Field(None, ge=1)
    #: When the attempt before this one ended (its report's endedAt, Unix seconds): this one's
    #: trainer reports its recoverySeconds from it once it has resumed (None: not a recovery).
    recovering_since: float | None = Field(None, alias="recoveringSince", ge=0, allow_inf_nan=False)
    #: The Jobs (their UIDs, oldest first; empty: none recorded) each earlier attempt the job's
    #: status holds ran in, by attempt: its newest and those deleted while it ran and made again in
    #: it. A checkpoint one of them wrote from another Job (a stray, made after that attempt ended)
    #: is not resumed from (the trainer's checkpoint.lineage). None: not judged (a local run).
    lineage: dict[int, Annotated[list[str], Field(max_length=MAX_FORMER_JOBS + 1)]] | None = Field(
        None, max_length=MAX_ATTEMPT_ENTRIES
    )
    spec: MixedPrecisionJobSpec
    #: The mpjob-contract release the writer (the operator, `mpjob run`) was built with: a trainer
    #: image from another release that cannot read the launch says so (a pinned spec.image).
    contract: str = Field(default_factory=contract_version, max_length=64)

    @model_validator(mode="after")
    def _resume_inside_checkpoints(self) -> AttemptLaunch:
        if self.resume_from is not None and not inside_checkpoint_dir(self.resume_from, self.checkpoint_dir):
            raise ValueError(
                f"resumeFrom {self.resume_from!r} is not inside checkpointDir {self.checkpoint_dir!r}: "
                "an attempt resumes only from a checkpoint in its own checkpoint volume"
            )
        return self

    @model_validator(mode="after")
    def _same_samples_per_step(self) -> AttemptLaunch:
        tr = self.spec.training
        micro = self.micro_batch or tr.batch_size
        accumulation = self.grad_accumulation or tr.grad_accumulation
        workers = self.workers or self.spec.workers
        plans = [self._own_changes(), *self.in_place_measured.values()]
        shapes = [(micro, accumulation)]
        shapes += [(s.micro_batch, s.grad_accumulation) for plan in plans for s in plan.in_place_splits]
        shapes += [shape for plan in plans for target in plan.targets() if (shape := target.shape) is not None]
        for micro, accumulation in shapes:
            self._keeps_global_batch(micro, accumulation, workers)
        return self

    def _own_changes(self) -> InPlaceChanges:
        return InPlaceChanges(in_place_to=self.in_place_to, promote_in_place_to=self.promote_in_place_to,
                              in_place_splits=self.in_place_splits)  # fmt: skip

    def changes_in(self, precision: str) -> InPlaceChanges:
        """What the attempt may change in place while it trains in `precision` (nothing unless
        spec.precision.inPlace): an `auto` attempt's plan for what it measured (none named:
        nothing), any other's own."""
        if not self.spec.precision.in_place:
            return InPlaceChanges()
        if self.precision != "auto":
            return self._own_changes()
        return self.in_place_measured.get(precision, InPlaceChanges())  # type: ignore[call-overload]

    def _keeps_global_batch(self, micro: int, accumulation: int, workers: int) -> None:
        tr = self.spec.training
        if micro * accumulation * workers != tr.batch_size * tr.grad_accumulation * self.spec.workers:
            raise ValueError(
                f"microBatch {micro} x gradAccumulation {accumulation} x workers {workers} must equal the spec's "
                f"training.batchSize x training.gradAccumulation x workers = "
                f"{tr.batch_size * tr.grad_accumulation * self.spec.workers}: every attempt keeps the global batch"
            )

    def attempt_spec(self) -> MixedPrecisionJobSpec:
        """The spec as this attempt trains it: spec.training with the attempt's micro-batch split,
        and its workers (spec.elastic)."""
        if self.micro_batch is None and self.grad_accumulation is None and self.workers is None:
            return self.spec
        tr = self.spec.training
        training = tr.model_copy(
            update={
                "batch_size": self.micro_batch or tr.batch_size,
                "grad_accumulation": self.grad_accumulation or tr.grad_accumulation,
            }
        )
        return self.spec.model_copy(update={"training": training, "workers": self.workers or self.spec.workers})

    def split(self, micro_batch: int, grad_accumulation: int) -> AttemptLaunch:
        """This launch in another micro-batch split (one its trainer made in place)."""
        return self.model_copy(update={"micro_batch": micro_batch, "grad_accumulation": grad_accumulation})

    @property
    def job_identity(self) -> str:
        """Who writes this attempt's checkpoints: `<namespace>/<job>[/<uid>]`, the same for every
        attempt of the job. The store prunes and replaces only checkpoints that name it."""
        return "/".join(part for part in (self.namespace, self.job_name, self.job_uid) if part)

    def to_env(self) -> str:
        """The launch as JSON; `inPlaceMeasured` and `repromoteCountsFrom` only when they name
        something, so a trainer image of the release before each still reads the launch of an
        attempt that is not `auto`, or not a fallback that may go back up."""
        unset = {"in_place_measured"} if not self.in_place_measured else set()
        unset |= {"repromote_counts_from"} if self.repromote_counts_from is None else set()
        return self.model_dump_json(by_alias=True, exclude=unset or None)
