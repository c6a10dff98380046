"""What the cache keeps of a FailedCreate Event: the Job controller could not create a pod of an
attempt Job (a quota, an admission webhook), in its words, kept as the child of that Job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpjob.controller.ownership import Malformed, ObjectRef
from mpjob.controller.records import uid_of


@dataclass(frozen=True, slots=True)
class CreateFailure:
    """The Job controller could not create a pod of a Job (its FailedCreate Event)."""

    uid: str  # the Event's
    owner: ObjectRef  # the Job it is about
    message: str

    @property
    def namespace(self) -> str:
        return self.owner.namespace


def create_failure(event: dict[str, Any]) -> CreateFailure | None:
    """The FailedCreate of a Job that `event` reports, or None for any other Event (or one about
    an object of another namespace: the Job controller reports in the Job's own)."""
    involved = event.get("involvedObject") or {}
    if event.get("reason") != "FailedCreate" or involved.get("kind") != "Job":
        return None
    job_uid, job_name = involved.get("uid"), involved.get("name")
    if not isinstance(job_uid, str) or not job_uid or not isinstance(job_name, str) or not job_name:
        raise Malformed("involvedObject.uid or .name is missing")
    meta = event.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    if involved.get("namespace") not in (None, "", namespace):
        return None
    message = str(event.get("message") or "the Job controller could not create a pod")[:1024]
    return CreateFailure(uid_of(meta), ObjectRef(namespace, "Job", job_name, job_uid), message)
