"""A job whose own recoveries restart while its checkpoints stay in the pod: a warning, not an error.

With neither a checkpoint.volume claim nor checkpoint.storage.s3, checkpoints go to the pod's
emptyDir and go with it (`Checkpoint.outlives_pods`): an attempt in a new Job starts at step 0.
A fallback in place (precision.inPlace, the default: the quickstart's) goes on in the same pod,
so such a job is not warned; `precision.inPlace: false` makes every fallback a new Job, and
`elastic` every resize: those jobs start over at each such recovery, and `mpjob validate` says so
(the operator posts it as one Warning Event per generation). Restarts from outside (a
suspension, a preemption, a lost node) can meet any job: its AttemptStarted Event says so then.
`mpjob run` keeps checkpoints in a folder on disk: it is never warned.
"""

from __future__ import annotations

from mpjob_contract.spec import MixedPrecisionJobSpec


def checkpoints_in_pod(spec: MixedPrecisionJobSpec) -> str | None:
    """Why the job's own recoveries start over (`spec.checkpoint: why`, worded and given its Event
    reason by mpjob_contract.spec_warnings), or None: the checkpoints outlive the pods, or the
    spec makes no recovery a new Job of its own."""
    if spec.checkpoint.outlives_pods:
        return None
    restarts = [
        *(["precision.inPlace is false (each fallback is a new Job)"] if not spec.precision.in_place else []),
        *(["elastic is set (each resize is a new Job)"] if spec.elastic is not None else []),
    ]
    if not restarts:
        return None
    return (
        "checkpoints are kept in the pod (emptyDir) and go with it, and "
        f"{' and '.join(restarts)}: such a recovery starts over at step 0; set "
        "checkpoint.volume.persistentVolumeClaim or checkpoint.storage.s3 to resume from a checkpoint"
    )
