"""examples/: every manifest is valid for the cluster, says what you will see, and tells the
story its name promises (a recovering fp16 job, two DDP workers, a Kueue-queued job)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.builders.attempt import KUEUE_QUEUE_LABEL, attempt_job
from mpjob.planning.planner import StartAttempt, first_attempt
from mpjob.validation import check_document
from mpjob_contract.api import MixedPrecisionJob

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
#: One MixedPrecisionJob per file; the volumes they need live apart (examples/volumes/).
EXAMPLES = sorted(p for p in (REPO / "examples").rglob("*.yaml") if p.parent.name != "volumes")
PVC_FILE = REPO / "examples/volumes/checkpoints-pvc.yaml"
ALL_FILES = [*EXAMPLES, PVC_FILE]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def jobs() -> dict[str, MixedPrecisionJob]:
    found = {}
    for path in EXAMPLES:
        for doc in documents(path):
            if doc["kind"] == "MixedPrecisionJob":
                found[path.stem] = MixedPrecisionJob.model_validate(doc)
    return found


def claims() -> dict[str, list[str]]:
    return {d["metadata"]["name"]: d["spec"]["accessModes"] for d in documents(PVC_FILE)}


def test_the_examples_are_there() -> None:
    stories = {"quickstart", "fp16-recovery", "ddp-2workers", "kueue-queued", "own-loop", "fp8-fallback"}
    assert {p.stem for p in EXAMPLES} >= stories
    assert PVC_FILE.exists()


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_each_example_starts_by_saying_what_you_will_see(path: Path) -> None:
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header, f"{path.name} must start with a comment"
    text = "\n".join(header)
    assert "kubectl apply" in text
    if path != PVC_FILE:
        assert "You will see" in text


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_each_document_is_valid_for_the_cluster(path: Path) -> None:
    for i, doc in enumerate(documents(path)):
        if doc["kind"] == "PersistentVolumeClaim":
            assert path == PVC_FILE and doc["apiVersion"] == "v1"
            continue
        job, problems = check_document(doc, path.name, i)
        assert job is not None and not problems, [str(p) for p in problems]
        # One job per file, named like the file: `kubectl describe mpj <file name>` works.
        assert doc["metadata"]["name"] == path.stem


def test_mpjob_validate_accepts_every_job_example() -> None:
    files = [str(p) for p in EXAMPLES]
    result = subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "validate", *files], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": ok (1 MixedPrecisionJob)") == len(files)
    assert "warning:" not in result.stdout  # no example holds a setting that never applies


def test_checkpoint_claims_exist_and_fit_the_worker_count() -> None:
    volumes = claims()
    for name, job in jobs().items():
        if job.spec.checkpoint.s3 is not None:
            continue  # a bucket: every pod of every attempt reaches it
        volume = job.spec.checkpoint.volume
        if volume is None or volume.persistent_volume_claim is None:
            assert name == "quickstart", f"{name}: a resumable example keeps its checkpoints on a PVC"
            continue
        modes = volumes[volume.persistent_volume_claim.claim_name]
        if job.spec.workers > 1:
            assert "ReadWriteMany" in modes, f"{name}: pods of several workers share the checkpoint volume"


def _recovers_from_fp16(job: MixedPrecisionJob) -> None:
    spec = job.spec
    overflow = spec.task.args["overflowAtStep"]
    assert spec.precision.mode == "fp16" and spec.precision.fallback[0] == "bf16"
    # There is a good checkpoint before the fault, and steps left after it to show recovery.
    assert spec.checkpoint.every_steps <= overflow < spec.training.steps
    assert spec.run_policy.max_attempts >= 2


def test_quickstart_recovers_in_bf16_on_a_cpu() -> None:
    job = jobs()["quickstart"]
    _recovers_from_fp16(job)
    assert job.spec.resources.gpus_per_worker == 0 and job.spec.workers == 1
    assert job.spec.training.steps <= 500 and job.spec.task.args["nLayer"] <= 2  # minutes on 2 cores


def test_fp16_recovery_runs_on_a_gpu_that_has_bf16() -> None:
    job = jobs()["fp16-recovery"]
    _recovers_from_fp16(job)
    assert job.spec.resources.gpus_per_worker >= 1
    major, minor = (int(x) for x in job.spec.resources.min_compute_capability.split("."))
    assert (major, minor) >= (8, 0), "the bf16 fallback needs compute capability 8.0"


def test_ddp_example_has_two_workers_resuming_in_the_same_precision() -> None:
    job = jobs()["ddp-2workers"]
    assert job.spec.workers == 2 and job.spec.resources.gpus_per_worker >= 1
    assert job.spec.precision.mode in ("bf16", "fp32") and "overflowAtStep" not in job.spec.task.args
    start = first_attempt(job.spec)
    rendered = attempt_job(
        job="ddp-2workers", namespace="default", uid="u", spec=job.spec, start=start, image="mpjob-trainer"
    )
    assert rendered["spec"]["completions"] == rendered["spec"]["parallelism"] == 2


def test_kueue_example_queues_every_attempt() -> None:
    job = jobs()["kueue-queued"]
    assert job.spec.run_policy.queue_name
    for index in (0, 1):
        rendered = attempt_job(
            job="kueue-queued",
            namespace="default",
            uid="u",
            spec=job.spec,
            start=StartAttempt(index=index, precision="fp16", resume_from=None, start_step=0),
            image="mpjob-trainer:0.1.0",
        )
        assert rendered["metadata"]["labels"][KUEUE_QUEUE_LABEL] == job.spec.run_policy.queue_name
        assert rendered["spec"]["suspend"] is True


def test_examples_can_share_one_namespace() -> None:
    names = [doc["metadata"]["name"] for path in ALL_FILES for doc in documents(path)]
    assert len(names) == len(set(names))


def test_own_loop_example_runs_its_own_script_and_recovers_from_fp16() -> None:
    job = jobs()["own-loop"]
    command = job.spec.task.command
    assert command is not None and job.spec.task.builtin is None and job.spec.task.module is None
    script = REPO / "examples/own-loop" / command[1]
    assert script.exists() and "mpjob_trainer import session" in script.read_text()
    overflow = int(command[command.index("--overflow-at") + 1])
    assert job.spec.precision.mode == "fp16" and job.spec.precision.fallback[0] == "bf16"
    assert job.spec.checkpoint.every_steps <= overflow < job.spec.training.steps
    assert job.spec.resources.processes_per_worker == 2 and job.spec.resources.gpus_per_worker == 0


def test_fsdp_example_shards_a_plain_transformer_on_two_workers_of_two_processes() -> None:
    job = jobs()["fsdp"]
    spec = job.spec
    assert spec.parallelism.strategy == "fsdp" and spec.parallelism.activation_checkpointing == "selective"
    assert spec.workers == 2 and spec.resources.processes_per_worker == 2 and spec.resources.gpus_per_worker == 0
    command = spec.task.command
    assert command is not None
    script = (REPO / "examples/fsdp" / command[1]).read_text()
    assert "mpjob_trainer import session" in script and "run.wrap(model, blocks=" in script
    # The optimizer is made after wrap (FSDP2 replaces the parameters with sharded ones).
    assert script.index("run.wrap(model, blocks=") < script.index("run.adamw(")
    overflow = int(command[command.index("--overflow-at") + 1])
    assert spec.precision.mode == "fp16" and spec.precision.fallback[0] == "bf16"
    assert spec.checkpoint.every_steps <= overflow < spec.training.steps
    rendered = attempt_job(job="fsdp", namespace="default", uid="u", spec=spec, start=first_attempt(spec), image="x")
    assert rendered["spec"]["completions"] == 2
    assert rendered["spec"]["template"]["spec"]["containers"][0]["command"][:5] == [
        "mpjob-launch",
        "--nproc-per-worker",
        "2",
        "--workers",
        "2",
    ]
