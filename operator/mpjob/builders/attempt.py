"""The attempt's children: an Indexed batch/v1 Job (one pod per worker, backoffLimit 0) and a
headless Service for rendezvous. Names are deterministic (`<job>-a<N>`), so a restarted
operator never creates an attempt twice."""

from __future__ import annotations

from copy import deepcopy
from typing import Any

from mpjob_contract import metrics as metric_names
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import CHECKPOINT_MOUNT, LAUNCH_ENV, AttemptLaunch

LABEL_JOB = "mpjob.dev/job"
LABEL_ATTEMPT = "mpjob.dev/attempt"
LABEL_PRECISION = "mpjob.dev/precision"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RENDEZVOUS_PORT = 29500
TRAINER_CONTAINER = "trainer"
GPU_RESOURCE = "nvidia.com/gpu"


def attempt_name(job: str, index: int) -> str:
    return f"{job}-a{index}"


def labels(job: str, index: int, precision: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "mpjob-trainer",
        "app.kubernetes.io/managed-by": "mpjob",
        LABEL_JOB: job,
        LABEL_ATTEMPT: str(index),
        LABEL_PRECISION: precision,
    }


def _gpu_affinity(min_cc: str) -> dict[str, Any]:
    """Nodes whose GPU compute capability (GPU Feature Discovery labels) is >= min_cc."""
    major, minor = (int(x) for x in min_cc.split("."))
    terms = [{"matchExpressions": [{"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": [str(major)]}]}]
    same_major = [{"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": [str(major)]}]
    if minor > 0:
        same_major.append({"key": "nvidia.com/gpu.compute.minor", "operator": "Gt", "values": [str(minor - 1)]})
    terms.append({"matchExpressions": same_major})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _merge_named(base: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append the user's items; ours win on a name clash (the trainer's contract env)."""
    names = {item.get("name") for item in base}
    return base + [deepcopy(item) for item in extra if item.get("name") not in names]


def attempt_service(job: str, namespace: str, index: int, precision: str) -> dict[str, Any]:
    name = attempt_name(job, index)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(job, index, precision)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: job, LABEL_ATTEMPT: str(index)},
            "ports": [
                {"name": "rendezvous", "port": RENDEZVOUS_PORT},
                {"name": "metrics", "port": metric_names.DEFAULT_METRICS_PORT},
            ],
        },
    }


def attempt_job(
    job: str,
    namespace: str,
    spec: MixedPrecisionJobSpec,
    index: int,
    precision: str,
    resume_from: str | None,
    default_image: str,
    active_deadline_seconds: int | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """The Indexed Job of attempt `index`: `workers` pods running the trainer."""
    name = attempt_name(job, index)
    launch = AttemptLaunch(
        job_name=job,
        namespace=namespace,
        attempt=index,
        precision=precision,  # type: ignore[arg-type]
        resume_from=resume_from,
        checkpoint_dir=CHECKPOINT_MOUNT,
        spec=spec,
    )
    env: list[dict[str, Any]] = [
        {"name": LAUNCH_ENV, "value": launch.to_env()},
        {"name": metric_names.METRICS_PORT_ENV, "value": str(metric_names.DEFAULT_METRICS_PORT)},
        {"name": "MPJOB_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        {"name": "WORLD_SIZE", "value": str(spec.workers)},
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    tpl = spec.template
    resources: dict[str, Any] = {}
    requests = {k: str(v) for k, v in spec.resources.requests.items()}
    limits = {k: str(v) for k, v in spec.resources.limits.items()}
    gpus = spec.resources.gpus_per_worker
    if gpus > 0:
        limits[GPU_RESOURCE] = str(gpus)
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    volume: dict[str, Any] = {"name": "checkpoints"}
    vol = spec.checkpoint.volume
    if vol is not None and vol.persistent_volume_claim is not None:
        volume["persistentVolumeClaim"] = {"claimName": vol.persistent_volume_claim.claim_name}
    else:
        volume["emptyDir"] = dict(vol.empty_dir) if vol is not None and vol.empty_dir is not None else {}
    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": spec.image or default_image,
        "command": list(command or ["mpjob-trainer"]),
        "env": _merge_named(env, tpl.env),
        "ports": [
            {"name": "metrics", "containerPort": metric_names.DEFAULT_METRICS_PORT},
            {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT},
        ],
        "volumeMounts": [{"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}, *deepcopy(tpl.volume_mounts)],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if resources:
        container["resources"] = resources
    pod_labels = {**tpl.labels, **labels(job, index, precision)}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        "securityContext": {"runAsNonRoot": True, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [volume, *deepcopy(tpl.volumes)],
    }
    if gpus > 0:
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        pod_spec["affinity"] = _gpu_affinity(spec.resources.min_compute_capability)
    if tpl.tolerations:
        pod_spec["tolerations"] = pod_spec.get("tolerations", []) + deepcopy(tpl.tolerations)
    if tpl.node_selector:
        pod_spec["nodeSelector"] = dict(tpl.node_selector)
    if tpl.priority_class_name:
        pod_spec["priorityClassName"] = tpl.priority_class_name
    if tpl.service_account_name:
        pod_spec["serviceAccountName"] = tpl.service_account_name
    if tpl.image_pull_secrets:
        pod_spec["imagePullSecrets"] = deepcopy(tpl.image_pull_secrets)
    job_labels = labels(job, index, precision)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.workers,
        "parallelism": spec.workers,
        "backoffLimit": 0,
        "template": {"metadata": {"labels": pod_labels, "annotations": dict(tpl.annotations)}, "spec": pod_spec},
    }
    if spec.run_policy.queue_name:
        job_labels[KUEUE_QUEUE_LABEL] = spec.run_policy.queue_name
        job_spec["suspend"] = True  # Kueue admits it
    if active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = max(1, active_deadline_seconds)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": job_labels},
        "spec": job_spec,
    }
