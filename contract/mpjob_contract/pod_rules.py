"""The pod API's rules between a toleration's fields, between the template's volumes and mounts
and the ones the operator adds (mpjob_contract.pod_volumes), and between the template's
annotations and the pod's securityContext the operator sets, as cross-field rules of the
API (the table is mpjob_contract.rules): the API server refuses them only when the Job
controller creates the pod, long after the job was accepted (the job then fails after
runPolicy.podCreationTimeoutSeconds). A toleration's single fields (key, value, operator,
effect) are held by the template's Kubernetes schemas (mpjob.k8s_openapi.VALUE_RULES), which
also bound the strings these rules compare, and the template's lists of volumes and mounts are
bounded (mpjob.k8s_openapi.COST_BOUNDS), so their CEL stays within the API server's budget.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mpjob_contract.cel import Rule
from mpjob_contract.pod_volumes import CHECKPOINT_MOUNT, CHECKPOINT_VOLUME, SHM_MOUNT, SHM_VOLUME, adds_shared_memory

#: Where each toleration's, template volume's and volume mount's rules sit.
TOLERATION = "spec.template.tolerations[]"
VOLUME, VOLUME_MOUNT = "spec.template.volumes[]", "spec.template.volumeMounts[]"


def _field(toleration: Any, name: str) -> Any:
    return toleration.get(name) if isinstance(toleration, Mapping) else None


TOLERATION_SECONDS_NEED_NO_EXECUTE = Rule(
    name="toleration-seconds-need-no-execute",
    path=TOLERATION,
    cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
    message="template.tolerations[].effect must be NoExecute when tolerationSeconds is set: only a NoExecute "
    "taint evicts a running pod, after tolerationSeconds",
    holds=lambda t: _field(t, "tolerationSeconds") is None or _field(t, "effect") == "NoExecute",
    field_path=".effect",
)
TOLERATION_EMPTY_KEY_EXISTS = Rule(
    name="toleration-empty-key-exists",
    path=TOLERATION,
    cel="(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
    message="template.tolerations[].operator must be Exists when key is empty (a toleration of every taint); "
    "name the taint's key to match a value",
    holds=lambda t: bool(_field(t, "key")) or _field(t, "operator") == "Exists",
    field_path=".operator",
)
TOLERATION_EXISTS_WITHOUT_VALUE = Rule(
    name="toleration-exists-without-value",
    path=TOLERATION,
    cel="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
    message="template.tolerations[].value must be empty when operator is Exists (it matches every value of "
    "the key); use operator Equal to match this value",
    holds=lambda t: _field(t, "operator") != "Exists" or not _field(t, "value"),
    field_path=".value",
)
#: A toleration's rules, in the order the CRD lists them.
TOLERATION_RULES = (TOLERATION_SECONDS_NEED_NO_EXECUTE, TOLERATION_EMPTY_KEY_EXISTS, TOLERATION_EXISTS_WITHOUT_VALUE)

TEMPLATE_VOLUME_NOT_CHECKPOINTS = Rule(
    name="template-volume-not-checkpoints",
    path=VOLUME,
    cel=f"self.name != '{CHECKPOINT_VOLUME}'",
    message=f"template.volumes[].name must not be {CHECKPOINT_VOLUME}: the operator adds its checkpoint volume "
    "(checkpoint.volume) to every trainer pod under that name; name yours otherwise (mount the checkpoint "
    f"volume elsewhere with a template.volumeMounts entry named {CHECKPOINT_VOLUME})",
    holds=lambda volume: _field(volume, "name") != CHECKPOINT_VOLUME,
    field_path=".name",
)


def _same_directory(path: str) -> str:
    """A regex of the absolute `path` however it is spelled: `/` doubled, `.` segments between
    and after. RE2 (CEL) and Python read it alike (no backslash: a CEL string would take it as
    an escape); unanchored, as `re.fullmatch` takes it."""
    literal = "".join(c if c.isalnum() else f"[{c}]" for c in path.strip("/"))
    return "/([.]?/)*" + literal.replace("[/]", "/([.]?/)*") + "(/[.]?)*"


#: The checkpoint mount as a mountPath may spell it: the pod API compares mountPaths as written,
#: so `/var/lib/mpjob/checkpoints/` would pass it and put a second volume on the checkpoint mount.
AT_CHECKPOINT_MOUNT = _same_directory(CHECKPOINT_MOUNT)
MOUNT_NOT_AT_CHECKPOINTS = Rule(
    name="mount-not-at-checkpoints",
    path=VOLUME_MOUNT,
    cel=f"!self.mountPath.matches('^{AT_CHECKPOINT_MOUNT}$')",
    message=f"template.volumeMounts[].mountPath must not be {CHECKPOINT_MOUNT} (however spelled): the operator "
    "mounts the checkpoint volume there; mount yours elsewhere (below it is fine)",
    holds=lambda mount: re.fullmatch(AT_CHECKPOINT_MOUNT, str(_field(mount, "mountPath"))) is None,
    field_path=".mountPath",
)
#: The deprecated seccomp annotations the pod API compares with the pod's and the trainer container's
#: seccompProfile, which the operator sets to RuntimeDefault (mpjob.builders.attempt), and the values
#: it takes for RuntimeDefault. A named key is a lookup, within the CEL budget on a map of any size.
SECCOMP_ANNOTATIONS = (
    "seccomp.security.alpha.kubernetes.io/pod",
    "container.seccomp.security.alpha.kubernetes.io/trainer",
)
RUNTIME_DEFAULT_SECCOMP = ("runtime/default", "docker/default")
TEMPLATE_SECCOMP_RUNTIME_DEFAULT = Rule(
    name="template-seccomp-runtime-default",
    path="spec.template",
    cel="!has(self.annotations) || "
    + " && ".join(
        f"(!('{key}' in self.annotations) || self.annotations['{key}'] in {list(RUNTIME_DEFAULT_SECCOMP)})"
        for key in SECCOMP_ANNOTATIONS
    ),
    message=f"template.annotations {' and '.join(SECCOMP_ANNOTATIONS)} may only be runtime/default (or "
    "docker/default, its former name): the operator gives the trainer pod and its container the RuntimeDefault "
    "seccomp profile, and the pod API refuses a seccomp annotation that names another; leave them out",
    holds=lambda template: all(
        (_field(template, "annotations") or {}).get(key, RUNTIME_DEFAULT_SECCOMP[0]) in RUNTIME_DEFAULT_SECCOMP
        for key in SECCOMP_ANNOTATIONS
    ),
    field_path=".annotations",
    reason="FieldValueForbidden",
)
#: The deprecated AppArmor annotation of the trainer container, which the API server still applies, and
#: the profiles the pod API takes there: the container runtime's default, none, one loaded on the node, or
#: empty (the annotation then sets nothing).
TRAINER_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/trainer"
APPARMOR_PROFILES, APPARMOR_LOCALHOST = ("runtime/default", "unconfined", ""), "localhost/"
TEMPLATE_APPARMOR_PROFILE_NAME = Rule(
    name="template-apparmor-profile-name",
    path="spec.template",
    cel=f"!has(self.annotations) || !('{TRAINER_APPARMOR_ANNOTATION}' in self.annotations) || "
    f"self.annotations['{TRAINER_APPARMOR_ANNOTATION}'] in {list(APPARMOR_PROFILES)} || "
    f"self.annotations['{TRAINER_APPARMOR_ANNOTATION}'].startsWith('{APPARMOR_LOCALHOST}')",
    message=f"template.annotations {TRAINER_APPARMOR_ANNOTATION} must name an AppArmor profile as the pod API "
    "takes it: runtime/default, unconfined, localhost/<a profile loaded on the node>, or empty",
    holds=lambda template: _apparmor_profile((_field(template, "annotations") or {}).get(TRAINER_APPARMOR_ANNOTATION)),
    field_path=".annotations",
)


def _apparmor_profile(value: Any) -> bool:
    return value is None or value in APPARMOR_PROFILES or str(value).startswith(APPARMOR_LOCALHOST)


#: The labels the Job controller puts on an attempt's pods, its Job's name and UID (the Job's selector):
#: the Job API refuses a pod template that sets one to another value, and each attempt is a new Job.
JOB_CONTROLLER_LABELS = (
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "controller-uid",
    "job-name",
)
TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS = Rule(
    name="template-labels-not-the-job-controllers",
    path="spec.template",
    cel="!has(self.labels) || " + " && ".join(f"!('{key}' in self.labels)" for key in JOB_CONTROLLER_LABELS),
    message=f"template.labels must not set {', '.join(JOB_CONTROLLER_LABELS)}: the Job controller labels each "
    "attempt's pods with them (the attempt Job's name and UID, its selector), and the Job API refuses a template "
    "that sets them; name your labels otherwise",
    holds=lambda template: not set(_field(template, "labels") or {}) & set(JOB_CONTROLLER_LABELS),
    field_path=".labels",
    reason="FieldValueForbidden",
)
#: The rules on the template's own maps (its labels and annotations), in the order the CRD lists them.
TEMPLATE_RULES = (
    TEMPLATE_SECCOMP_RUNTIME_DEFAULT,
    TEMPLATE_APPARMOR_PROFILE_NAME,
    TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS,
)
#: A toleration's, a template volume's and a volume mount's rules, by template field.
ITEM_RULES: dict[str, tuple[Rule, ...]] = {
    "tolerations": TOLERATION_RULES,
    "volumes": (TEMPLATE_VOLUME_NOT_CHECKPOINTS,),
    "volumeMounts": (MOUNT_NOT_AT_CHECKPOINTS,),
}


def unknown_mount(spec: Mapping[str, Any]) -> int | None:
    """The first template mount (of the wire-form spec) that names no volume of the pod, or None:
    a volume of the template, the operator's checkpoint volume, or its /dev/shm when it adds one."""
    template, gpus = spec.get("template") or {}, (spec.get("resources") or {}).get("gpusPerWorker", 1)
    mounts, volumes = template.get("volumeMounts") or [], template.get("volumes") or []
    known = {volume.get("name") for volume in volumes} | {CHECKPOINT_VOLUME}
    if adds_shared_memory(gpus, mounts, volumes):
        known.add(SHM_VOLUME)
    return next((i for i, mount in enumerate(mounts) if mount.get("name") not in known), None)


