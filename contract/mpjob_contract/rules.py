"""The MixedPrecisionJob API's cross-field rules, each written once: its CEL and its Python check.

A rule that one field's schema cannot say (exactly one of three fields, distinct list entries,
a field only allowed beside another) is checked twice: by the API server, as CEL in the CRD's
`x-kubernetes-validations`, and by `mpjob validate`/the operator, as a pydantic validator. Both
read this table: `mpjob.crd` emits each rule's CEL at its schema path, and the models in
`mpjob_contract.api` call each rule's `check` and raise with its message, so the two cannot
drift. tests/unit/operator/cases.py holds at least one bad manifest per rule, refused by
`mpjob validate` and by a real API server alike.

A rule's `holds` reads the same `self` as its CEL: the node at `path`, as on the wire (camelCase
names; an unset optional field absent, as `has()` sees it). Single-field bounds (minimum,
maximum, pattern, enum) stay on the models' fields, where the JSON schema carries them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from mpjob_contract.cel import Rule as Rule
from mpjob_contract.cel import Transition
from mpjob_contract.cel import wire_self as wire_self
from mpjob_contract.faults import ACTIONS, Fault, FaultAction, allowed
from mpjob_contract.pod_rules import ITEM_RULES as ITEM_RULES
from mpjob_contract.pod_rules import MOUNT_NAMES_A_VOLUME as MOUNT_NAMES_A_VOLUME
from mpjob_contract.pod_rules import MOUNT_NOT_AT_CHECKPOINTS as MOUNT_NOT_AT_CHECKPOINTS
from mpjob_contract.pod_rules import POD_RULES as POD_RULES
from mpjob_contract.pod_rules import TEMPLATE_APPARMOR_PROFILE_NAME as TEMPLATE_APPARMOR_PROFILE_NAME
from mpjob_contract.pod_rules import TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS as TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS
from mpjob_contract.pod_rules import TEMPLATE_SECCOMP_RUNTIME_DEFAULT as TEMPLATE_SECCOMP_RUNTIME_DEFAULT
from mpjob_contract.pod_rules import TEMPLATE_VOLUME_NOT_CHECKPOINTS as TEMPLATE_VOLUME_NOT_CHECKPOINTS
from mpjob_contract.pod_rules import TOLERATION_EMPTY_KEY_EXISTS as TOLERATION_EMPTY_KEY_EXISTS
from mpjob_contract.pod_rules import TOLERATION_EXISTS_WITHOUT_VALUE as TOLERATION_EXISTS_WITHOUT_VALUE
from mpjob_contract.pod_rules import TOLERATION_RULES as TOLERATION_RULES
from mpjob_contract.pod_rules import TOLERATION_SECONDS_NEED_NO_EXECUTE as TOLERATION_SECONDS_NEED_NO_EXECUTE
from mpjob_contract.vocabulary import SAFETY, safer_than

#: A job's name must leave room for "-a<NN>" (attempt) and "-<index>" (pod hostname)
#: inside a 63-character DNS label.
MAX_NAME_LENGTH = 50
#: The ways to say what to train; a task sets exactly one.
TASK_KINDS = ("builtin", "module", "command")
#: Why a template may not mount a ServiceAccount token (the chart's admission policy says the same).
NO_TOKEN = "not allowed: trainer pods hold no Kubernetes credentials (docs/security.md)"
NO_CERTIFICATE = "not allowed: trainer pods hold no credentials, and a pod certificate is one (docs/security.md)"
#: The job writes its checkpoints to this claim.
READ_ONLY_CLAIM = (
    "checkpoint.volume.persistentVolumeClaim.readOnly must be false: the job writes its checkpoints to this "
    "claim, and a read-only volume cannot hold them"
)


def _distinct(values: Sequence[Any]) -> bool:
    return len(set(values)) == len(values)


NAME_FITS_CHILD_NAMES = Rule(
    name="name-fits-child-names",
    path="",
    cel=f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
    message=f"metadata.name must be at most {MAX_NAME_LENGTH} characters so that every "
    "child name (<name>-a<N>-<index>) fits in 63",
    holds=lambda job: len(job["metadata"]["name"]) <= MAX_NAME_LENGTH,
)
TASK_EXACTLY_ONE_KIND = Rule(
    name="task-exactly-one-kind",
    path="spec.task",
    cel=f"[{', '.join(f'has(self.{kind})' for kind in TASK_KINDS)}].filter(x, x).size() == 1",
    message="exactly one of task.builtin, task.module or task.command must be set",
    holds=lambda task: sum(kind in task for kind in TASK_KINDS) == 1,
)
TASK_WORKING_DIR_NEEDS_COMMAND = Rule(
    name="task-working-dir-needs-command",
    path="spec.task",
    cel="!has(self.workingDir) || has(self.command)",
    message="task.workingDir is only allowed with task.command",
    holds=lambda task: "workingDir" not in task or "command" in task,
)
FALLBACK_DISTINCT = Rule(
    name="fallback-distinct",
    path="spec.precision.fallback",
    cel="self.all(p, self.filter(q, q == p).size() == 1)",
    message="precision.fallback entries must be distinct",
    holds=_distinct,
)
# fp8 is the least safe rung: a job starts there (precision.mode fp8, or auto on a node that
# measures it fastest) and never falls back to it; the ladder would drop it silently.
FALLBACK_NO_FP8 = Rule(
    name="fallback-no-fp8",
    path="spec.precision.fallback",
    cel="self.all(p, p != 'fp8')",
    message="precision.fallback may not hold fp8: a fallback goes to a safer precision and fp8 is the least "
    "safe one; start in fp8 with precision.mode fp8 (or auto), the ladder then goes fp8 -> bf16 -> fp32",
    holds=lambda values: "fp8" not in values,
)


def unsafe_fallback(precision: Mapping[str, Any]) -> int | None:
    """The first entry of spec.precision's fallback that is not safer than the mode and than the
    entries before it, or None. fp8 and an entry repeated right after itself are the two rules
    above's to refuse."""
    floor, last = precision.get("mode", "auto"), None
    for index, entry in enumerate(precision.get("fallback") or ()):
        if entry == "fp8" or entry == last:
            continue
        if not safer_than(entry, floor):
            return index
        floor = last = entry
    return None


