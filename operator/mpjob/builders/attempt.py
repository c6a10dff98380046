"""The attempt's children: an Indexed batch/v1 Job (one pod per worker, backoffLimit 0) and a
headless Service for rendezvous, named `<job>-a<N>`: a restarted operator never makes two."""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from typing import Any

from mpjob.builders import profile_token
from mpjob.builders.devices import GPU_RESOURCE, device_env, trainer_resources
from mpjob.builders.expansion import literal
from mpjob.planning.inplace import InPlacePlan
from mpjob.planning.launch import attempt_launch
from mpjob.planning.planner import StartAttempt
from mpjob_contract import metrics as metric_names
from mpjob_contract.api import MixedPrecisionJobSpec, processes_per_worker
from mpjob_contract.environment import ATTEMPT_JOB_ENV, SCRATCH_ENV
from mpjob_contract.launch import LAUNCH_ENV, AttemptLaunch, checkpoint_root, inside_checkpoint_dir, job_checkpoint_dir
from mpjob_contract.pod_labels import (
    APP_MANAGED_BY,
    APP_NAME,
    APP_NAME_VALUE,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_PRECISION,
    MANAGED_BY_VALUE,
)
from mpjob_contract.pod_volumes import CHECKPOINT_MOUNT, CHECKPOINT_VOLUME, SHM_MOUNT, SHM_VOLUME, adds_shared_memory
from mpjob_contract.storage import CREDENTIAL_KEYS
from mpjob_contract.tracking import IMAGE_ENV, credential_env

#: The Job's annotation naming the spec generation it was made from (`planning.replan`).
SPEC_GENERATION = "mpjob.dev/spec-generation"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
#: The Job controller's label on its pods naming the Job's UID (what the checkpoints they write name).
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
RENDEZVOUS_PORT = 29500
TRAINER_CONTAINER = "trainer"
NO_CHANGE = InPlacePlan()
#: GPU Feature Discovery's labels of a GPU node's compute capability (the attempt's pods ask for them).
GPU_MAJOR_LABEL, GPU_MINOR_LABEL = "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"
#: Seconds a trainer pod has between SIGTERM (it checkpoints) and SIGKILL.
TERMINATION_GRACE_SECONDS = 60
#: The per-pod launcher (trainer image) and the builtin trainer it starts for builtin/module tasks.
LAUNCHER_COMMAND, TRAINER_COMMAND = ("mpjob-launch",), ("mpjob-trainer",)


def attempt_name(job: str, index: int) -> str:
    return f"{job}-a{index}"


def labels(job: str, index: int | None = None, precision: str = "") -> dict[str, str]:
    mine = {APP_NAME: APP_NAME_VALUE, APP_MANAGED_BY: MANAGED_BY_VALUE, LABEL_JOB: job}
    return mine if index is None else {**mine, LABEL_ATTEMPT: str(index), LABEL_PRECISION: precision}  # None: the job's


