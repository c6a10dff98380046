"""The JSON termination report the trainer writes before exiting non-zero.

Kubernetes keeps at most 4096 bytes of a container's termination message; `to_message`
keeps the report well under that by shortening the human message first.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mpjob_contract.codes import Reason
from mpjob_contract.environment import DEFAULT_TERMINATION_LOG, MAX_REPORT_BYTES, TERMINATION_LOG_ENV

__all__ = [
    "DEFAULT_TERMINATION_LOG",
    "MAX_REPORT_BYTES",
    "TERMINATION_LOG_ENV",
    "CheckpointRef",
    "Counters",
    "Measurement",
    "Replay",
    "TerminationReport",
]


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class CheckpointRef(_Model):
    """A checkpoint that was verified good (its manifest and sha256 match)."""

    step: int
    path: str
    sha256: str
    precision: str


class Counters(_Model):
    overflow_steps: int = Field(0, alias="overflowSteps")
    non_finite_losses: int = Field(0, alias="nonFiniteLosses")
    loss_scale: float | None = Field(None, alias="lossScale")
    #: The training loss at the last log interval (finite only): the job's final loss on success.
    loss: float | None = None


class Replay(_Model):
    """What replaying a numeric fault in fp32 found (precision.guard.replaySteps)."""

    #: precision: fp32 stayed finite; data: fp32 went non-finite too; inconclusive: no replay
    #: could be made (no finite weights to start from, or past the time cap).
    verdict: str
    #: The first faulting step (0-based index of the optimizer step) and the steps replayed.
    first_step: int = Field(alias="firstStep")
    steps: int = 0
    #: Whether the replay began at the last good checkpoint's weights (else: the weights in memory).
    from_checkpoint: bool = Field(False, alias="fromCheckpoint")
    #: The step whose fp32 loss or gradients were non-finite, and its samples (dataset indices,
    #: this process's share of the batch; capped).
    offending_step: int | None = Field(None, alias="offendingStep")
    samples: list[int] = Field(default_factory=list, max_length=64)
    seconds: float = 0.0


class Measurement(_Model):
    """What an `auto` attempt measured on its node: seconds per step by precision (None: the step
    went non-finite), what it chose, and whether AMP was slower than fp32 (F6)."""

    step_seconds: dict[str, float | None] = Field(default_factory=dict, alias="stepSeconds")
    chosen: str
    amp_slower_than_fp32: bool = Field(False, alias="ampSlowerThanFp32")


class TerminationReport(_Model):
    reason: Reason
    step: int = 0
    #: The step this attempt resumed from (0 = fresh start): where the trainer really began.
    #: None: it ended before it got that far (the operator keeps the step it planned).
    start_step: int | None = Field(None, alias="startStep")
    precision: str = ""
    last_good_checkpoint: CheckpointRef | None = Field(None, alias="lastGoodCheckpoint")
    counters: Counters = Field(default_factory=Counters)
    replay: Replay | None = None
    measurement: Measurement | None = None
    message: str = ""

    def to_message(self) -> str:
        """Serialize within MAX_REPORT_BYTES, shortening `message` if needed."""
        text = self.model_dump_json(by_alias=True, exclude_none=True)
        if len(text.encode()) <= MAX_REPORT_BYTES:
            return text
        overflow = len(text.encode()) - MAX_REPORT_BYTES + 16
        short = self.message.encode()[: max(0, len(self.message.encode()) - overflow)]
        clipped = self.model_copy(update={"message": short.decode(errors="ignore") + " [...]"})
        return clipped.model_dump_json(by_alias=True, exclude_none=True)

    @classmethod
    def parse_message(cls, text: str | None) -> TerminationReport | None:
        """Parse a termination message; None when absent or not a report."""
        if not text or not text.strip().startswith("{"):
            return None
        try:
            return cls.model_validate_json(text)
        except ValueError:
            return None

    def write(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the report where the container runtime will pick it up."""
        target = Path(path or os.environ.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_message())
        return target
