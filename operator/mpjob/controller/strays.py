"""Stray attempt Jobs: one this job controls, made for an attempt its status has ended, whose
recorded Job (`status.attempts[].jobUid`) is another one, or none while the Job's own
creationTimestamp is later than the attempt's finishTime (`history.strays`, `history.made_late`).

Status writes are fenced (a write planned from an older read is refused), but a Job's create is
not: an operator that wrote "attempt N starts", stalled before it made attempt N's Job, and woke
once another had ended attempt N (and perhaps removed its Job) would make it then, and two
trainers would write the job's checkpoints. Whichever operator reconciles the job next deletes
it: with its UID as a precondition (a Job made again under that name since is not touched), its
pods, Service and NetworkPolicy going with it in the background, as every attempt Job's do, once
(this process remembers what it asked until the cache no longer holds that Job), said in a
Warning Event `StrayJobDeleted` naming it. Only Jobs the cache holds are considered: those whose
controller is this very MixedPrecisionJob (namespace, kind, name and UID), never another's.
What its trainers wrote meanwhile (or on the SIGTERM its deletion sends) stays in the job's
checkpoint folder but is never resumed from: each checkpoint names its writer's Job, and each
launch the Jobs the status records for the earlier attempts (`history.lineage`; the trainer's
checkpoint.lineage), which a stray's never is.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from mpjob.builders.attempt import attempt_name
from mpjob.controller.cluster import Cluster
from mpjob.controller.records import Key
from mpjob.planning.plan import Event
from mpjob.planning.status import ConditionReason

log = logging.getLogger("mpjob.operator")


class StrayJobs:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        #: By job: the UIDs of the stray Jobs whose deletion this process asked for, while held.
        self.asked: dict[Key, set[str]] = {}

    def delete(self, key: Key, strays: Mapping[int, str], *, held: Collection[str]) -> list[Event]:
        """Delete the job `key`'s stray Jobs (`strays`: attempt -> UID) not asked for already
        (`held`: the UIDs of its Jobs the cache holds; one it no longer holds is forgotten);
        the Events that say each one deleted (a Job gone already, or of another UID, is not)."""
        namespace, job = key
        asked = {uid for uid in self.asked.get(key, ()) if uid in held}
        said: list[Event] = []
        for index, uid in sorted(strays.items()):
            if uid in asked:
                continue
            deleted = self.cluster.delete_job(namespace, job, index=index, uid=uid)
            asked.add(uid)
            if deleted:
                name = attempt_name(job, index)
                log.warning("%s/%s: deleted Job %s (uid %s) of attempt %d, which had ended", *key, name, uid, index)
                said.append(Event("Warning", ConditionReason.STRAY_JOB_DELETED, _message(name, uid, index)))
        if asked:
            self.asked[key] = asked
        else:
            self.asked.pop(key, None)
        return said

    def forget(self, key: Key) -> None:
        """The job `key` is gone."""
        self.asked.pop(key, None)


def _message(name: str, uid: str, index: int) -> str:
    return (
        f"Job {name} (uid {uid}) deleted, its pods with it: attempt {index} had ended and the status records "
        "another Job for it, or none and the Job was made after it ended (by an operator acting on an older "
        "status); its trainers would have written the job's checkpoints beside the running attempt's"
    )
