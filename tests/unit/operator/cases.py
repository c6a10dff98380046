"""Bad manifests, each with the field its error must name: shared by the `mpjob validate`
table test and the API-server table test, so both reject the same inputs."""

from __future__ import annotations

import copy
import json
from typing import Any

from mpjob_contract import rules
from mpjob_contract.api import MAX_TASK_ARG_DEPTH, MAX_TASK_ARGS
from mpjob_contract.pod_volumes import MAX_MOUNT_PATH, MAX_TEMPLATE_VOLUME_MOUNTS, MAX_TEMPLATE_VOLUMES

GOOD: dict[str, Any] = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "ok"},
    "spec": {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16"}},
}


def nested(levels: int, key: str = "deep") -> dict[str, Any]:
    """{key: {key: ... 1}} with `levels` maps, built without recursion."""
    doc: Any = 1
    for _ in range(levels):
        doc = {key: doc}
    return dict(doc)


def nested_json(manifest: dict[str, Any], levels: int) -> str:
    """`manifest` as JSON, its string value "HERE" replaced by `nested(levels)` (json.dumps
    would recurse past Python's limit)."""
    return json.dumps(manifest).replace('"HERE"', '{"deep": ' * levels + "1" + "}" * levels)


def with_args(args: Any) -> dict[str, Any]:
    """GOOD with a factory's task.args (free-form: a builtin's are checked by name and type)."""
    return bad("spec.task", {"module": "my_pkg.train:make_task", "args": args})