_RANK = "{" + ", ".join(f"'{p}': {i}" for i, p in enumerate(SAFETY)) + "}"
_RUNGS = [p for p in SAFETY if p != "fp8"]
# The ladder only goes to safer precisions (SAFETY): fp32 -> fp16 would be a "fallback" to a less
# safe one, and a rung naming the mode or one before it would be dropped silently.
FALLBACK_SAFER_IN_ORDER = Rule(
    name="fallback-safer-in-order",
    path="spec.precision",
    cel="!has(self.fallback) || (self.fallback.filter(p, p != 'fp8') == "
    + " + ".join(f"self.fallback.filter(p, p == '{p}')" for p in _RUNGS)
    + f" && (!has(self.mode) || self.mode == 'auto' || self.fallback.all(p, p == 'fp8' || {_RANK}[p] > "
    f"{_RANK}[self.mode])))",
    message="precision.fallback must climb the ladder fp8 < fp16 < bf16 < fp32: each entry safer than "
    "precision.mode and than the entry before it, none repeating the mode (mode fp16: [bf16, fp32] or a part "
    "of it; bf16: [fp32] or []; fp32: []; fp8 and auto: any of fp16, bf16, fp32 in that order)",
    holds=lambda precision: unsafe_fallback(precision) is None,
    field_path=".fallback",
    item=lambda precision: f"[{unsafe_fallback(precision)}]",
)


def no_projected(source: str, *, name: str, message: str) -> Rule:
    """A rule refusing a projected volume source of the template (`source`: its field)."""
    return Rule(
        name=name,
        path="spec.template.volumes[].projected.sources[]",
        cel=f"!has(self.{source})",
        message=message,
        holds=lambda item: not isinstance(item, Mapping) or item.get(source) is None,
        field_path=f".{source}",
        reason="FieldValueForbidden",
    )