def _gpu_affinity(min_cc: str) -> dict[str, Any]:
    """Nodes whose GPU compute capability (GPU Feature Discovery labels) is >= min_cc."""
    major, minor = (int(x) for x in min_cc.split("."))
    terms = [{"matchExpressions": [{"key": GPU_MAJOR_LABEL, "operator": "Gt", "values": [str(major)]}]}]
    same_major = [{"key": GPU_MAJOR_LABEL, "operator": "In", "values": [str(major)]}]
    if minor > 0:
        same_major.append({"key": GPU_MINOR_LABEL, "operator": "Gt", "values": [str(minor - 1)]})
    terms.append({"matchExpressions": same_major})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def escaped(env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's env entries, their values data the kubelet must not expand (`expansion`)."""
    return [{**item, "value": literal(item["value"])} if "value" in item else item for item in env]


def merge_named(base: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append the user's items; ours win on a name clash (the trainer's contract env; `mpjob run`
    merges spec.template.env into its trainers' environment by the same rule)."""
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


def launcher_argv(
    spec: MixedPrecisionJobSpec, trainer_command: Sequence[str], launcher: Sequence[str], *, workers: int | None = None
) -> list[str]:
    """What every worker of an attempt runs: the launcher, which starts processesPerWorker
    copies of the user's `task.command` (or the builtin trainer) and folds their endings;
    `workers`: the attempt's pods (None: spec.workers)."""
    command = list(spec.task.command) if spec.task.command is not None else list(trainer_command)
    per_worker, pods = str(processes_per_worker(spec)), str(workers or spec.workers)
    return [*launcher, "--nproc-per-worker", per_worker, "--workers", pods, "--", *command]


def _launch(*, job: str, namespace: str, uid: str, spec: MixedPrecisionJobSpec, start: StartAttempt,
            in_place: InPlacePlan, lineage: dict[int, list[str]] | None) -> AttemptLaunch:  # fmt: skip
    """The attempt's launch contract (`in_place`: planning.inplace; `lineage`: history.lineage), checkpoints in the
    job's own folder: a resume point outside it is not passed on (the trainer finds its own newest one)."""
    folder = job_checkpoint_dir(namespace=namespace, name=job, uid=uid, root=checkpoint_root(spec))
    resume_from = start.resume_from
    if resume_from is not None and not inside_checkpoint_dir(resume_from, folder):
        resume_from = None
    return attempt_launch(
        spec,
        start,
        in_place,
        job_name=job,
        namespace=namespace,
        checkpoint_dir=folder,
        resume_from=resume_from,
        job_uid=uid,
        lineage=lineage,
    )


def _env(launch: AttemptLaunch) -> list[dict[str, Any]]:
    """The trainer's contract env; RANK, WORLD_SIZE and the rest come from the launcher."""
    name, namespace = attempt_name(launch.job_name, launch.attempt), launch.namespace
    return [
        {"name": LAUNCH_ENV, "value": launch.to_env()},
        {"name": metric_names.METRICS_PORT_ENV, "value": str(metric_names.DEFAULT_METRICS_PORT)},
        {"name": "MPJOB_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        # The Job controller sets it too; naming it keeps the launcher's worker index explicit.
        {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": ATTEMPT_JOB_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_UID_LABEL}']"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *_bucket_env(launch.spec),
        *_tracking_env(launch.spec),
        *device_env(launch.spec),
        profile_token.token_env(launch.job_name),
    ]


def _bucket_env(spec: MixedPrecisionJobSpec) -> list[dict[str, Any]]:
    """A bucket job's: where the trainer spools (the checkpoint volume's emptyDir, which it leaves
    unused: SCRATCH_ENV) and the bucket's credentials, by reference to the job's Secret (the
    kubelet puts its keys into the trainer's environment; the operator never reads the Secret)."""
    s3 = spec.checkpoint.s3
    if s3 is None:
        return []
    secret, scratch = s3.credentials_secret, {"name": SCRATCH_ENV, "value": CHECKPOINT_MOUNT}
    keys = [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for key in CREDENTIAL_KEYS]
    return [scratch, *(keys if secret is not None else [])]


def _tracking_env(spec: MixedPrecisionJobSpec) -> list[dict[str, Any]]:
    """The tracking server's credentials, from the job's Secret straight into the trainer's env
    (kubelet resolves the keys; the operator never reads the Secret nor talks to the server)."""
    mlflow = spec.tracking.mlflow if spec.tracking is not None else None
    return credential_env(mlflow.credentials_secret) if mlflow is not None and mlflow.credentials_secret else []


def _checkpoint_volume(spec: MixedPrecisionJobSpec) -> dict[str, Any]:
    volume: dict[str, Any] = {"name": CHECKPOINT_VOLUME}
    vol = spec.checkpoint.volume_source
    if vol is not None and vol.persistent_volume_claim is not None:
        volume["persistentVolumeClaim"] = {"claimName": vol.persistent_volume_claim.claim_name}
    else:
        volume["emptyDir"] = dict(vol.empty_dir) if vol is not None and vol.empty_dir is not None else {}
    return volume


def _shared_memory(spec: MixedPrecisionJobSpec) -> bool:
    """Does the pod get our /dev/shm (mpjob_contract.pod_volumes.adds_shared_memory)?"""
    tpl = spec.template
    return adds_shared_memory(spec.resources.gpus_per_worker, tpl.volume_mounts, tpl.volumes)


def _container(
    *, env: list[dict[str, Any]], spec: MixedPrecisionJobSpec, image: str, command: list[str]
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": spec.image or image,
        "command": command,
        "env": merge_named(escaped([*env, {"name": IMAGE_ENV, "value": spec.image or image}]), spec.template.env),
        "ports": [
            {"name": "metrics", "containerPort": metric_names.DEFAULT_METRICS_PORT},
            {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT},
        ],
        "volumeMounts": [
            {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT},
            *([{"name": SHM_VOLUME, "mountPath": SHM_MOUNT}] if _shared_memory(spec) else []),
            *deepcopy(spec.template.volume_mounts),
        ],
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
    if spec.task.working_dir is not None:
        container["workingDir"] = spec.task.working_dir
    resources = trainer_resources(spec)
    if resources:
        container["resources"] = resources
    return container


def _pod_spec(name: str, spec: MixedPrecisionJobSpec, container: dict[str, Any]) -> dict[str, Any]:
    tpl = spec.template
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {"runAsNonRoot": True, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            _checkpoint_volume(spec),
            *([{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}] if _shared_memory(spec) else []),
            *deepcopy(tpl.volumes),
        ],
    }
    if spec.resources.gpus_per_worker > 0:
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
    return pod_spec


def attempt_job(
    *,
    job: str,
    namespace: str,
    uid: str,
    spec: MixedPrecisionJobSpec,
    start: StartAttempt,
    image: str,
    deadline_seconds: int | None = None,
    trainer_command: Sequence[str] = TRAINER_COMMAND,
    in_place: InPlacePlan = NO_CHANGE,
    lineage: dict[int, list[str]] | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """The Indexed Job of attempt `start.index` of `namespace/job` (UID `uid`): `workers` pods, each running
    the launcher (whose trainers may go on in the attempts `in_place` allows, from the checkpoints of
    `lineage`), made from the spec's `generation`."""
    name = attempt_name(job, start.index)
    command = launcher_argv(spec, trainer_command, LAUNCHER_COMMAND, workers=start.workers)
    launch = _launch(job=job, namespace=namespace, uid=uid, spec=spec, start=start, in_place=in_place, lineage=lineage)
    container = _container(env=_env(launch), spec=spec, image=image, command=command)
    job_labels = labels(job, start.index, start.precision)
    pod_labels = {**spec.template.labels, **job_labels}
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": start.workers or spec.workers,
        "parallelism": start.workers or spec.workers,
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": pod_labels, "annotations": dict(spec.template.annotations)},
            "spec": _pod_spec(name, spec, container),
        },
    }
    if spec.run_policy.queue_name:
        job_labels[KUEUE_QUEUE_LABEL] = spec.run_policy.queue_name
        job_spec["suspend"] = True  # Kueue admits it
    if deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = deadline_seconds
    annotations = {} if generation is None else {SPEC_GENERATION: str(generation)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": job_labels, "annotations": annotations},
        "spec": job_spec,
    }
