"""The SDK hooks the framework adapters stand on: the store adopts a framework's checkpoint
folder (every file in the manifest, corrupt ones skipped, keep-K, staging cleaned), the guard
sees a fused optimizer's skipped steps, and the extras never bring a Kubernetes client."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

import pytest
import torch

from mpjob_contract.api import Guard
from mpjob_trainer.checkpoint import FRAMEWORK, CheckpointStore, rank_files, resume
from mpjob_trainer.checkpoint.objects import Published, new_writer
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.distributed import World
from mpjob_trainer.guard import NumericGuard
from tests.unit.test_images import TRAINER, lock_closure, parse, run_commands
from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket
from tests.unit.trainer.test_sharding import ranks

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[3]


def framework_save(store: CheckpointStore | BucketCheckpointStore, step: int) -> Path:
    """What a framework writes: a folder of files, some nested."""
    staging = store.staging(f".tmp-framework-{step:09d}")
    written = staging / f"checkpoint-{step}"
    (written / "nested").mkdir(parents=True)
    (written / "model.bin").write_bytes(bytes([step]) * 1000)
    (written / "nested/optimizer.bin").write_bytes(b"adam" * step)
    return written


@pytest.mark.process
def test_a_framework_folder_is_adopted_only_once_every_rank_has_written_into_it(tmp_path: Path) -> None:
    """Two ranks save collectively, the second one's file last: it is in the checkpoint (its
    rank neither failed writing into a folder already moved nor was left out)."""
    for seen in ranks(tmp_path, "framework_save", 2):
        framework = ["framework/model.bin", "framework/rng_state_0.pth", "framework/rng_state_1.pth"]
        assert seen["files"] == [*framework, "state.pt"]


@pytest.mark.process
def test_every_ranks_framework_files_reach_a_bucket_checkpoint_and_its_resume(tmp_path: Path) -> None:
    """To a bucket each rank's staging is its own spool's: a rank's own files (the HF Trainer's
    RNG state of that rank) must go up into the checkpoint rank 0 commits, not stay behind in
    its spool, and every rank must find its own in the checkpoint it resumes from (an exact
    resume: the Trainer only warns when one is missing)."""
    framework = ["framework/model.bin", "framework/rng_state_0.pth", "framework/rng_state_1.pth"]
    for seen in ranks(tmp_path, "framework_save_to_bucket", 2, timeout=120):
        assert seen["files"] == [*framework, "state.pt"], seen
        assert seen["restored"] == ["model.bin", "rng_state_0.pth", "rng_state_1.pth"], seen
        assert seen["left"] == [], seen


def test_files_other_ranks_published_go_when_the_save_commits_none(tmp_path: Path) -> None:
    """What the other ranks of a framework's save uploaded into its writer's folder (no manifest
    names it yet) is deleted when rank 0 commits nothing: a rank's upload failed (the save fails
    too: a partial checkpoint is none), or this job's checkpoint of the step is kept."""
    bucket = MemoryBucket()
    store = BucketCheckpointStore(
        f"{SETTINGS.url}/ns/j/u1", SETTINGS, keep=2, config_digest="d", job="ns/j/u1", bucket=bucket
    )

    def joined(*problems: str) -> rank_files.Joined:
        writer = new_writer()
        bucket.put(f"runs/ns/j/u1/step-000000005/{writer}/framework/rng_state_1.pth", b"\x01")
        meta = {"sha256": hashlib.sha256(b"\x01").hexdigest(), "bytes": 1}
        return rank_files.Joined(Published(writer, {"framework/rng_state_1.pth": meta}), list(problems))

    with pytest.raises(OSError, match="rank 2: OSError: disk full"):
        rank_files.write(store, 5, "fp16", {"step": 5}, framework_save(store, 5), joined("rank 2: OSError: disk full"))
    assert store.steps() == [] and not [key for key in bucket.objects if "rng_state" in key]
    first = rank_files.write(store, 5, "fp16", {"step": 5}, framework_save(store, 5), joined())
    assert "framework/rng_state_1.pth" in (store.manifest(store.url(5)) or pytest.fail()).files
    kept = rank_files.write(store, 5, "fp16", {"step": 5}, framework_save(store, 5), joined())
    assert kept.ref == first.ref
    assert len([key for key in bucket.objects if "rng_state" in key]) == 1  # the committed one's only


