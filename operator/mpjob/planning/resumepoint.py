"""Where an attempt that follows another resumes: the checkpoint the status names, when the new
attempt can reach it.

An attempt begun in place goes on in the same processes, from the step its trainer restored. One
in new pods (a new Job: a fallback through a restart, a resume after a suspension, a preemption,
a resize, a lost node) reaches its predecessor's checkpoints only where they outlive the pods
(`Checkpoint.outlives_pods`: a claim or a bucket); the default emptyDir goes with them, so the
new attempt is planned from step 0 and says why. The local runner's folder on disk outlives its
processes: it says so (`outlive`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason

#: What an attempt in new pods says when its predecessor's checkpoints went with the old pods.
POD_CHECKPOINTS = "starting over: checkpoints were kept in the pod (emptyDir)"


@dataclass(frozen=True)
class ResumePoint:
    step: int
    path: str | None = None
    #: The status names a checkpoint the next attempt cannot reach (it went with the pods).
    lost: bool = False


def resume_point(
    status: MixedPrecisionJobStatus,
    spec: MixedPrecisionJobSpec,
    *,
    resumed_at: int | None = None,
    outlive: bool | None = None,
) -> ResumePoint:
    """Where the next attempt resumes: the status's last checkpoint, or `resumed_at`, the step the
    trainer went on from already (a change in place, in the same processes), which the status may
    not have seen yet. An attempt in new processes (`resumed_at` None) starts over when the
    checkpoints did not outlive the old ones (`outlive`; None: as the spec's storage says)."""
    ckpt = status.last_checkpoint
    if resumed_at is not None and resumed_at != (ckpt.step if ckpt else 0):
        return ResumePoint(resumed_at)  # no Job starts from it: the trainer has restored it
    kept = spec.checkpoint.outlives_pods if outlive is None else outlive
    if ckpt is None:  # a suspension that trained took the checkpoints in its pods with them
        return ResumePoint(0, lost=resumed_at is None and not kept and _trained_then_suspended(status))
    if resumed_at is None and not kept and ckpt.step > 0:
        return ResumePoint(0, lost=True)
    return ResumePoint(ckpt.step, ckpt.path)


def went_with_pods(status: MixedPrecisionJobStatus, spec: MixedPrecisionJobSpec) -> bool:
    """The running attempt ends with its Job deleted (a suspension, runPolicy.activeDeadlineSeconds):
    checkpoints kept in its pods (`Checkpoint.outlives_pods` false) go with them, so the status
    names none (it would promise a step no attempt can reach; a resume starts over: `lost`).
    Whether the job had trained to a step that is lost so."""
    if spec.checkpoint.outlives_pods:
        return False
    status.last_checkpoint = None
    return bool(status.step)


def suspended(status: MixedPrecisionJobStatus, spec: MixedPrecisionJobSpec) -> str:
    """The running attempt is suspended (`went_with_pods`): what the Suspended condition adds, ''
    where nothing is lost."""
    return f"; {POD_CHECKPOINTS}: a resume starts at step 0" if went_with_pods(status, spec) else ""


def _trained_then_suspended(status: MixedPrecisionJobStatus) -> bool:
    """Whether the newest attempt was suspended past step 0 (its trainer checkpoints on SIGTERM)."""
    newest = status.attempts[-1] if status.attempts else None
    return newest is not None and newest.reason == Reason.SUSPENDED.value and bool(newest.end_step)


def started_over(status: MixedPrecisionJobStatus, attempt: AttemptStatus) -> None:
    """`attempt`'s pods are made anew (its Job created again after a deletion, or admitted again
    by its queue) over checkpoints that went with the old ones: its trainers start at step 0, and
    their own start line is taken again (`observe`), and the status names no checkpoint, as for a
    new attempt planned from step 0 (`lifecycle.begin`, `lost`): the new pods' checkpoints, below
    the old one, are then recorded."""
    attempt.start_step = 0
    attempt.start_step_reported = None
    status.last_checkpoint = None


def planned_from(step: int, lost: bool) -> str:
    """Where an attempt is planned to go on from, for an Event: the checkpoint, or why not one."""
    if lost:
        return POD_CHECKPOINTS
    return f"to resume from checkpoint step {step}" if step else ""
