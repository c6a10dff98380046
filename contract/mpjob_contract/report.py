"""The JSON termination report the trainer writes before exiting non-zero.

Kubernetes keeps at most 4096 bytes of a container's termination message; `to_message`
keeps the report well under that by shortening the human message first.

A report is the tenant's word: any process in the trainer's container can write that file.
So it is validated at the boundary, here, by every reader (the operator, `mpjob run`, the
launcher folding its ranks): a precision is one the API knows, a reason one of the trainer's
own (`codes.TRAINER_REASONS`: an eviction or an OOM kill is the cluster's to show),
steps and counters are integers in [0, 2^53), floats are finite, strings are bounded (the
message is cut to MAX_MESSAGE_CHARS and rid of terminal control (`environment.readable`), a
path or digest too long or holding a control character is refused). A
message that looks like a report and fails the model raises `InvalidReport`, naming the
fields; the reader makes that an infrastructure failure of the attempt, never a value it
stores, plans with or puts in a metric label.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mpjob_contract import timeline
from mpjob_contract.api import Precision
from mpjob_contract.codes import TRAINER_REASONS, Reason
from mpjob_contract.environment import DEFAULT_TERMINATION_LOG, MAX_REPORT_BYTES, TERMINATION_LOG_ENV, readable
from mpjob_contract.skipping import Skipped

__all__ = [
    "DEFAULT_TERMINATION_LOG",
    "MAX_REPORT_BYTES",
    "TERMINATION_LOG_ENV",
    "CheckpointRef",
    "Counters",
    "InPlaceChange",
    "InvalidReport",
    "Measurement",
    "Replay",
    "TerminationReport",
    "newest_checkpoint",
]

#: Integers a report may carry: what a JSON number holds exactly (and a status patch accepts).
MAX_REPORT_INT = 2**53 - 1
#: The longest human message a report keeps (longer ones are cut; Kubernetes keeps 4096 bytes).
MAX_MESSAGE_CHARS = 4096
#: The longest path or digest a report may name, and what it may not hold: a control character
#: (the status shows it, `mpjob status` prints it to a terminal).
MAX_NAME_CHARS = 1024
NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]*$"
#: The longest message an in-place change keeps, and the most changes a report lists (one per
#: rung of the longest ladder, fp8 -> fp16 -> bf16 -> fp32, with room to spare).
MAX_CHANGE_MESSAGE_CHARS = 512
MAX_CHANGES = 8

Count = Annotated[int, Field(ge=0, le=MAX_REPORT_INT)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class InvalidReport(ValueError):
    """A termination message that is a JSON object but not a valid report; says which fields."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class CheckpointRef(_Model):
    """A checkpoint that was verified good (its manifest and sha256 match)."""

    step: Count
    path: str = Field(max_length=MAX_NAME_CHARS, pattern=NO_CONTROL)
    sha256: str = Field(max_length=MAX_NAME_CHARS, pattern=NO_CONTROL)
    precision: Precision


class Counters(_Model):
    overflow_steps: Count = Field(0, alias="overflowSteps")
    non_finite_losses: Count = Field(0, alias="nonFiniteLosses")
    loss_scale: Finite | None = Field(None, alias="lossScale", ge=0)
    #: The training loss at the last log interval (finite only): the job's final loss on success.
    loss: Finite | None = None


class Replay(_Model):
    """What replaying a numeric fault in fp32 found (precision.guard.replaySteps)."""

    #: precision: fp32 stayed finite; data: fp32 went non-finite too; inconclusive: no replay
    #: could be made (no finite weights to start from, or past the time cap).
    verdict: Literal["precision", "data", "inconclusive"]
    #: The first faulting step (0-based index of the optimizer step) and the steps replayed.
    first_step: Count = Field(alias="firstStep")
    steps: Count = 0
    #: Whether the replay began at the last good checkpoint's weights (else: the weights in memory).
    from_checkpoint: bool = Field(False, alias="fromCheckpoint")
    #: The step whose fp32 loss or gradients were non-finite, and its samples (dataset indices,
    #: the offending ranks' shares of the batch; capped).
    offending_step: Count | None = Field(None, alias="offendingStep")
    samples: list[Count] = Field(default_factory=list, max_length=64)
    #: The ranks whose share of that step was non-finite in fp32 (every rank agrees on them;
    #: capped). Empty for a verdict other than data.
    ranks: list[Count] = Field(default_factory=list, max_length=64)
    seconds: Finite = Field(0.0, ge=0)