def bad(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    node = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return doc


#: A bucket that validates.
S3 = {"bucket": "checkpoints", "endpoint": "http://minio.storage:9000"}

#: spec.checkpoint on a claim: its checkpoints outlive the pods, so an attempt in a new Job resumes
#: from its predecessor's (the default emptyDir's go with the pods: `Checkpoint.outlives_pods`).
CLAIM = {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}

#: A template volume.
DATA = {"name": "data", "emptyDir": {}}


def mounting(*mounts: dict[str, Any], gpus: int = 1, volumes: tuple[dict[str, Any], ...] = (DATA,)) -> dict[str, Any]:
    """GOOD with `gpus` per worker and a template of `volumes` and `mounts`."""
    template = {"volumes": list(volumes), "volumeMounts": list(mounts)}
    return bad("spec", {**GOOD["spec"], "resources": {"gpusPerWorker": gpus}, "template": template})


# (id, manifest, text the error must contain)
#: FSDP2 gathering the weights in the attempt's precision, said outright.
GATHERED_LOW = {"strategy": "fsdp", "fsdp": {"mixedPrecisionParam": "attempt"}}

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-field", bad("spec.precision.turbo", True), "turbo"),
    # The API's names are camelCase; the Python name of a field is not one (the API server drops
    # or refuses it, so `mpjob run` may not train with it).
    ("snake-case-field", bad("spec.run_policy", {"maxAttempts": 2}), "run_policy"),
    ("snake-case-nested-field", bad("spec.precision.loss_scale", {"init": 1024}), "loss_scale"),
    # The CRD's types: the models alone would read "2" as 2 and "true" or 1 as true.
    ("quoted-integer", bad("spec.workers", "2"), "spec.workers"),
    ("boolean-for-integer", bad("spec.training.steps", True), "spec.training.steps"),
    ("quoted-number", bad("spec.training.learningRate", "0.001"), "spec.training.learningRate"),
    ("quoted-boolean", bad("spec.precision.tf32", "true"), "spec.precision.tf32"),
    ("integer-for-boolean", bad("spec.runPolicy.suspend", 1), "spec.runPolicy.suspend"),
    ("boolean-for-quantity", bad("spec.resources.requests", {"cpu": True}), "spec.resources.requests"),
    ("snake-case-bucket-field", bad("spec.checkpoint.storage.s3", S3 | {"credentials_secret": "s3"}), "credentials_"),
    ("bad-mode", bad("spec.precision.mode", "fp4"), "spec.precision.mode"),
    # fp8 is never a fallback (the least safe rung); whatever the mode, the list naming it is refused.
    ("fp8-fallback-not-first", bad("spec.precision.fallback", ["bf16", "fp8"]), "spec.precision.fallback: "),
    ("fp8-fallback-after-fp16", bad("spec.precision", {"mode": "fp16", "fallback": ["fp8"]}), "fallback: "),
    ("fp8-fallback-after-bf16", bad("spec.precision", {"mode": "bf16", "fallback": ["fp8", "fp32"]}), "fallback: "),
    ("fp8-fallback-after-fp8", bad("spec.precision", {"mode": "fp8", "fallback": ["fp8", "bf16"]}), "fallback: "),
    ("bad-fp8-recipe", bad("spec.precision.fp8.recipe", "blockwise"), "spec.precision.fp8.recipe"),
    ("bad-fp8-skip", bad("spec.precision.fp8.skip", ["layers 0"]), "spec.precision.fp8.skip"),
    ("unknown-fp8-field", bad("spec.precision.fp8.scaling", "delayed"), "scaling"),
    ("duplicate-fallback", bad("spec.precision.fallback", ["bf16", "bf16"]), "fallback"),
    ("keep-fp32-not-a-type-name", bad("spec.precision.keepFp32", ["LayerNorm", "Layer Norm"]), "keepFp32[1]"),
    # The ladder only climbs (fp8 < fp16 < bf16 < fp32): each fallback safer than the mode and the one before it.
    ("fallback-below-fp32", bad("spec.precision", {"mode": "fp32", "fallback": ["fp16"]}), "spec.precision.fallback"),
    ("fallback-repeats-mode", bad("spec.precision", {"mode": "bf16", "fallback": ["bf16"]}), "spec.precision.fallback"),
    ("fallback-out-of-order", bad("spec.precision.fallback", ["fp32", "bf16"]), "spec.precision.fallback"),
    ("auto-fallback-out-of-order", bad("spec.precision", {"mode": "auto", "fallback": ["bf16", "fp16"]}), "fallback"),
    ("builtin-and-module", bad("spec.task", {"builtin": "gpt", "module": "a.b:c"}), "exactly one of task.builtin"),
    ("neither-task", bad("spec.task", {"args": {}}), "exactly one of task.builtin"),
    ("module-and-command", bad("spec.task", {"module": "a.b:c", "command": ["python", "t.py"]}), "task.command"),
    ("empty-command", bad("spec.task", {"command": []}), "spec.task.command"),
    ("working-dir-without-command", bad("spec.task", {"builtin": "gpt", "workingDir": "/app"}), "task.workingDir"),
    ("zero-processes", bad("spec.resources.processesPerWorker", 0), "processesPerWorker"),
    ("zero-workers", bad("spec.workers", 0), "spec.workers"),
    ("progress-deadline-too-short", bad("spec.runPolicy.progressDeadlineSeconds", 5), "progressDeadlineSeconds"),
    ("negative-steps", bad("spec.training.steps", -5), "spec.training.steps"),
    ("unknown-compile-mode", bad("spec.training.compile", "fast"), "spec.training.compile"),
    ("too-many-data-workers", bad("spec.training.dataWorkers", 65), "spec.training.dataWorkers"),
    # Every number has a largest value (the CRD's maximum): none takes one past int64.
    ("warmup-steps-past-int64", bad("spec.training.warmupSteps", 10**21), "spec.training.warmupSteps"),
    ("log-every-past-int64", bad("spec.training.logEvery", 10**21), "spec.training.logEvery"),
    ("grad-clip-norm-past-int64", bad("spec.training.gradClipNorm", 10**21), "spec.training.gradClipNorm"),
    ("checkpoint-every-past-steps", bad("spec.checkpoint.everySteps", 100_000_001), "spec.checkpoint.everySteps"),
    ("deadline-past-a-year", bad("spec.runPolicy.activeDeadlineSeconds", 10**21), "activeDeadlineSeconds"),
    ("loss-scale-past-2-32", bad("spec.precision.lossScale.init", 1e21), "spec.precision.lossScale.init"),
    ("bad-module-path", bad("spec.task", {"module": "not a module"}), "spec.task.module"),
    ("bad-capability", bad("spec.resources.minComputeCapability", "eight"), "minComputeCapability"),
    (
        "two-volumes",
        bad("spec.checkpoint.volume", {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "x"}}),
        "exactly one of checkpoint.volume",
    ),
    ("no-checkpoint-source", bad("spec.checkpoint.volume", {}), "exactly one of checkpoint.volume"),
    (
        "read-only-checkpoint-claim",
        bad("spec.checkpoint.volume", {"persistentVolumeClaim": {"claimName": "x", "readOnly": True}}),
        "checkpoint.volume.persistentVolumeClaim.readOnly must be false",
    ),
    ("long-name", bad("metadata.name", "x" * 51), "50"),
    ("backoff-above-one", bad("spec.precision.lossScale.backoffFactor", 1.5), "backoffFactor"),
    ("negative-replay-steps", bad("spec.precision.guard.replaySteps", -1), "replaySteps"),
    (
        "fault-rule-action-not-allowed",
        bad("spec.faultPolicy", {"rules": [{"fault": "NumericFault", "action": "Skip"}]}),
        "faultPolicy.rules[].action must be one that its fault allows",
    ),
    (
        "fault-rule-action-not-allowed-under-the-former-name",
        bad("spec.faultPolicy", {"rules": [{"on": "NumericFault", "action": "Skip"}]}),
        "faultPolicy.rules[].action must be one that its fault allows",
    ),
    (
        "fault-rule-names-two-faults",
        bad("spec.faultPolicy", {"rules": [{"fault": "NumericFault", "on": "LossSpike", "action": "Fail"}]}),
        "names its fault once",
    ),
    ("fault-rule-names-no-fault", bad("spec.faultPolicy", {"rules": [{"action": "Fail"}]}), "names its fault once"),
    ("unknown-fault", bad("spec.faultPolicy", {"rules": [{"fault": "Gremlins", "action": "Fail"}]}), "rules[0].fault"),
    (
        "guard-rule-action-not-allowed",
        bad("spec.faultPolicy", {"rules": [{"fault": "MaxConsecutiveOverflows", "action": "Skip"}]}),
        "faultPolicy.rules[].action must be one that its fault allows",
    ),
    (
        "unknown-guard-rule",
        bad(
            "spec.faultPolicy",
            {"rules": [{"fault": "NumericFault", "action": "Fail"}, {"fault": "MaxOverflows", "action": "Fail"}]},
        ),
        "rules[1].fault",
    ),
    ("unknown-fault-action", bad("spec.faultPolicy", {"rules": [{"fault": "LossSpike", "action": "Pray"}]}), "action"),
    ("fault-rule-without-action", bad("spec.faultPolicy", {"rules": [{"fault": "LossSpike"}]}), "action"),
    ("negative-gpu-price", bad("spec.costPerGpuHour", {"amount": -1, "currency": "EUR"}), "costPerGpuHour.amount"),
    ("bad-currency", bad("spec.costPerGpuHour", {"amount": 2, "currency": "euro"}), "costPerGpuHour.currency"),
    ("negative-repromote-after", bad("spec.precision.repromoteAfterSteps", -5), "repromoteAfterSteps"),
    ("unknown-parallelism-strategy", bad("spec.parallelism.strategy", "zero3"), "spec.parallelism.strategy"),
    (
        "unknown-activation-checkpointing",
        bad("spec.parallelism.activationCheckpointing", "some"),
        "spec.parallelism.activationCheckpointing",
    ),
    ("selective-every-one", bad("spec.parallelism.selectiveEvery", 1), "spec.parallelism.selectiveEvery"),
    (
        "bad-fsdp-param-dtype",
        bad("spec.parallelism.fsdp.mixedPrecisionParam", "fp8"),
        "spec.parallelism.fsdp.mixedPrecisionParam",
    ),
    ("unknown-fsdp-field", bad("spec.parallelism.fsdp.cpuOffload", True), "cpuOffload"),
    ("zero-max-loss-delta", bad("spec.validation.maxLossDelta", 0), "maxLossDelta"),
    ("unknown-validation-field", bad("spec.validation.evry", 10), "evry"),
    ("too-many-task-args", bad("spec.task.args", {f"a{i}": i for i in range(MAX_TASK_ARGS + 1)}), "spec.task.args"),
    # task.args values nest at most MAX_TASK_ARG_DEPTH (3) levels: one more is refused, there.
    ("task-arg-map-too-deep", bad("spec.task.args", {"a": {"b": {"c": {"d": {"e": 1}}}}}), "spec.task.args.a.b.c.d"),
    ("task-arg-list-too-deep", bad("spec.task.args", {"a": [1, [2, [3, [4]]]]}), "spec.task.args.a[1][1][1]"),
    ("task-arg-empty-list-too-deep", bad("spec.task.args", {"a": {"b": [{"c": []}]}}), "spec.task.args.a.b[0].c"),
    # checkpoint.volume.emptyDir takes Kubernetes' EmptyDirVolumeSource schema.
    (
        "empty-dir-unknown-field",
        bad("spec.checkpoint.volume", {"emptyDir": {"medium": "Memory", "size": "1Gi"}}),
        "spec.checkpoint.volume.emptyDir.size",
    ),
    (
        "empty-dir-nested-medium",
        bad("spec.checkpoint.volume", {"emptyDir": {"medium": {"deep": {"deeper": 1}}}}),
        "spec.checkpoint.volume.emptyDir.medium",
    ),
    # The template's pod fields, checked with Kubernetes' own schemas (mpjob_contract.k8s).
    ("env-without-name", bad("spec.template.env", [{"value": "x"}]), "spec.template.env[0].name"),
    ("env-value-not-string", bad("spec.template.env", [{"name": "A", "value": 1}]), "spec.template.env[0].value"),
    ("env-unknown-source", bad("spec.template.env", [{"name": "A", "valueFrom": {"vault": {}}}]), "valueFrom.vault"),
    ("duplicate-env", bad("spec.template.env", [{"name": "A"}, {"name": "A"}]), "spec.template.env[1]"),
    ("volume-without-name", bad("spec.template.volumes", [{"emptyDir": {}}]), "spec.template.volumes[0].name"),
    (
        "host-path-without-path",
        bad("spec.template.volumes", [{"name": "v", "hostPath": {"type": "Directory"}}]),
        "spec.template.volumes[0].hostPath.path",
    ),
    (
        "volume-unknown-source",
        bad("spec.template.volumes", [{"name": "v", "hostpath": {"path": "/"}}]),
        "spec.template.volumes[0].hostpath",
    ),
    (
        "secret-item-without-key",
        bad("spec.template.volumes", [{"name": "s", "secret": {"secretName": "s", "items": [{"path": "p"}]}}]),
        "spec.template.volumes[0].secret.items[0].key",
    ),
    (
        "mount-without-path",
        bad("spec.template.volumeMounts", [{"name": "v"}]),
        "spec.template.volumeMounts[0].mountPath",
    ),
    (
        "toleration-seconds-not-integer",
        bad("spec.template.tolerations", [{"key": "k", "operator": "Exists", "tolerationSeconds": "soon"}]),
        "spec.template.tolerations[0].tolerationSeconds",
    ),
    ("pull-secret-not-object", bad("spec.template.imagePullSecrets", ["regcred"]), "spec.template.imagePullSecrets[0]"),
    ("label-not-string", bad("spec.template.labels", {"team": 7}), "spec.template.labels"),
    # Trainers hold no Kubernetes credentials: the template cannot mount a ServiceAccount token.
    (
        "projected-service-account-token",
        bad(
            "spec.template.volumes", [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]
        ),
        "spec.template.volumes[0].projected.sources[0].serviceAccountToken",
    ),
    # ... nor a pod certificate (a projected podCertificate source: an identity a signer vouches for).
    (
        "projected-pod-certificate",
        bad(
            "spec.template.volumes",
            [
                {
                    "name": "c",
                    "projected": {"sources": [{"podCertificate": {"signerName": "x.io/s", "keyType": "RSA3072"}}]},
                }
            ],
        ),
        "spec.template.volumes[0].projected.sources[0].podCertificate",
    ),
    # The trainer pod's seccomp profile is the operator's (RuntimeDefault): the pod API refuses a
    # deprecated seccomp annotation that names another, when the attempt's Job is made.
    (
        "pod-seccomp-annotation-unconfined",
        bad("spec.template.annotations", {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}),
        "spec.template.annotations",
    ),
    (
        "trainer-seccomp-annotation-localhost",
        bad("spec.template.annotations", {"container.seccomp.security.alpha.kubernetes.io/trainer": "localhost/p"}),
        "spec.template.annotations",
    ),
    # The pod API takes only the AppArmor profiles it knows in the trainer's deprecated annotation.
    (
        "trainer-apparmor-annotation-bogus",
        bad("spec.template.annotations", {"container.apparmor.security.beta.kubernetes.io/trainer": "bogus"}),
        "spec.template.annotations",
    ),
    # The Job controller labels each attempt's pods with its Job's name and UID (its selector): the Job
    # API refuses a pod template that sets them otherwise, when the attempt's Job is made.
    ("template-label-job-name", bad("spec.template.labels", {"job-name": "x"}), "spec.template.labels"),
    (
        "template-label-controller-uid",
        bad("spec.template.labels", {"batch.kubernetes.io/controller-uid": "x"}),
        "spec.template.labels",
    ),
    # Checkpoints in a bucket: S3's bucket naming rules and a required endpoint, each named.
    (
        "bad-bucket-name",
        bad("spec.checkpoint", {"storage": {"s3": {"bucket": "My_Bucket", "endpoint": "http://s3:7070"}}}),
        "spec.checkpoint.storage.s3.bucket",
    ),
    (
        "bucket-named-like-an-ip-address",
        bad("spec.checkpoint", {"storage": {"s3": {"bucket": "192.168.1.1", "endpoint": "http://s3:7070"}}}),
        "spec.checkpoint.storage.s3.bucket",
    ),
    (
        "endpoint-port-out-of-range",
        bad("spec.checkpoint", {"storage": {"s3": {"bucket": "ckpt", "endpoint": "http://x:99999999"}}}),
        "spec.checkpoint.storage.s3.endpoint",
    ),
    (
        "endpoint-port-zero",
        bad("spec.checkpoint", {"storage": {"s3": {"bucket": "ckpt", "endpoint": "https://x:0/s3"}}}),
        "spec.checkpoint.storage.s3.endpoint",
    ),
    (
        "s3-without-endpoint",
        bad("spec.checkpoint", {"storage": {"s3": {"bucket": "ckpt"}}}),
        "spec.checkpoint.storage.s3.endpoint",
    ),
    (
        "two-storage-kinds",
        bad(
            "spec.checkpoint",
            {"storage": {"volume": {"emptyDir": {}}, "s3": {"bucket": "ckpt", "endpoint": "http://s3:7070"}}},
        ),
        "checkpoint.storage.volume",
    ),
    ("no-storage-kind", bad("spec.checkpoint", {"storage": {}}), "checkpoint.storage.volume"),
    (
        "volume-and-storage",
        bad("spec.checkpoint", {"volume": {"emptyDir": {}}, "storage": {"volume": {"emptyDir": {}}}}),
        "checkpoint.volume and checkpoint.storage",
    ),
    (
        "automount-service-account-token",
        bad("spec.template.automountServiceAccountToken", True),
        "automountServiceAccountToken",
    ),
    # spec.elastic: it shrinks to minWorkers at the fewest, which is a worker at least and no more than `workers`.
    (
        "elastic-min-workers-above-workers",
        bad("spec", {**GOOD["spec"], "workers": 2, "elastic": {"minWorkers": 3}}),
        "spec.elastic.minWorkers",
    ),
    (
        "elastic-min-workers-above-default-workers",
        bad("spec.elastic", {"minWorkers": 2}),
        "spec.elastic.minWorkers",
    ),
    # spec.validation under fsdp: the gate's fp32 pass needs the weights gathered in fp32.
    (
        "gate-on-weights-gathered-low",
        bad("spec", {**GOOD["spec"], "parallelism": {"strategy": "fsdp"}, "validation": {"everySteps": 10}}),
        "spec.validation.everySteps",
    ),
    (
        "gate-on-weights-gathered-in-the-attempts-precision",
        bad("spec", {**GOOD["spec"], "validation": {"everySteps": 10}, "parallelism": GATHERED_LOW}),
        "spec.validation.everySteps",
    ),
    ("elastic-min-workers-zero", bad("spec.elastic", {"minWorkers": 0}), "spec.elastic.minWorkers"),
    ("elastic-without-min-workers", bad("spec.elastic", {"waitSeconds": 60}), "spec.elastic.minWorkers"),
    ("elastic-negative-wait", bad("spec.elastic", {"minWorkers": 1, "waitSeconds": -1}), "spec.elastic.waitSeconds"),
    # spec.tracking: an MLflow URI names its scheme ("mlflow:5000" would parse as the scheme "mlflow").
    (
        "mlflow-uri-without-scheme",
        bad("spec.tracking", {"mlflow": {"uri": "mlflow.mlflow:5000"}}),
        "spec.tracking.mlflow.uri",
    ),
    ("mlflow-uri-missing", bad("spec.tracking", {"mlflow": {"experiment": "x"}}), "spec.tracking.mlflow.uri"),
    # Values Kubernetes refuses only when the Job controller creates the pod (or never finds: a claim
    # is named like every object), refused at `kubectl apply` by the CRD's patterns instead.
    (
        "claim-name-not-a-name",
        bad("spec.checkpoint.volume", {"persistentVolumeClaim": {"claimName": "Bad Name"}}),
        "spec.checkpoint.volume.persistentVolumeClaim.claimName",
    ),
    (
        "empty-dir-size-not-a-quantity",
        bad("spec.checkpoint.volume", {"emptyDir": {"sizeLimit": "lots"}}),
        "spec.checkpoint.volume.emptyDir.sizeLimit",
    ),
    (
        "negative-empty-dir-size",
        bad("spec.checkpoint.storage", {"volume": {"emptyDir": {"sizeLimit": -1}}}),
        "spec.checkpoint.storage.volume.emptyDir.sizeLimit",
    ),
    ("request-quantity-two-points", bad("spec.resources.requests", {"memory": "1.2.3Gi"}), "spec.resources.requests"),
    ("negative-limit", bad("spec.resources.limits", {"cpu": -1}), "spec.resources.limits"),
    ("image-with-uppercase-repository", bad("spec.image", "ghcr.io/Team/Trainer:1.4"), "spec.image"),
    ("queue-name-not-a-label-value", bad("spec.runPolicy.queueName", "team queue"), "spec.runPolicy.queueName"),
    (
        "volume-name-not-a-dns-label",
        bad("spec.template.volumes", [{"name": "Data", "emptyDir": {}}]),
        "volumes[0].name",
    ),
    (
        "template-empty-dir-size-not-a-quantity",
        bad("spec.template.volumes", [{"name": "s", "emptyDir": {"sizeLimit": "1K"}}]),
        "spec.template.volumes[0].emptyDir.sizeLimit",
    ),
    ("env-name-with-equals", bad("spec.template.env", [{"name": "A=B", "value": "1"}]), "spec.template.env[0].name"),
    (
        "secret-key-ref-key-with-a-slash",
        bad("spec.template.env", [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a/b"}}}]),
        "spec.template.env[0].valueFrom.secretKeyRef.key",
    ),
    ("priority-class-not-a-name", bad("spec.template.priorityClassName", "High"), "spec.template.priorityClassName"),
    ("service-account-not-a-name", bad("spec.template.serviceAccountName", "a_b"), "spec.template.serviceAccountName"),
    ("label-value-with-a-space", bad("spec.template.labels", {"team": "ml team"}), "spec.template.labels"),
    (
        "node-selector-value-too-long",
        bad("spec.template.nodeSelector", {"pool": "p" * 64}),
        "spec.template.nodeSelector",
    ),
    (
        "toleration-key-not-a-label-key",
        bad("spec.template.tolerations", [{"key": "gpu type", "operator": "Exists"}]),
        "spec.template.tolerations[0].key",
    ),
    (
        "toleration-operator-lowercase",
        bad("spec.template.tolerations", [{"key": "gpu", "operator": "exists"}]),
        "spec.template.tolerations[0].operator",
    ),
    # The pod API's rules between a toleration's fields (mpjob_contract.pod_rules).
    (
        "toleration-seconds-without-no-execute",
        bad(
            "spec.template.tolerations",
            [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}],
        ),
        "spec.template.tolerations[0].effect",
    ),
    (
        "toleration-empty-key-equal",
        bad("spec.template.tolerations", [{"operator": "Equal", "value": "a100"}]),
        "spec.template.tolerations[0].operator",
    ),
    (
        "toleration-exists-with-value",
        bad("spec.template.tolerations", [{"key": "gpu", "operator": "Exists", "value": "a100"}]),
        "spec.template.tolerations[0].value",
    ),
    # The pod API's rules between the template's volumes and mounts and the operator's own (pod_rules).
    (
        "template-volume-named-checkpoints",
        bad("spec.template.volumes", [{"name": "checkpoints", "emptyDir": {}}]),
        "spec.template.volumes[0].name",
    ),
    (
        "mount-at-the-checkpoint-mount",
        mounting({"name": "data", "mountPath": "/var/lib/mpjob/checkpoints"}),
        "spec.template.volumeMounts[0].mountPath",
    ),
    (
        "mount-over-the-checkpoint-mount-spelled-otherwise",
        mounting({"name": "data", "mountPath": "/x"}, {"name": "data", "mountPath": "//var/lib/./mpjob/checkpoints/"}),
        "spec.template.volumeMounts[1].mountPath",
    ),
    ("mount-names-no-volume", mounting({"name": "nothere", "mountPath": "/x"}), "spec.template.volumeMounts"),
    # The operator adds dshm to GPU pods only, and not beside a template's own /dev/shm.
    ("cpu-pod-mounts-dshm", mounting({"name": "dshm", "mountPath": "/shm"}, gpus=0), "spec.template.volumeMounts"),
    (
        "dshm-mounted-beside-the-templates-own-shm",
        mounting({"name": "data", "mountPath": "/dev/shm"}, {"name": "dshm", "mountPath": "/shm"}),
        "spec.template.volumeMounts",
    ),
    # Bounded so that the rules' CEL fits the API server's cost budget (pod_volumes).
    (
        "too-many-volumes",
        bad("spec.template.volumes", [{"name": f"v{i}", "emptyDir": {}} for i in range(MAX_TEMPLATE_VOLUMES + 1)]),
        "spec.template.volumes",
    ),
    (
        "too-many-volume-mounts",
        mounting(*({"name": "data", "mountPath": f"/m{i}"} for i in range(MAX_TEMPLATE_VOLUME_MOUNTS + 1))),
        "spec.template.volumeMounts",
    ),
    (
        "mount-path-too-long",
        mounting({"name": "data", "mountPath": "/" + "m" * MAX_MOUNT_PATH}),
        "spec.template.volumeMounts[0].mountPath",
    ),
    (
        "mlflow-secret-not-a-name",
        bad("spec.tracking", {"mlflow": {"uri": "http://m:5000", "credentialsSecret": "My Secret"}}),
        "spec.tracking.mlflow.credentialsSecret",
    ),
]

