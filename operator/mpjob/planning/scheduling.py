"""Pods the scheduler finds no node for: said at once, with the field of the spec to change.

The Job controller made the attempt's pods, but the scheduler leaves them Pending (their
PodScheduled condition False, reason Unschedulable) and says why in its own words ("0/7 nodes
are available: 1 Insufficient nvidia.com/gpu, ..."). Before, the job only said "waiting for its
pods" for as long as that lasted. Now a PodsScheduled=False condition carries the scheduler's
words and the spec's field that asks for what no node has, and a Warning Event says so once
per change. The job keeps waiting (a node may be added, a claim created); the condition turns
True once every pod is placed. An elastic job's short-of-room pods are `waiting.awaiting_workers`'.

A pod placed whose container the kubelet cannot make (CreateContainerConfigError: a Secret,
or a key of one, that is not there) is `unconfigured`: its words and the field naming the
Secret, for `waiting` to show as PodsCreated=False (and fail after podCreationTimeoutSeconds).
One whose image the kubelet cannot pull and tries again (ErrImagePull, ImagePullBackOff: a
registry down or throttling, a tag not pushed yet) is `unpulled`, shown and failed the same way:
before, the first ErrImagePull failed the job for good.
"""

from __future__ import annotations

import re

from mpjob.planning import lifecycle as lc
from mpjob.planning.endings import JobView
from mpjob.planning.plan import Plan, When
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.api import MixedPrecisionJobSpec

#: A claim the scheduler did not find, in its message.
MISSING_CLAIM = re.compile(r'persistentvolumeclaim "([^"]+)" not found')


def claim_field(spec: MixedPrecisionJobSpec, claim: str) -> str:
    """The spec's field that names `claim`: its checkpoint volume's, else the template's volumes."""
    checkpoint = spec.checkpoint
    for field, volume in (
        ("checkpoint.volume", checkpoint.volume),
        ("checkpoint.storage.volume", checkpoint.storage.volume if checkpoint.storage else None),
    ):
        named = volume.persistent_volume_claim if volume is not None else None
        if named is not None and named.claim_name == claim:
            return f"{field}.persistentVolumeClaim.claimName"
    return "template.volumes"


def fix(spec: MixedPrecisionJobSpec, said: str, asked: int = 0) -> str:
    """What to change, naming the spec's field, for the scheduler's message `said` about a pod
    that requests `asked` GPUs (0: not known); "" when it names nothing the spec asks for. The
    scheduler counts each node under the first check it fails: a node short of a resource passed
    the selector and the taints, so that resource is the fix and the other nodes' selector or
    taints are not."""
    hints = []
    if (claim := MISSING_CLAIM.search(said)) is not None:
        field = claim_field(spec, claim.group(1))
        hints.append(
            f"the claim {claim.group(1)!r} ({field}) does not exist in the job's namespace: create it or name one"
        )
    short = []
    if "Insufficient nvidia.com/gpu" in said:
        short.append(gpus_short(spec.resources.gpus_per_worker, asked))
    for resource in ("cpu", "memory"):
        if f"Insufficient {resource}" in said:
            short.append(f"no node has the {resource} resources.requests asks free: lower it")
    hints += short
    if not short and "node affinity/selector" in said:
        hints.append(
            f"no node matches template.nodeSelector={spec.template.node_selector} "
            f"(and resources.minComputeCapability={spec.resources.min_compute_capability}): change them"
        )
    if not short and "untolerated taint" in said:
        hints.append("a node's taint is not in template.tolerations: add a toleration for it")
    return "; ".join(hints)


def gpus_short(gpus: int, asked: int) -> str:
    """The GPU hint, worded from what the pod asks: a pod made before an edit of
    resources.gpusPerWorker (its Job not yet made again from the spec, or a trainer of it already
    started) still asks the old count, and the new one is not what no node has."""
    if asked in (0, gpus):
        return f"no node has resources.gpusPerWorker={gpus} GPUs free: lower it, or add GPU nodes"
    return (
        f"no node has the {asked} GPUs the pod asks free (its Job was made when resources.gpusPerWorker "
        f"was {asked}; the spec's {gpus} is not asked by its pods yet): add GPU nodes"
    )


