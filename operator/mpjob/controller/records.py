"""What the cache keeps of an attempt Job or a pod (of a FailedCreate Event: create_failures):
the few fields the planner reads, made from raw JSON.

Each is kept only as the child of its controller (mpjob.controller.ownership): a Job of its
MixedPrecisionJob, a pod or a FailedCreate Event of its Job. Labels only narrow the watches; a
pod with a job's labels but another controller is somebody else's. One exception: a pod with no
controller at all, whose Job was deleted leaving it (`kubectl delete job --cascade=orphan`: the
garbage collector removes the ownerReference), names its Job only by the Job controller's labels
(`orphan_owner`); it joins a Job only where the cache holds one of that namespace, name and UID
(`children.py`), and is one of its pods again (`PodRecord.orphan`). Anything
malformed about an object of ours raises `Malformed` (the cache skips that object and says so
once); it never escapes into a watch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mpjob.builders.attempt import JOB_UID_LABEL, SPEC_GENERATION, TRAINER_CONTAINER, attempt_name
from mpjob.controller.capacity import requested_gpus
from mpjob.controller.ownership import Malformed, ObjectRef, controller_of, owner_ref
from mpjob.planning.reconcile import PodView
from mpjob_contract import api
from mpjob_contract.formats import whole_number

Key = tuple[str, str]  # (namespace, MixedPrecisionJob name)

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: With JOB_UID_LABEL, the labels the Job controller puts on every pod of a Job (its generated
#: selector): they stay when the pod's ownerReference goes with an orphaning deletion of the Job.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
#: The container waiting reason that means the pod will never run: the kubelet cannot parse the
#: image's name, and never tries it again.
IMAGE_ERRORS = ("InvalidImageName",)
#: Container waiting reasons while the kubelet cannot pull the image and tries again (a registry
#: that is down, refuses or throttles; a tag not there yet): the pod waits, `PodView.image_error`.
IMAGE_PULL_WAITS = ("ErrImagePull", "ImagePullBackOff")
#: What an ImagePullBackOff message puts before the last pull's error.
BACKOFF_CAUSE = re.compile(r'^Back-off pulling image "[^"]*": ErrImagePull: ')
#: The trainer container's waiting reason while the kubelet cannot make its environment.
CONFIG_ERROR = "CreateContainerConfigError"
#: The PodScheduled condition's reason while the scheduler finds no node for the pod (spec.elastic waits on it).
UNSCHEDULABLE = "Unschedulable"
#: Job conditions that end an attempt's Job, as the Complete/Failed they lead to.
TERMINAL_CONDITIONS = dict(Complete="Complete", SuccessCriteriaMet="Complete", Failed="Failed", FailureTarget="Failed")


# ------------------------------------------------------------------ attempt Jobs


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What of an attempt Job the planner reads: its verdict and whether it is suspended (its pod
    counts are not worth a reconcile: the pods' own events tell their story)."""

    ref: ObjectRef  # what its pods and Events name
    owner: ObjectRef  # its MixedPrecisionJob
    attempt: int
    finished: str | None
    reason: str | None
    suspended: bool
    #: Deleted, but some of its pods are still there (they still stop and checkpoint).
    gone: bool = False
    #: Since when it waits suspended: its Suspended=True condition's time, else its creation's.
    suspended_since: str | None = None
    #: The spec generation it was made from (its annotation; None: unnamed, or not a number).
    generation: int | None = None
    #: Its metadata.creationTimestamp: when the API server made it (`history.made_late`).
    created: str | None = None
    #: Its spec.completions: the workers (pods) it was made with (None: not a count).
    workers: int | None = None

    @property
    def uid(self) -> str:
        return self.ref.uid

    @property
    def key(self) -> Key:
        """The MixedPrecisionJob whose reconcile its changes queue."""
        return self.owner.namespace, self.owner.name

    def news(self, old: JobRecord | None) -> bool:
        """Whether the planner could decide otherwise now (a verdict, a suspension)."""
        return old != self


