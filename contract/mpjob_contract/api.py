"""The MixedPrecisionJob API (group mpjob.dev, version v1alpha1) as pydantic models.

These models are the single source of truth for the schema: `mpjob crd` generates
crds/mixedprecisionjobs.mpjob.dev.yaml from them, `mpjob validate` checks manifests with
them, and the trainer reads its spec through them. Field names are camelCase on the wire
(aliases) and snake_case in Python. Unknown fields are rejected, never dropped.

This module is the whole manifest (MixedPrecisionJob) and the one place to import the API
from; the parts live by role: `spec.py` (what the user writes: task, training, validation),
`precision.py` (spec.precision and its guard), `placement.py` (checkpoints, resources, run
policy, pod template), `status.py` (what the operator writes) and `vocabulary.py` (the names
and bounds they share).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from mpjob_contract import formats, k8s, rules
from mpjob_contract.placement import (
    Checkpoint,
    CheckpointStorage,
    CheckpointVolume,
    PersistentVolumeClaimRef,
    PodTemplateOverrides,
    Quantity,
    Resources,
    RunPolicy,
)
from mpjob_contract.precision import Guard, LossScale, PrecisionSpec, fallbacks_after, precision_ladder
from mpjob_contract.spec import MixedPrecisionJobSpec, Task, Training, Validation, processes_per_worker, world_size
from mpjob_contract.status import AttemptCounts, AttemptStatus, CheckpointStatus, Condition, MixedPrecisionJobStatus
from mpjob_contract.vocabulary import (
    API_VERSION,
    GROUP,
    KIND,
    MAX_ATTEMPT_ENTRIES,
    MAX_ATTEMPTS_LIMIT,
    MAX_PROCESSES_PER_WORKER,
    MAX_STEPS,
    MAX_TASK_ARG_DEPTH,
    MAX_TASK_ARGS,
    MAX_WORKERS,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    BuiltinTask,
    CompileMode,
    Phase,
    Precision,
    PrecisionMode,
    RequestedPrecision,
    is_auto,
    resolve_auto,
    settled,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_ATTEMPT_ENTRIES",
    "MAX_PROCESSES_PER_WORKER",
    "MAX_STEPS",
    "MAX_TASK_ARGS",
    "MAX_TASK_ARG_DEPTH",
    "MAX_WORKERS",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "AttemptCounts",
    "AttemptStatus",
    "BuiltinTask",
    "Checkpoint",
    "CheckpointStatus",
    "CheckpointStorage",
    "CheckpointVolume",
    "CompileMode",
    "Condition",
    "Guard",
    "LossScale",
    "MixedPrecisionJob",
    "MixedPrecisionJobSpec",
    "MixedPrecisionJobStatus",
    "ObjectMeta",
    "PersistentVolumeClaimRef",
    "Phase",
    "PodTemplateOverrides",
    "Precision",
    "PrecisionMode",
    "PrecisionSpec",
    "Quantity",
    "RequestedPrecision",
    "Resources",
    "RunPolicy",
    "Task",
    "Training",
    "Validation",
    "fallbacks_after",
    "is_auto",
    "precision_ladder",
    "processes_per_worker",
    "resolve_auto",
    "settled",
    "world_size",
]


class ObjectMeta(BaseModel):
    """metadata: name and namespace checked, labels and annotations against Kubernetes' schemas,
    its other fields admitted as written (the API server sets most of them; `kubectl get -o yaml`
    writes them); a field Kubernetes' ObjectMeta does not have (a misspelt `nmae`) is refused, as
    the API server's strict field validation (kubectl's default) refuses it."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    name: str = Field(min_length=1, pattern=formats.JOB_NAME.pattern)
    namespace: str | None = Field(None, max_length=63, pattern=formats.NAMESPACE.pattern)
    labels: Any = None
    annotations: Any = None
    generate_name: Any = None
    uid: Any = None
    resource_version: Any = None
    generation: Any = None
    creation_timestamp: Any = None
    deletion_timestamp: Any = None
    deletion_grace_period_seconds: Any = None
    owner_references: Any = None
    finalizers: Any = None
    managed_fields: Any = None
    self_link: Any = None

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_maps(cls, data: Any) -> Any:
        """labels and annotations checked against Kubernetes' own schemas, as the API server does."""
        if isinstance(data, dict):
            schemas = k8s.template_schemas()  # the template's labels and annotations are ObjectMeta's
            violations = [
                found
                for name in ("labels", "annotations")
                if data.get(name) is not None
                for found in k8s.check(data[name], schemas[name], name)
            ]
            if violations:
                raise k8s.SchemaViolations(violations)
        return data

    @field_validator("name")
    @classmethod
    def _fits_child_names(cls, value: str) -> str:
        rules.NAME_FITS_CHILD_NAMES.check({"metadata": {"name": value}})
        return value


class MixedPrecisionJob(BaseModel):
    """A whole manifest, as `kubectl apply` would send it."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["mpjob.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["MixedPrecisionJob"]
    metadata: ObjectMeta
    spec: MixedPrecisionJobSpec
    status: MixedPrecisionJobStatus | None = None