_GPUS = "(has(self.resources) && has(self.resources.gpusPerWorker) ? self.resources.gpusPerWorker : 1)"
_MOUNTS, _VOLUMES = "self.template.volumeMounts", "self.template.volumes"
MOUNT_NAMES_A_VOLUME = Rule(
    name="mount-names-a-volume",
    path="spec",
    cel=f"!has(self.template) || !has({_MOUNTS}) || {_MOUNTS}.all(m, m.name == '{CHECKPOINT_VOLUME}' || "
    f"(has({_VOLUMES}) && {_VOLUMES}.exists(v, v.name == m.name)) || (m.name == '{SHM_VOLUME}' && {_GPUS} > 0 "
    f"&& !{_MOUNTS}.exists(n, n.mountPath == '{SHM_MOUNT}')))",
    message="template.volumeMounts[].name must name a volume of the pod: one of template.volumes, "
    f"{CHECKPOINT_VOLUME} (the checkpoint volume) or, in a GPU pod whose template mounts nothing at {SHM_MOUNT}, "
    f"{SHM_VOLUME} (the operator's shared memory)",
    holds=lambda spec: unknown_mount(spec) is None,
    field_path=".template.volumeMounts",
    item=lambda spec: f"[{unknown_mount(spec)}]",
)
#: The pod API's rules, in the order the CRD lists them at a path (mpjob_contract.rules.RULES holds them).
POD_RULES = (
    *TOLERATION_RULES,
    TEMPLATE_VOLUME_NOT_CHECKPOINTS,
    MOUNT_NOT_AT_CHECKPOINTS,
    MOUNT_NAMES_A_VOLUME,
    *TEMPLATE_RULES,
)
