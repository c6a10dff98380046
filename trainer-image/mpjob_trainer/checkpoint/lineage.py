"""Which of the job's checkpoints an attempt may go on from: those of the run that led to it.

An operator that stalled after writing "attempt N starts" may make attempt N's Job once another
has ended attempt N and started N+1 (operator controller.strays): that stray Job is deleted at
the next reconcile, but while it lived its trainers wrote the job's checkpoints, maybe past the
step N+1 resumed from, in N's precision and data order. It is the same attempt as the real one,
with the same launch: only its Job's UID tells it apart. So on a cluster every checkpoint names
the attempt and the Job that wrote it (manifest `attempt`, `attemptJob`: the UID the Job
controller labels its pods with, ATTEMPT_JOB_ENV), and each launch names the Job every earlier
attempt the job's status holds ran in (AttemptLaunch.lineage, by attempt). A resume or a
rollback passes over a checkpoint written
- by an attempt after its own (a later attempt's Job cannot have run before this one);
- by an earlier attempt from another Job than those the status records for it (its newest, and
  those deleted while it ran and made again in it), or when the status records none (a stray's);
said in a `checkpointOutsideLineage` log line, and never deleted or pruned for it: it stays the
job's, as it was (set aside only where this attempt saves the same step: checkpoint.ownership).
Nor does a stray, which counts the checkpoints of its attempt and the earlier ones as its own,
prune the one the next attempt went on from: no prune deletes the newest another Job wrote.
A checkpoint that names no Job (a local run, a trainer from before), one of the attempt itself
(its Job made again keeps its place), and one of an attempt the status no longer holds (its
history is bounded) are judged as before: the fence costs no good checkpoint of the lineage.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from mpjob_contract.environment import ATTEMPT_JOB_ENV
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer.checkpoint.manifest import Manifest


@dataclass(frozen=True)
class Lineage:
    #: This process's attempt and the UID of its Job (None: it runs in none: nothing is stamped).
    attempt: int = 0
    job: str | None = None
    #: The Jobs each earlier attempt ran in, by attempt (AttemptLaunch.lineage; None: nothing judged).
    earlier: Mapping[int, Sequence[str]] | None = None

    @classmethod
    def of(cls, launch: AttemptLaunch, environ: Mapping[str, str] = os.environ) -> Lineage:
        """The lineage of the attempt `launch` starts, in the Job `environ` names (ATTEMPT_JOB_ENV)."""
        return cls(launch.attempt, environ.get(ATTEMPT_JOB_ENV) or None, launch.lineage)

    def stamp(self, manifest: Manifest) -> Manifest:
        """`manifest` naming this attempt and its Job as its writer (as it is when there is no Job)."""
        return replace(manifest, attempt=self.attempt, attempt_job=self.job) if self.job else manifest

    def later(self, manifest: Manifest) -> bool:
        """Whether a later attempt wrote the checkpoint of `manifest` (judged only where earlier
        ones are): this process is behind the job (a stray itself), never to touch it."""
        written, job = manifest.attempt, manifest.attempt_job
        return self.earlier is not None and written is not None and job is not None and written > self.attempt

    def other_job(self, manifest: Manifest) -> bool:
        """Whether a Job other than this process's wrote the checkpoint of `manifest` (one that names
        no Job too; judged only where this process runs in a Job)."""
        return self.job is not None and manifest.attempt_job != self.job

    def outside(self, manifest: Manifest) -> str | None:
        """Why the checkpoint of `manifest` is not of this attempt's lineage (None: it may be)."""
        written, job = manifest.attempt, manifest.attempt_job
        if self.later(manifest):
            return f"written by attempt {written}, after this attempt {self.attempt}"
        if self.earlier is None or written is None or job is None or written == self.attempt:
            return None
        if written not in self.earlier:
            return None
        recorded = self.earlier[written]
        if job in recorded:
            return None
        ran_in = f"Job{'s' if len(recorded) > 1 else ''} {', '.join(recorded)}" if recorded else "no Job"
        return (
            f"written by Job {job} of attempt {written}, which the job's status records as having run in "
            f"{ran_in}: a stray Job, made after that attempt had ended"
        )


#: A store that stamps nothing and judges nothing (a store opened outside an attempt).
UNJUDGED = Lineage()
