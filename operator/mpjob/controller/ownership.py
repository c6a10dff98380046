"""Whether an object is this operator's: the ownership rules its cache and its writes share.

An object is an attempt's child only by its controller ownerReference, read as an `ObjectRef`:
the child's own namespace with its controller's kind, name and UID. A Job belongs to the
MixedPrecisionJob of the same namespace, name and UID; a pod, or a FailedCreate Event, to the Job
of the same namespace, name and UID. All four are compared, never the UID alone: a UID is no
secret (anyone who may read the Job sees it), and an ownerReference names no namespace, so a pod
in another namespace whose controller reference copies a Job's name and UID is somebody else's.
An existing object of a child's name is claimed (`claim`) the same way before it is adopted or
deleted. Anything malformed about an object of ours raises `Malformed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Malformed(ValueError):
    """A field of an object of ours that the planner needs cannot be read."""


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """An object as a join compares it: namespace, kind, name and UID. A child names its
    controller with its own namespace (ownerReferences cannot cross namespaces), so a child
    belongs to an object exactly when the child's `owner` equals the object's `ref`."""

    namespace: str
    kind: str
    name: str
    uid: str


def owner_ref(meta: dict[str, Any], kind: str) -> ObjectRef | None:
    """The object's controller as an `ObjectRef` in the object's own namespace, or None when it
    has no controller of `kind`."""
    owner = controller_of(meta)
    if owner is None or owner.kind != kind:
        return None
    return ObjectRef(str(meta.get("namespace", "")), owner.kind, owner.name, owner.uid)


def controller_of(meta: dict[str, Any]) -> Owner | None:
    """The object's controller ownerReference (None: it has none)."""
    refs = meta.get("ownerReferences") or []
    if not isinstance(refs, list):
        raise Malformed("metadata.ownerReferences is not a list")
    for ref in refs:
        if isinstance(ref, dict) and ref.get("controller") is True:
            kind, name, uid = ref.get("kind"), ref.get("name"), ref.get("uid")
            if not (isinstance(kind, str) and isinstance(name, str) and isinstance(uid, str)):
                raise Malformed("metadata.ownerReferences: the controller reference lacks kind, name or uid")
            return Owner(kind, name, uid)
    return None


class Claim(StrEnum):
    """Whose an existing object of a child's name is."""

    OURS = "Ours"
    #: A same-named job's child from before it was deleted and created again: the garbage
    #: collector is removing it, so the name frees up soon.
    STALE = "Stale"
    #: Made by somebody else: never adopted, never deleted.
    FOREIGN = "Foreign"


def claim(existing: dict[str, Any], *, owners: dict[str, tuple[str, str]]) -> Claim:
    """Whose `existing` is, for a child whose rightful controllers are `owners` (UID -> (kind,
    name)): ours when its controller is one of them; stale when its controller has the kind and
    name of one of them but another UID; foreign otherwise (no controller, or another)."""
    try:
        owner = controller_of(existing.get("metadata") or {})
    except Malformed:
        return Claim.FOREIGN
    if owner is None:
        return Claim.FOREIGN
    if owners.get(owner.uid) == (owner.kind, owner.name):
        return Claim.OURS
    return Claim.STALE if (owner.kind, owner.name) in owners.values() else Claim.FOREIGN