def job_record(job: dict[str, Any]) -> JobRecord | None:
    """The record of an attempt Job, or None when no MixedPrecisionJob controls it. Its attempt
    is read from its name (`<job>-a<N>`, as the operator made it), not from a label."""
    meta = job.get("metadata") or {}
    owner = owner_ref(meta, api.KIND)
    if owner is None:
        return None
    name = str(meta.get("name", ""))
    attempt = _attempt_of(name, owner.name)
    finished = reason = None
    conditions = (job.get("status") or {}).get("conditions") or []
    for cond in conditions:
        # FailureTarget / SuccessCriteriaMet come first: the Job controller has decided and
        # starts no more pods; the planner still waits for every pod to stop.
        kind = TERMINAL_CONDITIONS.get(cond.get("type"))
        if kind and cond.get("status") == "True" and finished is None:
            finished, reason = kind, cond.get("reason")
    suspension: dict[str, Any] = next(
        (c for c in conditions if (c.get("type"), c.get("status")) == ("Suspended", "True")), {}
    )
    return JobRecord(
        ref=ObjectRef(owner.namespace, "Job", name, uid_of(meta)),
        owner=owner,
        attempt=attempt,
        finished=finished,
        reason=reason,
        suspended=bool((job.get("spec") or {}).get("suspend")),
        suspended_since=suspension.get("lastTransitionTime") or meta.get("creationTimestamp"),
        generation=_generation((meta.get("annotations") or {}).get(SPEC_GENERATION)),
        created=_text(meta.get("creationTimestamp")),
        workers=_count((job.get("spec") or {}).get("completions")),
    )


def _count(said: object) -> int | None:
    """A positive whole count, where it is one."""
    return said if type(said) is int and said > 0 else None


def _generation(said: object) -> int | None:
    """An annotation's generation, where it is one (anybody may edit a Job's annotations)."""
    return whole_number(said) if isinstance(said, str) else None


def _attempt_of(name: str, owner: str) -> int:
    if (attempt := attempt_named(name, owner)) is None:
        raise Malformed(f"the Job's name {name!r} is not an attempt of {owner!r} (<job>-a<N>)")
    return attempt


def attempt_named(name: str, owner: str) -> int | None:
    """The attempt of the MixedPrecisionJob `owner` whose Job is named `name` (`<job>-a<N>`), if any."""
    suffix = name.removeprefix(f"{owner}-a")
    if suffix == name or (index := whole_number(suffix)) is None or attempt_name(owner, index) != name:
        return None
    return int(suffix)


def uid_of(meta: dict[str, Any]) -> str:
    """An object's metadata.uid, which must be there."""
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        raise Malformed("metadata.uid is missing")
    return uid


# ------------------------------------------------------------------ pods


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    owner: ObjectRef  # its Job
    view: PodView
    ip: str | None
    #: Its ownerReference is gone (its Job was deleted leaving it): `owner` is read from its labels.
    orphan: bool = False

    @property
    def trigger(self) -> tuple[Any, ...]:
        """What of a pod the planner acts on: whether it runs, how it ended, whether it goes."""
        v = self.view
        return (
            v.phase == "Running",
            v.alive,
            v.exit_code,
            v.platform_reason,
            v.deleting,
            v.unschedulable_since,
            v.unschedulable_message,
            v.config_error,
            v.image_error,
            v.marked_unready,
            self.orphan,
        )

    @property
    def namespace(self) -> str:
        return self.owner.namespace

    def news(self, old: PodRecord | None) -> bool:
        """A pod that starts running, exits, goes or fails can change a decision (the phase is
        Running only once a trainer runs); a new pending pod or a new IP cannot."""
        if old is None:
            return self.view.phase == "Running" or not self.view.alive
        return old.trigger != self.trigger


def pod_record(pod: dict[str, Any]) -> PodRecord | None:
    """The record of a pod a Job controls, or of one a Job left (`orphan_owner`); None for any other."""
    meta = pod.get("metadata") or {}
    owner, orphan = owner_ref(meta, "Job"), False
    if owner is None and controller_of(meta) is None:
        owner, orphan = orphan_owner(meta), True
    if owner is None:
        return None
    ip = (pod.get("status") or {}).get("podIP")
    return PodRecord(uid_of(meta), owner, pod_view(pod), ip if isinstance(ip, str) else None, orphan=orphan)