# Trainers hold no credentials: no projected ServiceAccount token (automountServiceAccountToken is always false),
# nor a podCertificate (Kubernetes 1.34, alpha): a key and a certificate a signer issued for the pod.
NO_SERVICE_ACCOUNT_TOKEN = no_projected("serviceAccountToken", name="no-service-account-token", message=NO_TOKEN)
NO_POD_CERTIFICATE = no_projected("podCertificate", name="no-pod-certificate", message=NO_CERTIFICATE)
#: The rules on each projected source of a template volume: no credential reaches a trainer through one.
NO_CREDENTIAL_SOURCES = (NO_SERVICE_ACCOUNT_TOKEN, NO_POD_CERTIFICATE)
ONE_CHECKPOINT_SOURCE = Rule(
    name="one-checkpoint-source",
    path="spec.checkpoint.volume",
    cel="has(self.persistentVolumeClaim) != has(self.emptyDir)",
    message="exactly one of checkpoint.volume.persistentVolumeClaim or emptyDir must be set",
    holds=lambda volume: ("persistentVolumeClaim" in volume) != ("emptyDir" in volume),
)
WRITABLE_CHECKPOINT_CLAIM = Rule(
    name="writable-checkpoint-claim",
    path="spec.checkpoint.volume.persistentVolumeClaim",
    cel="!has(self.readOnly) || !self.readOnly",
    message=READ_ONLY_CLAIM,
    holds=lambda claim: not claim.get("readOnly", False),
    field_path=".readOnly",
)
# S3's naming rules: a bucket is never named like an IPv4 address (its DNS-style URL would be a host).
BUCKET_NOT_AN_IP_ADDRESS = Rule(
    name="bucket-not-an-ip-address",
    path="spec.checkpoint.storage.s3.bucket",
    cel="!self.matches('^[0-9]+([.][0-9]+){3}$')",
    message="checkpoint.storage.s3.bucket must not be formatted as an IP address (192.168.1.1): S3's naming "
    "rules forbid it; name the bucket with letters too (training-checkpoints)",
    holds=lambda bucket: re.fullmatch(r"[0-9]+([.][0-9]+){3}", bucket) is None,
)
ONE_STORAGE_KIND = Rule(
    name="one-storage-kind",
    path="spec.checkpoint.storage",
    cel="has(self.volume) != has(self.s3)",
    message="exactly one of checkpoint.storage.volume or checkpoint.storage.s3 must be set",
    holds=lambda storage: ("volume" in storage) != ("s3" in storage),
)
VOLUME_OR_STORAGE = Rule(
    name="volume-or-storage",
    path="spec.checkpoint",
    cel="!has(self.volume) || !has(self.storage)",
    message="checkpoint.volume and checkpoint.storage both say where checkpoints live: set one "
    "(checkpoint.storage.volume takes the same volume)",
    holds=lambda checkpoint: "volume" not in checkpoint or "storage" not in checkpoint,
)


FAULT_RULE_NAMES_ONE_FAULT = Rule(
    name="fault-rule-names-one-fault",
    path="spec.faultPolicy.rules[]",
    cel="has(self.fault) != has(self.on)",
    message="faultPolicy.rules[] names its fault once, as fault (on is its former name: YAML reads an "
    "unquoted on as the boolean true)",
    holds=lambda rule: (rule.get("fault") is None) != (rule.get("on") is None),
)


def _allowed_action(rule: Mapping[str, Any]) -> bool:
    try:
        return allowed(Fault(rule.get("fault", rule.get("on"))), FaultAction(rule["action"]))
    except (KeyError, ValueError):
        return True  # no fault named is the rule above's to refuse, an unknown name its field's enum's


FAULT_RULE_ALLOWED = Rule(
    name="fault-rule-allowed",
    path="spec.faultPolicy.rules[]",
    cel="!(has(self.fault) || has(self.on)) || ((has(self.fault) ? self.fault : self.on) + '/' + self.action) in ["
    + ", ".join(f"'{fault.value}/{action.value}'" for fault, actions in ACTIONS.items() for action in actions)
    + "]",
    message="faultPolicy.rules[].action must be one that its fault allows: "
    + "; ".join(f"{fault.value}: {', '.join(a.value for a in actions)}" for fault, actions in ACTIONS.items()),
    holds=_allowed_action,
    field_path=".action",
)


