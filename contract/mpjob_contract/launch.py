"""What the operator (or the local runner) tells one trainer process about its attempt.

The operator writes it as JSON into the `MPJOB_LAUNCH` environment variable of the trainer
container; the local runner does the same for its child processes. `mpjob-trainer --launch
FILE` reads it from a file instead.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mpjob_contract.api import MixedPrecisionJobSpec

LAUNCH_ENV = "MPJOB_LAUNCH"
#: Where the checkpoint volume is mounted in trainer pods.
CHECKPOINT_MOUNT = "/var/lib/mpjob/checkpoints"

ConcretePrecision = Literal["fp16", "bf16", "fp32", "auto"]


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

    def to_env(self) -> str:
        return self.model_dump_json(by_alias=True)