def test_store_adopts_a_framework_folder_and_checks_every_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2, config_digest="d")
    for step in (10, 20, 30):
        store.write(step, "fp16", {"step": step}, adopt=framework_save(store, step))
    assert [s for s, _ in store.steps()] == [20, 30]  # keep 2
    manifest = json.loads((tmp_path / "step-000000030/manifest.json").read_text())
    assert set(manifest["files"]) == {"state.pt", "framework/model.bin", "framework/nested/optimizer.bin"}
    assert (tmp_path / "step-000000030" / FRAMEWORK / "model.bin").read_bytes() == bytes([30]) * 1000

    (tmp_path / "step-000000030/framework/nested/optimizer.bin").write_bytes(b"torn")
    rejected: list[str] = []
    store.log = lambda event, **f: rejected.append(f["problem"])
    ref, state = resume.load(store)  # type: ignore[misc]
    assert (ref.step, state["step"]) == (20, 20)
    (problem,) = rejected
    assert problem.startswith("step-000000030: framework/nested/optimizer.bin is 4 bytes, its manifest says")

    framework_save(store, 40)  # a framework killed mid-save leaves its staging folder
    store.clean_stale()
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize(
    "plant",
    [
        lambda framework: (framework / "scaler.pt").write_bytes(b"planted"),
        lambda framework: (framework / "nested/rng_state_0.pth").write_bytes(b"planted"),
        lambda framework: (framework / "nested/more").symlink_to(framework.parent.parent),
    ],
    ids=["a-file", "a-nested-file", "a-link-to-a-folder"],
)
def test_a_framework_folder_holding_what_its_manifest_does_not_list_is_passed_over(tmp_path: Path, plant) -> None:
    """The framework loads every file of its checkpoint it knows (an HF Trainer: a scaler.pt, a
    pytorch_model.bin, rng_state_<rank>.pth whenever they exist): one dropped beside the files the
    manifest lists reached it unchecked."""
    store = CheckpointStore(tmp_path, keep=3, config_digest="d")
    for step in (10, 20):
        store.write(step, "fp16", {"step": step}, adopt=framework_save(store, step))
    plant(tmp_path / "step-000000020" / FRAMEWORK)
    rejected: list[str] = []
    store.log = lambda event, **f: rejected.append(f["problem"])
    ref, state = resume.load(store)  # type: ignore[misc]
    assert (ref.step, state["step"]) == (10, 10)
    (problem,) = rejected
    assert problem.startswith("step-000000020: framework/") and problem.endswith("is not in its manifest"), problem


def test_guard_counts_a_fused_optimizers_skipped_step() -> None:
    """transformers' default optimizer is fused AdamW: GradScaler calls its step() even for
    overflowing gradients, and the optimizer skips the update itself."""
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([weight], lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    guard = NumericGuard(Guard(), torch.device("cpu"), World(rank=0, size=1, local_rank=0))
    applied: list[bool] = []
    optimizer.register_step_post_hook(lambda opt, *_: applied.append(guard.optimizer_stepped(opt)))
    for grad in (float("inf"), 1.0):
        guard.begin_step()
        scaler.scale((weight * grad).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        guard.end_step(1, uses_scaler=True)
    assert applied == [False, True] and guard.overflow_steps == 1 and guard.consecutive_overflows == 0


def test_framework_extras_are_pinned_installed_by_the_image_and_free_of_kubernetes() -> None:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    (trainer,) = [p for p in lock["package"] if p["name"] == "mpjob-trainer"]
    extras = {name: {d["name"] for d in deps} for name, deps in trainer["optional-dependencies"].items()}
    assert extras == {
        "hf": {"transformers", "accelerate"},
        "lightning": {"lightning"},
        "fp8": {"torchao"},
        "s3": {"boto3"},
        "mlflow": {"mlflow-skinny"},
    }
    pins = tomllib.loads((REPO / "trainer-image/pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert all(re.fullmatch(r"[\w-]+==[\d.]+", pin) for pins_ in pins.values() for pin in pins_)
    closure = set().union(*(lock_closure(name) for names in extras.values() for name in names))
    assert "torch" in closure and not {"kopf", "kubernetes"} & closure
    runs = run_commands(parse(TRAINER)[0])
    assert all(f"--extra {name}" in runs for name in extras)
    # The workspace's dev environment (scripts/setup.sh: --group dev) has them: tests import them.
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]
    assert {"include-group": "frameworks"} in groups["dev"]
    assert groups["frameworks"] == ["mpjob-trainer[hf,lightning,fp8,s3]"]
    assert {"include-group": "tracking"} in groups["dev"] and "mpjob-trainer[mlflow]" in groups["tracking"]


@pytest.mark.parametrize("as_list", [False, True])
def test_lightning_settings_keep_a_scripts_callback_and_plugin_given_alone_or_in_a_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_list: bool
) -> None:
    """Lightning takes one callback (or plugin) or a list of them: mpjob's come first either way."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.plugins.environments import LightningEnvironment

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    job = spec(task={"command": ["python", "train.py"]}, precision={"mode": "bf16"})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "bf16"))
    try:
        mine, environment = LearningRateMonitor(), LightningEnvironment()
        given = (
            {"callbacks": [mine], "plugins": [environment]} if as_list else {"callbacks": mine, "plugins": environment}
        )
        settings = mpjob_lightning.trainer_settings(run, logger=False, **given)
        assert [type(c) for c in settings["callbacks"]] == [mpjob_lightning.MpjobCallback, LearningRateMonitor]
        assert settings["plugins"][-1] is environment and isinstance(
            settings["plugins"][0], mpjob_lightning.SessionAutocast
        )
        trainer = L.Trainer(**settings)
        assert mine in trainer.callbacks  # Lightning took both
    finally:
        run.close()


def test_a_hugging_face_trainers_checkpoints_leave_no_staging_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer writes `checkpoint-N` into a staging folder and the store moves that folder in:
    the staging folder itself goes too, not one empty `.tmp-framework-*` per checkpoint for the
    whole attempt."""
    from transformers import Trainer

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf
    from tests.unit.trainer.test_adapters_arguments import Regression

    data = [{"x": x, "labels": y} for x, y in zip(torch.randn(32, 4), torch.randn(32), strict=True)]
    training = {"steps": 6, "batchSize": 4, "seed": 0}
    job = spec(task={"command": ["python", "train.py"]}, training=training, checkpoint={"everySteps": 2, "keep": 5})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        args = mpjob_hf.training_arguments(run)
        mpjob_hf.train(run, Trainer(model=Regression(), args=args, train_dataset=data))
    finally:
        run.close()
    folders = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name != ".hf-output")  # the output_dir
    assert folders == [f"step-{step:09d}" for step in (0, 2, 4, 6)]
