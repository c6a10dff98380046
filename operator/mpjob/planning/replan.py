"""An attempt whose pods never started, made again from an edited spec.

The PodsScheduled condition (and a pod held by CreateContainerConfigError or an image it cannot
pull) names the field of the spec to change: resources.gpusPerWorker, template.nodeSelector, a
claim's name, spec.image. An edit
reaches the next attempt, but an attempt whose pods wait for a node never ends, so before, the
edit was read and nothing happened until the job was suspended and resumed. Now the Job of such
an attempt, made from an older generation of the spec (its annotation) while none of its pods
has started its trainer, is deleted: the next reconcile makes it again in the same attempt from
the spec as it is (`reconcile._create`), uncharged, as a Job deleted by hand while Pending.
Level-triggered: an operator that restarts in between reads the same from the Job.
"""

from __future__ import annotations

from mpjob.planning import lifecycle as lc
from mpjob.planning.endings import JobView
from mpjob.planning.plan import Plan, When
from mpjob.planning.status import ConditionReason


def stale(job: JobView, generation: int | None) -> bool:
    """Whether `job` was made from an older spec than `generation`, waits with some pod held
    (no node for it, its container cannot be made or its image pulled) and has not started a
    trainer anywhere."""
    if job.finished is not None or job.suspended or job.generation is None or generation is None:
        return False
    held = any(p.alive and (p.unschedulable_since is not None or p.config_error or p.image_error) for p in job.pods)
    started = any(p.started_at is not None for p in job.pods)
    return held and not started and job.generation < generation


def remake(plan: Plan, job: JobView, when: When) -> None:
    """Delete the attempt's Job, to be made again from the spec of `when.generation`."""
    plan.delete.append(job.index)
    message = (
        f"attempt {plan.status.attempts[-1].index}'s pods never started and the spec changed "
        f"(generation {job.generation} -> {when.generation}): its Job is made again from it, in the same attempt"
    )
    plan.events.append(lc.Event("Normal", ConditionReason.JOB_RECREATED, message))
