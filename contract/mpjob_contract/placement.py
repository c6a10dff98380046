"""Where an attempt runs and keeps its state: checkpoint storage (a volume or a bucket), the
pods' resources, the run policy and the overrides merged into every trainer pod."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from mpjob_contract import formats, k8s, rules
from mpjob_contract.pod_rules import TEMPLATE_RULES
from mpjob_contract.storage import S3Storage
from mpjob_contract.vocabulary import (
    MAX_ATTEMPTS_LIMIT,
    MAX_POLICY_SECONDS,
    MAX_PROCESSES_PER_WORKER,
    MAX_STEPS,
)
from mpjob_contract.wire import ApiModel


class PersistentVolumeClaimRef(ApiModel):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=formats.DNS_SUBDOMAIN.pattern,
        description="The claim's name, in the job's namespace (a claim is named like every Kubernetes object).",
    )
    read_only: bool = Field(False, description="Must be false: the job writes its checkpoints to the claim.")

    @model_validator(mode="after")
    def _writable(self) -> PersistentVolumeClaimRef:
        rules.WRITABLE_CHECKPOINT_CLAIM.check(rules.wire_self(self))
        return self


class CheckpointVolume(ApiModel):
    """Where checkpoints live; never deleted by mpjob."""

    persistent_volume_claim: PersistentVolumeClaimRef | None = Field(
        None, description="A claim every pod of every attempt mounts (several workers need ReadWriteMany)."
    )
    empty_dir: dict[str, Any] | None = None  # Kubernetes' EmptyDirVolumeSource (medium, sizeLimit)

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_empty_dir(cls, data: Any) -> Any:
        """emptyDir checked against Kubernetes' own schema of it, as the API server does."""
        if isinstance(data, dict):
            value = data.get("emptyDir", data.get("empty_dir"))
            schema = k8s.spec_schemas()["checkpoint.volume.emptyDir"]
            violations = k8s.check(value, schema, "emptyDir") if value is not None else []
            if violations:
                raise k8s.SchemaViolations(violations)
        return data

    @model_validator(mode="after")
    def _one_source(self) -> CheckpointVolume:
        rules.ONE_CHECKPOINT_SOURCE.check(rules.wire_self(self))
        return self


class CheckpointStorage(ApiModel):
    """Where checkpoints live: a volume, or an S3-compatible bucket (mpjob_contract.storage)."""

    volume: CheckpointVolume | None = None
    s3: S3Storage | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> CheckpointStorage:
        rules.ONE_STORAGE_KIND.check(rules.wire_self(self))
        return self


class Checkpoint(ApiModel):
    every_steps: int = Field(200, ge=1, le=MAX_STEPS, description="Steps between checkpoints.")
    keep: int = Field(3, ge=1, le=100, description="Checkpoints kept; older ones are pruned.")
    volume: CheckpointVolume | None = Field(
        None, description="Checkpoint volume (a PVC for resumes across pods). Default: emptyDir."
    )
    storage: CheckpointStorage | None = Field(None, description="A volume or an S3 bucket (instead of volume).")

    @model_validator(mode="after")
    def _one_place(self) -> Checkpoint:
        rules.VOLUME_OR_STORAGE.check(rules.wire_self(self))
        return self

    @property
    def s3(self) -> S3Storage | None:
        """The bucket checkpoints go to, if any."""
        return self.storage.s3 if self.storage is not None else None

    @property
    def volume_source(self) -> CheckpointVolume | None:
        """The volume checkpoints go to (None: emptyDir, or a bucket)."""
        return self.volume if self.volume is not None else self.storage.volume if self.storage else None

    @property
    def outlives_pods(self) -> bool:
        """Whether the checkpoints outlive the pods that wrote them (a claim, or a bucket): the
        default or an explicit emptyDir goes with its pod, so an attempt in new pods (a new Job,
        the same Job's pods made anew) finds none of its predecessor's."""
        volume = self.volume_source
        return self.s3 is not None or (volume is not None and volume.persistent_volume_claim is not None)


Quantity = Annotated[str, Field(pattern=formats.QUANTITY.pattern)]
#: A quantity as a request or a limit takes it: a whole number, or a quantity string (strict: " 1"
#: is no integer to the API server, which holds it to the quantity's pattern).
ResourceAmount = Annotated[int, Field(ge=0, strict=True)] | Quantity