#: Each cross-field rule (mpjob_contract.rules) -> the CASES that break it and no other rule.
RULE_CASES: dict[str, tuple[str, ...]] = {
    rules.NAME_FITS_CHILD_NAMES.name: ("long-name",),
    rules.TASK_EXACTLY_ONE_KIND.name: ("builtin-and-module", "neither-task", "module-and-command"),
    rules.TASK_WORKING_DIR_NEEDS_COMMAND.name: ("working-dir-without-command",),
    rules.FALLBACK_DISTINCT.name: ("duplicate-fallback",),
    rules.FALLBACK_NO_FP8.name: (
        "fp8-fallback-not-first",
        "fp8-fallback-after-fp16",
        "fp8-fallback-after-bf16",
        "fp8-fallback-after-fp8",
    ),
    rules.FALLBACK_SAFER_IN_ORDER.name: (
        "fallback-below-fp32",
        "fallback-repeats-mode",
        "fallback-out-of-order",
        "auto-fallback-out-of-order",
    ),
    rules.NO_SERVICE_ACCOUNT_TOKEN.name: ("projected-service-account-token",),
    rules.NO_POD_CERTIFICATE.name: ("projected-pod-certificate",),
    rules.TEMPLATE_SECCOMP_RUNTIME_DEFAULT.name: (
        "pod-seccomp-annotation-unconfined",
        "trainer-seccomp-annotation-localhost",
    ),
    rules.TEMPLATE_APPARMOR_PROFILE_NAME.name: ("trainer-apparmor-annotation-bogus",),
    rules.TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS.name: ("template-label-job-name", "template-label-controller-uid"),
    rules.TOLERATION_SECONDS_NEED_NO_EXECUTE.name: ("toleration-seconds-without-no-execute",),
    rules.TOLERATION_EMPTY_KEY_EXISTS.name: ("toleration-empty-key-equal",),
    rules.TOLERATION_EXISTS_WITHOUT_VALUE.name: ("toleration-exists-with-value",),
    rules.TEMPLATE_VOLUME_NOT_CHECKPOINTS.name: ("template-volume-named-checkpoints",),
    rules.MOUNT_NOT_AT_CHECKPOINTS.name: (
        "mount-at-the-checkpoint-mount",
        "mount-over-the-checkpoint-mount-spelled-otherwise",
    ),
    rules.MOUNT_NAMES_A_VOLUME.name: (
        "mount-names-no-volume",
        "cpu-pod-mounts-dshm",
        "dshm-mounted-beside-the-templates-own-shm",
    ),
    rules.ONE_CHECKPOINT_SOURCE.name: ("two-volumes", "no-checkpoint-source"),
    rules.WRITABLE_CHECKPOINT_CLAIM.name: ("read-only-checkpoint-claim",),
    rules.BUCKET_NOT_AN_IP_ADDRESS.name: ("bucket-named-like-an-ip-address",),
    rules.ONE_STORAGE_KIND.name: ("two-storage-kinds", "no-storage-kind"),
    rules.VOLUME_OR_STORAGE.name: ("volume-and-storage",),
    rules.FAULT_RULE_NAMES_ONE_FAULT.name: ("fault-rule-names-two-faults", "fault-rule-names-no-fault"),
    rules.FAULT_RULE_ALLOWED.name: (
        "fault-rule-action-not-allowed",
        "fault-rule-action-not-allowed-under-the-former-name",
        "guard-rule-action-not-allowed",
    ),
    rules.ELASTIC_MIN_WORKERS_FIT.name: (
        "elastic-min-workers-above-workers",
        "elastic-min-workers-above-default-workers",
    ),
    rules.GATE_NEEDS_FP32_GATHERING.name: (
        "gate-on-weights-gathered-low",
        "gate-on-weights-gathered-in-the-attempts-precision",
    ),
}