def unscheduled(plan: Plan, spec: MixedPrecisionJobSpec, *, job: JobView, when: When) -> None:
    """PodsScheduled=False (and a Warning Event once per message) while a pod of the attempt's
    Job waits for a node; True again once none does, where it was False."""
    index = plan.status.attempts[-1].index
    known = next((c for c in plan.status.conditions if c.type == ConditionType.PODS_SCHEDULED), None)
    waiting = sorted((p for p in job.pods if p.alive and p.unschedulable_since is not None), key=lambda p: p.index)
    if not waiting:
        if known is not None and known.status != "True":  # False, or Unknown since a suspension
            message = f"attempt {index}'s pods were scheduled"
            lc.condition(plan, when, ConditionType.PODS_SCHEDULED, True, ConditionReason.PODS_SCHEDULED, message)
        return
    pod = waiting[0]
    said = pod.unschedulable_message or "no reason given"
    hint = fix(spec, said, pod.gpus)
    message = f"attempt {index}: the scheduler finds no node for pod {pod.name}: {said}"
    message = (f"{message}; {hint}" if hint else message)[:1024]
    if known is None or known.status != "False" or known.message != message:
        plan.events.append(lc.Event("Warning", ConditionReason.UNSCHEDULABLE, message))
    lc.condition(plan, when, ConditionType.PODS_SCHEDULED, False, ConditionReason.UNSCHEDULABLE, message)


#: The Secret a kubelet's CreateContainerConfigError names ('secret "x" not found', "couldn't
#: find key K in Secret ns/x").
MISSING_SECRET = re.compile(r'secret "([^"]+)" not found|in Secret [^/\s]+/([^\s"]+)', re.I)


def secret_field(spec: MixedPrecisionJobSpec, secret: str) -> str:
    """The spec's field that names Secret `secret`: the bucket's or the tracking server's
    credentialsSecret, else the template's env."""
    storage = spec.checkpoint.storage
    if storage is not None and storage.s3 is not None and storage.s3.credentials_secret == secret:
        return "checkpoint.storage.s3.credentialsSecret"
    mlflow = spec.tracking.mlflow if spec.tracking is not None else None
    if mlflow is not None and mlflow.credentials_secret == secret:
        return "tracking.mlflow.credentialsSecret"
    return "template.env"


def unconfigured(spec: MixedPrecisionJobSpec, job: JobView) -> str | None:
    """What keeps a pod of the attempt from starting its container, in the kubelet's words and
    naming the spec's field to change; None when no pod is held so."""
    held = next((p for p in sorted(job.pods, key=lambda p: p.index) if p.alive and p.config_error), None)
    if held is None or held.config_error is None:
        return None
    message = f"pod {held.name} cannot start its trainer container: {held.config_error}"
    if (secret := MISSING_SECRET.search(held.config_error)) is not None:
        name = secret.group(1) or secret.group(2)
        message += (
            f"; the Secret {name!r} ({secret_field(spec, name)}) or its key is not in the job's namespace: create it"
        )
    return message[:1024]


def unpulled(spec: MixedPrecisionJobSpec, job: JobView) -> str | None:
    """What keeps a pod of the attempt from pulling its trainer image, in the kubelet's words and
    naming where the image comes from; None when no pod waits so."""
    held = next((p for p in sorted(job.pods, key=lambda p: p.index) if p.alive and p.image_error), None)
    if held is None or held.image_error is None:
        return None
    image = f"spec.image={spec.image!r}" if spec.image else "the operator's default (spec.image unset)"
    return (
        f"pod {held.name} cannot pull its trainer image: {held.image_error}; the image is {image}: check its "
        "name and tag, that its registry answers, and template.imagePullSecrets for a private one"
    )[:1024]
