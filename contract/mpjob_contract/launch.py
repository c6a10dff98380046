"""What the operator (or the local runner) tells one trainer process about its attempt.

The operator writes it as JSON into the `MPJOB_LAUNCH` environment variable of the trainer
container; the local runner does the same for its child processes. `mpjob-trainer --launch
FILE` reads it from a file instead.

`resumeFrom` comes, through the planner, from a trainer's termination report: it is held to
the attempt's checkpoint directory here, where both sides build or read a launch.
"""

from __future__ import annotations

import posixpath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mpjob_contract.api import MixedPrecisionJobSpec

LAUNCH_ENV = "MPJOB_LAUNCH"
#: Where the checkpoint volume is mounted in trainer pods.
CHECKPOINT_MOUNT = "/var/lib/mpjob/checkpoints"

ConcretePrecision = Literal["fp16", "bf16", "fp32", "auto"]


def inside_checkpoint_dir(path: str, checkpoint_dir: str) -> bool:
    """Whether `path` names something below `checkpoint_dir`, judged on the names (`..`
    resolved; both absolute or both relative). Links inside the volume are its owner's."""
    if "\0" in path or posixpath.isabs(path) != posixpath.isabs(checkpoint_dir):
        return False
    relative = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(checkpoint_dir))
    return relative != "." and relative != ".." and not relative.startswith("../")


class AttemptLaunch(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    job_name: str = Field(alias="jobName")
    namespace: str = "default"
    attempt: int = Field(0, ge=0)
    #: Precision of this attempt; "auto" lets the trainer pick from the device it finds.
    precision: ConcretePrecision
    #: Checkpoint directory to resume from; None means "newest valid one in checkpointDir".
    resume_from: str | None = Field(None, alias="resumeFrom")
    checkpoint_dir: str = Field(CHECKPOINT_MOUNT, alias="checkpointDir")
    spec: MixedPrecisionJobSpec

    @model_validator(mode="after")
    def _resume_inside_checkpoints(self) -> AttemptLaunch:
        if self.resume_from is not None and not inside_checkpoint_dir(self.resume_from, self.checkpoint_dir):
            raise ValueError(
                f"resumeFrom {self.resume_from!r} is not inside checkpointDir {self.checkpoint_dir!r}: "
                "an attempt resumes only from a checkpoint in its own checkpoint volume"
            )
        return self

    def to_env(self) -> str:
        return self.model_dump_json(by_alias=True)