class Measurement(_Model):
    """What an `auto` attempt measured on its node: seconds per step by precision (None: the step
    went non-finite), what it chose, and whether AMP was slower than fp32 (F6)."""

    step_seconds: dict[str, Annotated[Finite, Field(ge=0)] | None] = Field(default_factory=dict, alias="stepSeconds")
    chosen: Precision
    amp_slower_than_fp32: bool = Field(False, alias="ampSlowerThanFp32")

    @field_validator("step_seconds")
    @classmethod
    def _known_precisions(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        """Keys are precisions the API knows (they become status keys and message text)."""
        unknown = sorted(set(value) - set(get_args(Precision)))
        if unknown:
            raise ValueError(f"not a precision: {unknown[0][:20]!r} (allowed: {', '.join(get_args(Precision))})")
        return value


def amp_slower(chosen: str, step_seconds: dict[str, float | None]) -> bool:
    """F6 as an `auto` attempt's measurement shows it: it chose fp32 though a low precision stayed
    finite (none beat fp32 by launch.AUTO_MARGIN). The trainer's choice sets the report's flag by
    it; the operator reads it off a scrape's chosen precision and step times the same way."""
    return chosen == "fp32" and any(s is not None for p, s in step_seconds.items() if p != "fp32")


#: What an in-place change did: a fallback, a re-promotion, or a smaller micro-batch (out of memory).
ChangeKind = Literal["fallback", "repromote", "microBatch"]


class InPlaceChange(_Model):
    """A change of precision the trainer's processes made in place (spec.precision.inPlace):
    attempt `attempt - 1` ended at `step`, on its fault (`rule`, `message`) for a `fallback`, or
    for its re-promotion (`repromote`: its clean steps, a checkpoint at `step`), or out of device
    memory (`microBatch`: the same precision goes on in the smaller split `microBatch` x
    `gradAccumulation`), and attempt `attempt` trains in `toPrecision` from `startStep` since
    `at`, `recoverySeconds` after the fault was detected (or the re-promotion was due). The
    trainer says it three ways, each checked here: its `precisionChanged` event line, its
    metrics endpoint (metrics.PRECISION_CHANGE) and its termination report."""

    kind: ChangeKind = "fallback"
    attempt: Annotated[int, Field(ge=1, le=MAX_REPORT_INT)]
    step: Count
    start_step: Count = Field(alias="startStep")
    from_precision: Precision = Field(alias="fromPrecision")
    to_precision: Precision = Field(alias="toPrecision")
    rule: str = Field(max_length=64, pattern=r"^[A-Za-z0-9]+$")
    message: str = ""
    recovery_seconds: Finite = Field(alias="recoverySeconds", ge=0, le=MAX_REPORT_INT)
    #: When the new attempt began (Unix seconds, the trainer's clock): where its time is split
    #: from the attempt before it (None: not said; the reader's moment then).
    at: Finite | None = Field(None, ge=0, le=MAX_REPORT_INT)
    #: A `microBatch` change's new split (the same precision, the same samples per step):
    #: samples per micro-batch and micro-batches per optimizer step (None: not said).
    micro_batch: Annotated[int, Field(ge=1, le=MAX_REPORT_INT)] | None = Field(None, alias="microBatch")
    grad_accumulation: Annotated[int, Field(ge=1, le=MAX_REPORT_INT)] | None = Field(None, alias="gradAccumulation")

    @field_validator("message")
    @classmethod
    def _bounded(cls, value: str) -> str:
        return readable(value)[:MAX_CHANGE_MESSAGE_CHARS]


class TerminationReport(_Model):
    reason: Reason
    step: Count = 0
    #: The step this attempt resumed from (0 = fresh start): where the trainer really began.
    #: None: it ended before it got that far (the operator keeps the step it planned).
    start_step: Count | None = Field(None, alias="startStep")
    #: The precision the attempt trained in; None before the trainer knew it (an early error).
    precision: Precision | None = None
    last_good_checkpoint: CheckpointRef | None = Field(None, alias="lastGoodCheckpoint")
    counters: Counters = Field(default_factory=Counters)
    replay: Replay | None = None
    measurement: Measurement | None = None
    #: The attempt's loss-scale history, [step, scale] pairs oldest first (mpjob_contract.timeline).
    loss_scales: list[tuple[int, float]] = Field(default_factory=list, alias="lossScales")
    #: What the attempt skipped as bad data or loss spikes (the quarantine, bounded).
    skipped: Skipped | None = None
    #: A numeric fault's guard rule (faults.GuardRule): what spec.faultPolicy rules on.
    rule: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9]+$")
    message: str = ""
    #: The rank that explains the pod was killed by a signal its launcher did not send: the cause
    #: of its peers' crashes, in other pods too (`codes.explains_first`). None: not so.
    killed_from_outside: bool | None = Field(None, alias="killedFromOutside")
    #: When the trainer knew the attempt ends (Unix seconds, its clock): a fault's detection, before
    #: its fp32 replay. The next attempt's recoverySeconds counts from it.
    ended_at: Finite | None = Field(None, alias="endedAt", ge=0, le=MAX_REPORT_INT)
    #: The attempt's recoverySeconds: a restart's, its predecessor's end to resumed (the launch's
    #: recoveringSince); one begun in place, its change's. None: not a recovery.
    recovery_seconds: Finite | None = Field(None, alias="recoverySeconds", ge=0, le=MAX_REPORT_INT)
    #: The fallbacks the processes made in place before this ending, oldest first.
    precision_changes: list[InPlaceChange] = Field(
        default_factory=list, alias="precisionChanges", max_length=MAX_CHANGES
    )

    @field_validator("reason")
    @classmethod
    def _trainers_own(cls, value: Reason) -> Reason:
        if value not in TRAINER_REASONS:
            allowed = ", ".join(sorted(reason.value for reason in TRAINER_REASONS))
            raise ValueError(f"{value.value} is the cluster's to say, not a trainer's report's: one of {allowed}")
        return value

    @field_validator("loss_scales", mode="before")
    @classmethod
    def _readable_scales(cls, value: object) -> list[tuple[int, float]]:
        """Read tolerantly and bounded: a bad pair is dropped, never the whole report."""
        return timeline.readable_points(value)

    @field_validator("message")
    @classmethod
    def _bounded(cls, value: str) -> str:
        """Cut, not refused: a long traceback is still the trainer's best account of its end."""
        return readable(value)[:MAX_MESSAGE_CHARS]

    @field_validator("precision", mode="before")
    @classmethod
    def _unknown_yet(cls, value: object) -> object:
        """The trainer reports an empty precision before it has resolved one."""
        return None if value == "" else value

    def to_message(self) -> str:
        """Serialize within MAX_REPORT_BYTES, shortening `message` if needed."""
        text = self.model_dump_json(by_alias=True, exclude_none=True)
        if len(text.encode()) <= MAX_REPORT_BYTES:
            return text
        overflow = len(text.encode()) - MAX_REPORT_BYTES + 16
        short = self.message.encode()[: max(0, len(self.message.encode()) - overflow)]
        clipped = self.model_copy(update={"message": short.decode(errors="ignore") + " [...]"})
        text = clipped.model_dump_json(by_alias=True, exclude_none=True)
        scales = clipped.loss_scales
        while len(text.encode()) > MAX_REPORT_BYTES and scales:  # then the oldest loss-scale points
            scales = timeline.first_and_newest(scales, len(scales) // 2)
            clipped = clipped.model_copy(update={"loss_scales": scales})
            text = clipped.model_dump_json(by_alias=True, exclude_none=True)
        cut = MAX_CHANGE_MESSAGE_CHARS
        while len(text.encode()) > MAX_REPORT_BYTES and cut:  # then the in-place changes' messages
            cut //= 2
            changes = [c.model_copy(update={"message": c.message[:cut]}) for c in clipped.precision_changes]
            text = clipped.model_copy(update={"precision_changes": changes}).model_dump_json(
                by_alias=True, exclude_none=True
            )
        return text

    @classmethod
    def parse_message(cls, text: str | None) -> TerminationReport | None:
        """Parse a termination message: None when absent or not one JSON document (a log tail,
        which may hold JSON lines); `InvalidReport`, naming the fields, when it is a JSON object
        that fails the model."""
        if not text or not text.strip().startswith("{"):
            return None
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            if all(error["type"] == "json_invalid" for error in exc.errors()):
                return None
            raise InvalidReport(describe(exc)) from None

    def write(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the report where the container runtime will pick it up."""
        target = Path(path or os.environ.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_message())
        return target


def newest_checkpoint(reports: Sequence[TerminationReport]) -> CheckpointRef | None:
    """The newest last good checkpoint the reports of one attempt's ranks (or pods) name: a DDP
    job's checkpoints are rank 0's to write, so another rank's report names the one it resumed
    from (the ones a sharded job's ranks write together, or go back to together, they all name
    alike). The launcher's fold over a pod's ranks and the operator's reading of its pods take it."""
    named = [r.last_good_checkpoint for r in reports if r.last_good_checkpoint is not None]
    return max(named, key=lambda c: c.step, default=None)


def describe(exc: ValidationError, *, most: int = 3) -> str:
    """'invalid termination report: precision: Input should be ...' for the first few errors,
    each naming its field by its wire name; the offending input shown short (a 3,000-digit
    number is not repeated back)."""
    parts = []
    for error in exc.errors(include_url=False)[:most]:
        where = ".".join(str(part) for part in error["loc"]) or "(report)"
        shown = repr(error.get("input"))
        shown = shown if len(shown) <= 40 else f"{shown[:30]}... ({len(shown)} chars)"
        parts.append(f"{where}: {error['msg']} (got {shown})")
    more = f" (+{exc.error_count() - most} more)" if exc.error_count() > most else ""
    return "invalid termination report: " + "; ".join(parts) + more