def _field(node: Any, name: str, attr: str | None = None) -> Any:
    """A field of a wire document (`name`, camelCase) or of a model (`attr`, default `name`;
    `wire_self` leaves nested models as they are)."""
    if isinstance(node, Mapping):
        return node.get(name)
    return getattr(node, attr or name, None) if node is not None else None


def _min_workers_fit(spec: Any) -> bool:
    elastic = _field(spec, "elastic")
    if elastic is None:
        return True
    least = _field(elastic, "minWorkers", "min_workers")
    return int(least or 1) <= int(_field(spec, "workers") or 1)


ELASTIC_MIN_WORKERS_FIT = Rule(
    name="elastic-min-workers-fit",
    path="spec",
    cel="!has(self.elastic) || self.elastic.minWorkers <= (has(self.workers) ? self.workers : 1)",
    message="elastic.minWorkers must be at most workers: it is the fewest workers an attempt may shrink to",
    holds=_min_workers_fit,
    field_path=".elastic.minWorkers",
)


def _gate_computes_fp32(spec: Any) -> bool:
    validation, parallelism = _field(spec, "validation"), _field(spec, "parallelism")
    if not _field(validation, "everySteps", "every_steps") or _field(parallelism, "strategy") != "fsdp":
        return True
    gathered = _field(_field(parallelism, "fsdp"), "mixedPrecisionParam", "mixed_precision_param")
    return gathered == "fp32" or _field(_field(spec, "precision"), "mode") == "fp32"


GATE_NEEDS_FP32_GATHERING = Rule(
    name="gate-needs-fp32-gathering",
    path="spec",
    cel="!(has(self.validation) && has(self.validation.everySteps) && self.validation.everySteps > 0"
    " && has(self.parallelism) && has(self.parallelism.strategy) && self.parallelism.strategy == 'fsdp'"
    " && !(has(self.parallelism.fsdp) && has(self.parallelism.fsdp.mixedPrecisionParam)"
    " && self.parallelism.fsdp.mixedPrecisionParam == 'fp32')"
    " && !(has(self.precision) && has(self.precision.mode) && self.precision.mode == 'fp32'))",
    message="validation.everySteps evaluates in fp32 too, which a sharded model gathered in the attempt's "
    "precision cannot compute: set parallelism.fsdp.mixedPrecisionParam: fp32 (autocast casts per op), "
    "or validation.everySteps: 0",
    holds=_gate_computes_fp32,
    field_path=".validation.everySteps",
)

#: Every cross-field rule of the API, in the order the CRD lists them at a path.
RULES: tuple[Rule, ...] = (
    NAME_FITS_CHILD_NAMES,
    TASK_EXACTLY_ONE_KIND,
    TASK_WORKING_DIR_NEEDS_COMMAND,
    FALLBACK_DISTINCT,
    FALLBACK_NO_FP8,
    FALLBACK_SAFER_IN_ORDER,
    *NO_CREDENTIAL_SOURCES,
    *POD_RULES,
    ONE_CHECKPOINT_SOURCE,
    WRITABLE_CHECKPOINT_CLAIM,
    BUCKET_NOT_AN_IP_ADDRESS,
    ONE_STORAGE_KIND,
    VOLUME_OR_STORAGE,
    FAULT_RULE_NAMES_ONE_FAULT,
    FAULT_RULE_ALLOWED,
    ELASTIC_MIN_WORKERS_FIT,
    GATE_NEEDS_FP32_GATHERING,
)


def cel_by_path(rules: Sequence[Rule | Transition] = RULES) -> dict[str, list[dict[str, str]]]:
    """Schema path -> its `x-kubernetes-validations`, as the CRD carries them."""
    by_path: dict[str, list[dict[str, str]]] = {}
    for rule in rules:
        by_path.setdefault(rule.path, []).append(rule.x_kubernetes_validation())
    return by_path