#: task.args as deep as they may go, with every kind of value: accepted by both, stored as written.
DEEPEST_TASK_ARGS: dict[str, Any] = {
    "lr": 0.1,
    "name": "x",
    "on": True,
    "steps": 3,
    "betas": [0.9, 0.95],
    "empty": [],
    "none": {},
    "layers": [{"dim": 64, "acts": ["relu"]}, {"dim": 128}],
    "nested": {"a": {"b": [1, 2]}, "c": [[1], [2, 3]]},
}
assert MAX_TASK_ARG_DEPTH == 3  # DEEPEST_TASK_ARGS reaches it

#: A template that uses what Kubernetes' schemas allow, nested sources included: accepted by
#: both, and stored by the API server as written (nothing pruned).
FULL_TEMPLATE: dict[str, Any] = {
    "labels": {"team": "ml"},
    "annotations": {"note": "x"},
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "pool", "value": "a100"},
    ],
    "env": [
        {"name": "A", "value": "1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token", "optional": True}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ],
    "volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {
            "name": "meta",
            "projected": {
                "sources": [
                    {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                    {"configMap": {"name": "cfg", "items": [{"key": "a", "path": "a", "mode": 256}]}},
                ]
            },
        },
        {
            "name": "eph",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                }
            },
        },
    ],
    # Beside the operator's: its checkpoint volume mounted elsewhere, its /dev/shm (a GPU pod's) too,
    # and a volume mounted below the checkpoint mount.
    "volumeMounts": [
        {"name": "data", "mountPath": "/data", "readOnly": True, "subPath": "x"},
        {"name": "checkpoints", "mountPath": "/checkpoints-read-only", "readOnly": True},
        {"name": "dshm", "mountPath": "/shm-too"},
        {"name": "scratch", "mountPath": "/var/lib/mpjob/checkpoints/sub"},
    ],
    "priorityClassName": "high",
    "serviceAccountName": "trainer",
    "imagePullSecrets": [{"name": "regcred"}],
}