def orphan_owner(meta: dict[str, Any]) -> ObjectRef | None:
    """The Job a pod with no controller was made for, as the Job controller's labels name it (in
    the pod's own namespace), or None without both labels. Labels anyone may copy: whose the pod
    is follows only from a Job the cache holds of that very namespace, name and UID."""
    labels = meta.get("labels") or {}
    uid, name = labels.get(JOB_UID_LABEL), labels.get(JOB_NAME_LABEL)
    if not (isinstance(uid, str) and uid and isinstance(name, str) and name):
        return None
    return ObjectRef(str(meta.get("namespace", "")), "Job", name, uid)


def completion_index(meta: dict[str, Any]) -> int:
    """The pod's index in its Indexed Job: the Job controller's annotation, else its label."""
    for source in ("annotations", "labels"):
        value = (meta.get(source) or {}).get(COMPLETION_INDEX)
        if isinstance(value, str) and (index := whole_number(value)) is not None:
            return index
    raise Malformed(f"{COMPLETION_INDEX} is missing or not a number")


def pod_view(pod: dict[str, Any]) -> PodView:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    statuses = [c for c in status.get("containerStatuses") or [] if c.get("name") == TRAINER_CONTAINER]
    state = (statuses[0].get("state") or {}) if statuses else {}
    terminated, waiting, running = state.get("terminated"), state.get("waiting"), state.get("running")
    phase = status.get("phase") or "Pending"
    platform, unschedulable, unplaced = status.get("reason"), None, None  # Evicted, NodeLost, ...
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True" and not platform:
            platform = cond.get("reason") or "DisruptionTarget"
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == UNSCHEDULABLE:
            unschedulable = _text(cond.get("lastTransitionTime")) or ""
            unplaced = _text(cond.get("message"))
    if terminated is not None and terminated.get("reason") == "OOMKilled":
        platform = "OOMKilled"
    if waiting is not None and waiting.get("reason") in IMAGE_ERRORS:
        platform = waiting["reason"]
    return PodView(
        name=str(meta.get("name", "")),
        index=completion_index(meta),
        phase=phase,
        alive=phase in ("Pending", "Running", "Unknown") and terminated is None and platform not in IMAGE_ERRORS,
        exit_code=terminated.get("exitCode") if terminated is not None else None,
        termination_message=terminated.get("message") if terminated is not None else None,
        platform_reason=platform,
        deleting=meta.get("deletionTimestamp") is not None,
        started_at=_text((terminated or running or {}).get("startedAt")),
        finished_at=_text((terminated or {}).get("finishedAt")),
        unschedulable_since=unschedulable,
        unschedulable_message=unplaced,
        config_error=_config_error(waiting),
        image_error=_image_error(waiting),
        node=_text((pod.get("spec") or {}).get("nodeName")),
        marked_unready=_marked_unready(status.get("conditions") or []),
        uid=str(meta.get("uid", "")),
        grace=_grace(meta.get("deletionGracePeriodSeconds")),
        gpus=requested_gpus(pod),
    )


def _config_error(waiting: dict[str, Any] | None) -> str | None:
    """The kubelet's words when the container waits because it cannot make its environment."""
    if waiting is None or waiting.get("reason") != CONFIG_ERROR:
        return None
    return _text(waiting.get("message")) or CONFIG_ERROR


def _image_error(waiting: dict[str, Any] | None) -> str | None:
    """The kubelet's words while it cannot pull the trainer image (or parse its name), the same
    whether it pulls (ErrImagePull) or waits to (ImagePullBackOff, whose message carries the
    last pull's error since Kubernetes 1.31), so a job's condition and Event do not flip with each
    retry."""
    reason = (waiting or {}).get("reason")
    if waiting is None or reason not in (*IMAGE_PULL_WAITS, *IMAGE_ERRORS):
        return None
    return BACKOFF_CAUSE.sub("", _text(waiting.get("message")) or str(reason), count=1)


def _marked_unready(conditions: list[dict[str, Any]]) -> bool:
    """Ready False beside ContainersReady True: only the node lifecycle controller writes the
    one without the other (a kubelet sets both)."""
    states = {c.get("type"): c.get("status") for c in conditions if isinstance(c, dict)}
    return states.get("Ready") == "False" and states.get("ContainersReady") == "True"


def _grace(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
