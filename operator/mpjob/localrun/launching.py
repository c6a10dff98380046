"""What `mpjob run` tells each attempt it launches, as a pod is told it: where the checkpoints
live, where a `task.command` runs, and the attempt's settings in its environment."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from mpjob.builders.attempt import merge_named
from mpjob.builders.devices import device_env
from mpjob.builders.expansion import expanded
from mpjob.localrun.paths import Paths, recorded_run
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.inplace import InPlacePlan
from mpjob.planning.launch import attempt_launch
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJob, MixedPrecisionJobSpec
from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import LAUNCH_ENV, job_checkpoint_dir


def checkpoint_dir(job: MixedPrecisionJob, paths: Paths) -> str:
    """Where a run's trainers keep checkpoints (AttemptLaunch.checkpointDir): --out's folder, or
    in checkpoint.storage.s3's bucket the job's folder with the run's key for the UID (job.json
    keeps it: a rerun of the same --out resumes; --fresh or another --out starts clean), or, for
    a run from before keys were kept, --out's digest. Credentials come from the environment or
    AWS_SHARED_CREDENTIALS_FILE, as for any S3 client."""
    s3 = job.spec.checkpoint.s3
    if s3 is None:
        return str(paths.checkpoints.resolve())
    run = recorded_run(paths.root) or hashlib.sha256(str(paths.root.resolve()).encode()).hexdigest()[:16]
    namespace = job.metadata.namespace or "local"
    return job_checkpoint_dir(namespace=namespace, name=job.metadata.name, uid=f"local-{run}", root=s3.url)


def working_dir(spec: MixedPrecisionJobSpec, base_dir: Path) -> Path:
    """Where a `task.command` runs: the manifest's folder, so `command: [python, train.py]` finds
    the script beside it; a relative task.workingDir is taken below that folder, an absolute one
    as it is."""
    task = spec.task
    if task.command is None:
        return Path.cwd()
    return base_dir / task.working_dir if task.working_dir else base_dir


def unusable_working_dir(spec: MixedPrecisionJobSpec, base_dir: Path) -> str | None:
    """Why a `task.workingDir` cannot be where its command runs (None: it can): a folder that is
    not there, or not a folder, known before any worker is started in it."""
    if spec.task.working_dir is None or (where := working_dir(spec, base_dir)).is_dir():
        return None
    return f"{where} is not a folder (a relative workingDir is taken below the manifest's folder)"


def working_dir_gone(spec: MixedPrecisionJobSpec, base_dir: Path) -> AttemptOutcome | None:
    """The ending of an attempt whose task.workingDir is no folder any more (checked before the
    run, deleted since: by an earlier attempt's command, by hand): a configuration error naming
    it, as a trainer's exit 43 is; None: it is there."""
    if (why := unusable_working_dir(spec, base_dir)) is None:
        return None
    return AttemptOutcome(ExitCode.CONFIG_ERROR, message=f"spec.task.workingDir: {why}")


def attempt_env(
    job: MixedPrecisionJob,
    start: StartAttempt,
    *,
    checkpoint_dir: str,
    in_place: InPlacePlan,
    rendezvous: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, str]]:
    """The environment of attempt `start`'s launchers: this one's, less any Kubernetes settings,
    with spec.template.env's values (`template_values`) and, over them, the attempt's launch, a
    metrics port of its own and where its ranks meet (`rendezvous`: localrun.rendezvous); and
    the container's own variables of it (those the kubelet expands a task.command's `$(NAME)` with)."""
    launch = attempt_launch(
        job.spec,
        start,
        in_place,
        job_name=job.metadata.name,
        namespace=job.metadata.namespace or "local",
        checkpoint_dir=checkpoint_dir,
        resume_from=start.resume_from,
    )
    ours = {
        LAUNCH_ENV: launch.to_env(),
        "MPJOB_METRICS_PORT": "0",
        "MPJOB_METRICS_HOST": "127.0.0.1",
        **rendezvous,
        "PYTHONUNBUFFERED": "1",
        **{item["name"]: item["value"] for item in device_env(job.spec)},  # a CPU job's: no GPU, as on a node
    }
    shell = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    container = template_values(job.spec, ours)
    return {**shell, **container}, container


def template_values(spec: MixedPrecisionJobSpec, ours: dict[str, str]) -> dict[str, str]:
    """`ours` and spec.template.env merged as the trainer container's env is on a cluster (ours
    win a name clash: builders.attempt.merge_named), less the entries read from the cluster
    (valueFrom: `unresolved_env` names them); an entry with neither is the empty string, as there.
    The manifest's values are expanded as the kubelet expands them (`$(NAME)` of an entry before
    it, `$$` a `$`: builders.expansion); ours are data, taken as they are."""
    merged = merge_named([{"name": name, "value": value} for name, value in ours.items()], spec.template.env)
    values: dict[str, str] = {}
    for item in (item for item in merged if "valueFrom" not in item):
        name, value = str(item["name"]), str(item.get("value", ""))
        values[name] = value if name in ours else expanded(value, values)
    return values


def unresolved_env(spec: MixedPrecisionJobSpec) -> list[tuple[str, str]]:
    """(field, message) for each spec.template.env entry read from the cluster (a secretKeyRef,
    configMapKeyRef, fieldRef or resourceFieldRef): `mpjob run` has no cluster to read it from."""
    said = []
    for i, item in enumerate(spec.template.env):
        if "valueFrom" in item:
            name, source = item.get("name"), " or ".join(sorted(item["valueFrom"] or {})) or "valueFrom"
            message = (
                f"spec.template.env[{i}] ({name}): its valueFrom.{source} is read on a cluster only; "
                f"mpjob run leaves it unset from the manifest (the trainers get this shell's {name}, if any)"
            )
            said.append((f"spec.template.env[{i}].valueFrom", message))
    return said