class Resources(ApiModel):
    gpus_per_worker: int = Field(1, ge=0, le=16, description="nvidia.com/gpu per pod; 0 = CPU job.")
    processes_per_worker: int | None = Field(
        None,
        ge=1,
        le=MAX_PROCESSES_PER_WORKER,
        description="Training processes the launcher starts in each pod (default: gpusPerWorker, 1 for CPU jobs).",
    )
    min_compute_capability: str = Field(
        "7.0", pattern=formats.COMPUTE_CAPABILITY.pattern, description="Lowest GPU compute capability."
    )
    requests: dict[str, ResourceAmount] = Field(
        default_factory=dict, description=f"What each pod requests (cpu, memory, ...): {formats.QUANTITY.allows}."
    )
    limits: dict[str, ResourceAmount] = Field(
        default_factory=dict,
        description=f"The most each pod uses: {formats.QUANTITY.allows}; nvidia.com/gpu comes from gpusPerWorker.",
    )


#: runPolicy.progressDeadlineSeconds' bounds: a hung attempt is never judged on a few missed reads, nor
#: allowed to hold its GPUs longer than a week.
MIN_PROGRESS_DEADLINE_SECONDS, MAX_PROGRESS_DEADLINE_SECONDS = 30, 7 * 24 * 3600


class RunPolicy(ApiModel):
    max_attempts: int = Field(6, ge=1, le=MAX_ATTEMPTS_LIMIT, description="Attempts in all.")
    active_deadline_seconds: int | None = Field(None, ge=1, le=MAX_POLICY_SECONDS, description="Whole-job deadline.")
    progress_deadline_seconds: int | None = Field(
        None,
        ge=MIN_PROGRESS_DEADLINE_SECONDS,
        le=MAX_PROGRESS_DEADLINE_SECONDS,
        description="End a running attempt whose step has not advanced this long, counted from the operator's "
        "first read of its rank 0's metrics (so its start-up, compile and checkpoint saves count: leave room for "
        "them), as Stalled: retried in the same precision from the newest checkpoint (faultPolicy fault Stalled). "
        "Unset: never.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, le=MAX_POLICY_SECONDS, description="Delete the children this long after the job finished."
    )
    suspend: bool = Field(False, description="Stop the running attempt after a checkpoint.")
    queue_name: str = Field(
        "",
        max_length=63,
        pattern=formats.LABEL_VALUE.pattern,
        description="Kueue LocalQueue; each attempt Job is labelled with it (so it is a label value).",
    )
    pod_creation_timeout_seconds: int = Field(
        300,
        ge=1,
        le=MAX_PROGRESS_DEADLINE_SECONDS,
        description="Fail the job when the Job controller could not create an attempt's pods (Pod Security, "
        "quota, an admission webhook), or the kubelet could not make their container (a Secret not there) or "
        "pull its image, this long after the attempt started.",
    )


class PodTemplateOverrides(ApiModel):
    """Pod fields merged into every trainer pod; the trainer container is never replaced."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    env: list[dict[str, Any]] = Field(default_factory=list)
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)
    priority_class_name: str | None = None
    service_account_name: str | None = None
    image_pull_secrets: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_schemas(cls, data: Any) -> Any:
        """Each field checked against Kubernetes' own schema of it, as the API server does."""
        if isinstance(data, dict):
            aliases: dict[str, str] = {name: field.alias or name for name, field in cls.model_fields.items()}
            wire = {aliases.get(str(key), str(key)): value for key, value in data.items()}
            violations = k8s.check_template(wire)
            if violations:
                raise k8s.SchemaViolations(violations)
        return data

    @model_validator(mode="after")
    def _no_kubernetes_credentials(self) -> PodTemplateOverrides:
        """Trainers hold no credentials: no projected ServiceAccount token (the pod mounts none of
        its own: automountServiceAccountToken is the operator's, always false), no pod certificate."""
        violations = [
            found
            for i, volume in enumerate(self.volumes)
            for j, source in enumerate((volume.get("projected") or {}).get("sources") or [])
            for rule in rules.NO_CREDENTIAL_SOURCES
            if (found := rule.violation(source, at=f"volumes[{i}].projected.sources[{j}]"))
        ]
        if violations:
            raise k8s.SchemaViolations(violations)
        return self

    @model_validator(mode="after")
    def _maps_hold(self) -> PodTemplateOverrides:
        """The pod API's rules on the template's labels and annotations (pod_rules.TEMPLATE_RULES)."""
        template = rules.wire_self(self)
        violations = [found for rule in TEMPLATE_RULES if (found := rule.violation(template))]
        if violations:
            raise k8s.SchemaViolations(violations)
        return self

    @model_validator(mode="after")
    def _items_hold(self) -> PodTemplateOverrides:
        """The pod API's rules on each toleration, volume and volume mount (rules.ITEM_RULES)."""
        items = {"tolerations": self.tolerations, "volumes": self.volumes, "volumeMounts": self.volume_mounts}
        violations = [
            found
            for field, field_rules in rules.ITEM_RULES.items()
            for i, item in enumerate(items[field])
            for rule in field_rules
            if (found := rule.violation(item, at=f"{field}[{i}]"))
        ]
        if violations:
            raise k8s.SchemaViolations(violations)
        return self
