"""One rank of a sharding case, run as its own process by tests/unit/trainer/test_sharding.py:
`python sharding_ranks.py CASE RANK WORLD OUT`. The ranks meet in a real gloo process group
(a FileStore in OUT) and each writes what it saw to OUT/rank<R>.json."""

from __future__ import annotations

import copy
import io
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from mpjob_contract.api import Guard, PrecisionSpec
from mpjob_contract.parallelism import Parallelism
from mpjob_contract.skipping import SpikeSpec
from mpjob_trainer import sharding
from mpjob_trainer.checkpoint import CheckpointStore, CorruptCheckpoint
from mpjob_trainer.checkpoint.manifest import DCP, Manifest, folder_name, hash_files, read_manifest, write_manifest
from mpjob_trainer.checkpoint.peers import Peers
from mpjob_trainer.checkpoint.shards import rank_file, read_local
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.framework import FrameworkCheckpointer
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.steps import StepNumerics
from mpjob_trainer.spike import SpikeDetector
from mpjob_trainer.tasks.gpt import make_task

CPU = torch.device("cpu")


def gpt(layers: int = 2) -> Any:
    torch.manual_seed(0)  # the same initial weights on every rank, as seed_everything does
    return make_task({"nLayer": layers, "nEmbd": 32, "nHead": 2, "blockSize": 16, "data": "random", "samples": 256})


def wrap(task: Any, world: World, precision: str, **parallelism: Any) -> nn.Module:
    settings = Parallelism.model_validate({"strategy": "fsdp", **parallelism})
    net, _ = sharding.wrap(
        task.model,
        task.blocks,
        world=world,
        device=CPU,
        precision=precision,
        parallelism=settings,  # type: ignore[arg-type]
        keep_fp32=["LayerNorm"],
    )
    return net


def batch(task: Any, rank: int, step: int, size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    items = [task.dataset[(step * 64 + rank * size + i) % len(task.dataset)] for i in range(size)]
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def case_dtypes(world: World, precision: str) -> dict[str, Any]:
    """The dtypes parameters are gathered and computed in, and the sharded masters'."""
    task = gpt()
    net = wrap(task, world, precision)
    seen: dict[str, str] = {}
    for name in ("blocks.0.attn.qkv", "blocks.0.ln_1", "ln_f", "lm_head"):
        module = net.get_submodule(name)
        module.register_forward_pre_hook(lambda m, _a, name=name: seen.__setitem__(name, str(m.weight.dtype)))
    x, y = batch(task, world.rank, 0)
    amp = AttemptPrecision(precision, CPU, PrecisionSpec())  # type: ignore[arg-type]
    with amp.autocast():
        task.loss(net(x), y).backward()
    sharded = {
        name: [str(p.dtype), type(p).__name__, str(p.placements) if isinstance(p, DTensor) else ""]
        for name, p in net.named_parameters()
    }
    grads = sorted({str(p.grad.dtype) for p in net.parameters() if p.grad is not None})
    return {"gathered": seen, "sharded": sharded, "gradDtypes": grads}


def case_overflow(world: World) -> dict[str, Any]:
    """fp16 through the session's step: only rank 1's gradients overflow; who skips?"""
    task = gpt()
    net = wrap(task, world, "fp16")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    amp = AttemptPrecision("fp16", CPU, PrecisionSpec())
    numerics = StepNumerics(amp, NumericGuard(Guard(), CPU, world))
    before = [p.detach().to_local().clone() for p in net.parameters()]  # type: ignore[attr-defined]
    applied, scales = [], []
    for step in range(3):
        x, y = batch(task, world.rank, step)
        with amp.autocast():
            loss = task.loss(net(x), y)
        if step == 1 and world.rank == 1:
            loss = loss * torch.tensor(float("inf"))  # only this rank's gradients overflow
        numerics.backward(loss)
        count = numerics.applied.count
        numerics.step(opt, clip_norm=1.0)
        applied.append(numerics.applied.count - count)
        numerics.close(step + 1, None)
        scales.append(amp.scaler.get_scale())  # type: ignore[union-attr]
        if step == 0:
            before = [p.detach().to_local().clone() for p in net.parameters()]  # type: ignore[attr-defined]
        if step == 1:
            unchanged = all(
                torch.equal(b, p.detach().to_local()) for b, p in zip(before, net.parameters(), strict=True)
            )  # type: ignore[attr-defined]
    return {
        "applied": applied,
        "scales": scales,
        "overflowSteps": numerics.guard.overflow_steps,
        "unchanged": unchanged,
    }


def case_guard_agrees(world: World) -> dict[str, Any]:
    """Ranks that see different losses: does each read's `healthy` agree, and is it right?
    Rank 1 observes a NaN at step 2, rank 0 one at step 7 (the largest count stays 1), rank 0
    reports a NaN at step 15 that it did not train on; steps 16-20 are clean."""
    guard = NumericGuard(Guard(maxNonFiniteLosses=100), CPU, world)
    nan = float("nan")
    observed_nan = {1: {2}, 0: {7}}[world.rank]
    healthy = []
    for step in range(1, 21):
        guard.begin_step()
        guard.observe_loss(torch.tensor(nan if step in observed_nan else 1.0))
        guard.optimizer_stepped()
        guard.end_step(step, uses_scaler=True)
        if step % 5 == 0:
            guard.read(None, reported=nan if (world.rank, step) == (0, 15) else 1.0)
            healthy.append(guard.healthy())
    return {"healthy": healthy, "nonFinite": guard.non_finite_losses}


def case_spikes_agree(world: World) -> dict[str, Any]:
    """Rank 0's loss spikes at step 11, rank 1's at step 14 (0-based), in one read's interval:
    every rank reads the same spiking steps, 11 and 14, and not 12 and 13 between them."""
    guard = NumericGuard(Guard(maxNonFiniteLosses=100), CPU, world)
    guard.spike = SpikeDetector(SpikeSpec(action="rollback", z_score=6, window=8), CPU)
    noise = torch.Generator().manual_seed(world.rank)
    spiking = {0: 11, 1: 14}[world.rank]
    reads = []
    for step in range(1, 16):
        loss = 50.0 if step - 1 == spiking else 1.0 + 0.01 * float(torch.randn((), generator=noise))
        guard.begin_step()
        guard.observe_loss(torch.tensor(loss))
        guard.optimizer_stepped()
        guard.end_step(step, uses_scaler=False)
        if step % 5 == 0:
            spikes = guard.read(None, reported=loss).spikes
            reads.append(list(spikes) if spikes is not None else None)
    return {"spikes": reads}


def case_clip(world: World) -> dict[str, Any]:
    """The clipped norm of the sharded gradients vs an unsharded copy of the model on the
    whole batch (FSDP averages gradients over ranks: the reference averages the ranks' losses)."""
    task = gpt()
    reference = copy.deepcopy(task.model)
    net = wrap(task, world, "fp32")
    x, y = batch(task, world.rank, 0)
    task.loss(net(x), y).backward()
    total = sharding.clip_gradients(list(net.parameters()), 0.05)
    losses = [task.loss(reference(bx), by) for bx, by in (batch(task, r, 0) for r in range(world.size))]
    (sum(losses) / world.size).backward()
    ref_total = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 0.05)
    clipped = {n: p.grad.full_tensor() for n, p in net.named_parameters()}  # type: ignore[union-attr]
    worst = max((clipped[n] - p.grad).abs().max().item() for n, p in reference.named_parameters())  # type: ignore[operator]
    return {
        "norm": total.item(),
        "isDTensor": isinstance(total, DTensor),
        "reference": ref_total.item(),
        "worst": worst,
    }


def case_blocks(world: World) -> dict[str, Any]:
    """The builtin gpt shards per transformer block; selective checkpointing picks every 2nd."""
    task = gpt(layers=3)
    net = wrap(task, world, "bf16", activationCheckpointing="selective")
    x, y = batch(task, world.rank, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        task.loss(net(x), y).backward()
    return {
        "fsdpBlocks": [isinstance(b, FSDPModule) for b in task.blocks],
        "root": isinstance(net, FSDPModule),
        "checkpointed": [isinstance(vars(b).get("forward"), sharding.CheckpointedForward) for b in task.blocks],
        "allDTensor": all(isinstance(p, DTensor) for p in net.parameters()),
        "gradsFinite": all(bool(torch.isfinite(p.grad.to_local()).all()) for p in net.parameters()),  # type: ignore[union-attr]
    }


def case_train(world: World, precision: str) -> dict[str, Any]:
    """A short fsdp run through the session's step arithmetic: does the loss fall?"""
    task = gpt()
    net = wrap(task, world, precision, activationCheckpointing="full")
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    amp = AttemptPrecision(precision, CPU, PrecisionSpec())  # type: ignore[arg-type]
    numerics = StepNumerics(amp, NumericGuard(Guard(), CPU, world))
    losses = []
    for step in range(25):
        x, y = batch(task, world.rank, step % 4)  # four batches, seen again: the loss must fall
        with amp.autocast():
            loss = task.loss(net(x), y)
        numerics.backward(loss)
        numerics.step(opt, clip_norm=1.0)
        numerics.close(step + 1, None)
        losses.append(loss.item())
    return {"first": sum(losses[:4]) / 4, "last": sum(losses[-4:]) / 4, "applied": numerics.applied.count}


def case_live(world: World) -> dict[str, Any]:
    """checkpoint.live against torch's get_state_dict over steps, a schedule and a restore."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from mpjob_trainer.checkpoint.live import LiveStateDicts, identical

    task = gpt()
    net = wrap(task, world, "bf16", activationCheckpointing="full")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    live = LiveStateDicts(net, opt)
    agreed = [identical(live(), get_state_dict(net, [opt]))]  # the first call (learns) before any step
    for step in range(3):
        x, y = batch(task, world.rank, step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            task.loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
        schedule.step()
        agreed.append(identical(live(), get_state_dict(net, [opt])))
    opt.load_state_dict(opt.state_dict())  # a restore puts new state tensors in
    agreed.append(identical(live(), get_state_dict(net, [opt])))
    lrs = [group["lr"] for group in live()[1]["param_groups"]]
    return {"agreed": agreed, "renamed": live.renaming, "lrs": lrs, "expectedLr": opt.param_groups[0]["lr"]}


def case_framework_save(world: World) -> dict[str, Any]:
    """A framework's collective save as the HF Trainer makes it: rank 0 makes the checkpoint's
    folder and writes its files, a slower rank 1 writes its own file into that folder later
    (its RNG state); the session adopts the folder once."""
    root = Path(sys.argv[4]) / "ckpt"
    store = CheckpointStore(root, keep=2, config_digest="d")
    base = Checkpointer(store, world, EventLog(stream=io.StringIO()), TrainerMetrics("j", "ns", world.rank, "fp16"))

    def write(staging: Path) -> Path:
        folder = staging / "checkpoint-5"
        if world.is_main:
            folder.mkdir()
            (folder / "model.bin").write_bytes(b"weights")
        else:
            time.sleep(1.0)
        (folder / f"rng_state_{world.rank}.pth").write_bytes(bytes([world.rank]))
        return folder

    FrameworkCheckpointer(base, write, model=torch.nn.Module()).save(5, "fp16", lambda: {"step": 5}, final=True)
    manifest = json.loads((root / "step-000000005" / "manifest.json").read_text())
    return {"files": sorted(manifest["files"])}


def case_framework_save_to_bucket(world: World) -> dict[str, Any]:
    """The HF Trainer's collective save into a bucket store, as its ranks make it (each makes the
    checkpoint's folder under the path it is given and writes its own RNG state there; rank 0
    the rest), then every rank's resume: the files the committed manifest lists, those of the
    framework checkpoint the rank resumes from, and what the save left in the rank's spool."""
    from memory_bucket import SETTINGS, FolderBucket

    from mpjob_trainer.checkpoint import resume
    from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore

    def store() -> BucketCheckpointStore:
        bucket = FolderBucket(Path(sys.argv[4]) / "bucket")
        return BucketCheckpointStore(
            f"{SETTINGS.url}/ns/j/u1", SETTINGS, keep=2, config_digest="d", job="ns/j/u1", bucket=bucket
        )

    def write(staging: Path) -> Path:
        folder = staging / "checkpoint-5"
        folder.mkdir(parents=True, exist_ok=True)  # as the Trainer's _save_rng_state does, on every rank
        if world.is_main:
            (folder / "model.bin").write_bytes(b"weights")
        (folder / f"rng_state_{world.rank}.pth").write_bytes(bytes([world.rank]))
        return folder

    saving = store()
    base = Checkpointer(saving, world, EventLog(stream=io.StringIO()), TrainerMetrics("j", "ns", world.rank, "fp16"))
    FrameworkCheckpointer(base, write, model=torch.nn.Module()).save(5, "fp16", lambda: {"step": 5}, final=True)
    left = sorted(p.relative_to(saving.root).as_posix() for p in saving.root.rglob("*") if p.is_file())
    manifest = saving.manifest(saving.url(5))
    resuming = store()
    loaded = resume.load(resuming)
    assert loaded is not None
    restored = resuming.framework_folder(loaded[0])
    return {
        "files": sorted(manifest.files) if manifest is not None else None,
        "restored": sorted(p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()),
        "left": [name for name in left if name != ".owner"],
    }


class _Resumed:
    """What Checkpointer.open asks of a TrainingState (no sharded model, no optimizer): its weights
    `w`, 0 until a checkpoint is loaded; its restore fails on rank 1 for the checkpoint of step
    `fails_at` (that rank could not load it)."""

    sharded = None

    def __init__(self, world: World, fails_at: int | None = None) -> None:
        self.world, self.fails_at = world, fails_at
        self.w = 0.0

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return []

    def restore(self, state: dict[str, Any], precision: str, scaler: Any) -> int:
        if self.world.rank == 1 and state["step"] == self.fails_at:
            raise CorruptCheckpoint(f"step {self.fails_at}: rank 1 cannot load it")
        self.w = float(state["w"][0])
        return int(state["step"])


class _Unread(CheckpointStore):
    """A store whose verification of the checkpoint of step `unread` fails on rank 1 once the
    ranks agreed on its manifest (its read of the files failed there)."""

    def __init__(self, root: Path, rank: int, unread: int | None) -> None:
        super().__init__(root, keep=5, config_digest="d", job="ns/j/u1")
        self.rank, self.unread = rank, unread

    def verify(self, path: Path, *, alone: bool = False) -> tuple[Any, dict[str, Any]]:
        verified = super().verify(path, alone=alone)
        if self.rank == 1 and self.unread is not None and path.name == f"step-{self.unread:09d}":
            raise CorruptCheckpoint(f"{path.name}: rank 1 cannot read it")
        return verified


def _resumed(world: World, root: Path, state: _Resumed, unread: int | None = None) -> dict[str, Any]:
    """The step this rank resumes from in `root` (None: a fresh start) and the weights it holds
    then, or the error that ended the attempt instead."""
    store = _Unread(root, world.rank, unread)
    checkpointer = Checkpointer(store, world, EventLog(stream=io.StringIO()), TrainerMetrics("j", "ns", 0, "fp32"))
    try:
        opened = checkpointer.open(state, None, "fp32", None)  # type: ignore[arg-type]
    except Exception as exc:
        return {"error": type(exc).__name__, "w": state.w}
    return {"step": opened[0].step if opened is not None else None, "w": state.w}


def _written(root: Path, *steps: int) -> Path:
    store = CheckpointStore(root, keep=5, config_digest="d", job="ns/j/u1")
    for step in steps:
        store.write(step, "fp32", {"step": step, "w": torch.full((2,), float(step))})
    return root


def case_resume_one_cannot_load(world: World) -> dict[str, Any]:
    """Rank 1 cannot load the newest checkpoint, rank 0 can: both must resume the same one."""
    root = Path(sys.argv[4]) / "ckpt"
    if world.is_main:
        _written(root, 10, 15)
    dist.barrier()
    return _resumed(world, root, _Resumed(world, fails_at=15))


def case_resume_unloadable_on_every_rank(world: World) -> dict[str, Any]:
    """Rank 1 cannot load the newest checkpoint: every rank remembers it as unloadable (rank 0,
    which saves, must replace it when it saves its step again)."""
    root = Path(sys.argv[4]) / "ckpt"
    if world.is_main:
        _written(root, 10, 15)
    dist.barrier()
    store = _Unread(root, world.rank, None)
    checkpointer = Checkpointer(store, world, EventLog(stream=io.StringIO()), TrainerMetrics("j", "ns", 0, "fp32"))
    checkpointer.open(_Resumed(world, fails_at=15), None, "fp32", None)  # type: ignore[arg-type]
    return {"unloadable": sorted(path.name for path in store.unloadable)}


def case_resume_one_cannot_read(world: World) -> dict[str, Any]:
    """Rank 1 cannot read the only checkpoint, rank 0 can: both start fresh from the same weights."""
    root = Path(sys.argv[4]) / "ckpt"
    if world.is_main:
        _written(root, 15)
    dist.barrier()
    return _resumed(world, root, _Resumed(world), unread=15)


def case_resume_loaded_apart(world: World) -> dict[str, Any]:
    """Rank 1 cannot load the only checkpoint, rank 0 loaded it: no fresh start from two states."""
    root = Path(sys.argv[4]) / "ckpt"
    if world.is_main:
        _written(root, 15)
    dist.barrier()
    return _resumed(world, root, _Resumed(world, fails_at=15))


def case_resume_apart_then_again(world: World) -> dict[str, Any]:
    """Rank 1 cannot load the only checkpoint, rank 0 loaded it (ResumedApart); the next attempt's
    processes (fresh stores, fresh states) know it from its mark: they start fresh together."""
    root = Path(sys.argv[4]) / "ckpt"
    if world.is_main:
        _written(root, 15)
    dist.barrier()
    first = _resumed(world, root, _Resumed(world, fails_at=15))
    assert first["error"] == "ResumedApart", first
    return _resumed(world, root, _Resumed(world, fails_at=15))


def case_resume_listed_apart(world: World) -> dict[str, Any]:
    """Another writer commits step 15 between the ranks' listings of the folder (here: rank 1
    lists a folder holding it, rank 0 one without): both must resume the same checkpoint."""
    out = Path(sys.argv[4])
    root = _written(out / f"ckpt-{world.rank}", *((10, 15) if world.rank == 1 else (10,)))
    dist.barrier()
    return _resumed(world, root, _Resumed(world))


def case_resume_upgrade_fails_on_one_rank(world: World) -> dict[str, Any]:
    """A format-1 checkpoint whose optimizer rank 1 cannot bring forward (its optimizer has two
    groups over no registered module's parameters: a ConfigError there), rank 0 can (one group):
    both end with the ConfigError, rank 0 without waiting alone in the ranks' agreement."""
    from mpjob_trainer.session.state import TrainingState

    root = Path(sys.argv[4]) / "ckpt"
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    if world.is_main:
        state = TrainingState({"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})
        folder = Path(_store(root).write(5, "fp32", state.capture(5, 5, "fp32", None)).ref.path)
        written = json.loads((folder / "manifest.json").read_text())
        del written["formatVersion"]  # format 1: written before the builtin's optimizer had two groups
        (folder / "manifest.json").write_text(json.dumps(written))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        other = nn.Linear(4, 1)
        optimizer = torch.optim.SGD([{"params": [other.weight]}, {"params": [other.bias]}], lr=0.1)
    dist.barrier()
    checkpointer = Checkpointer(
        _store(root), world, EventLog(stream=io.StringIO()), TrainerMetrics("j", "ns", 0, "fp32")
    )
    try:
        checkpointer.open(TrainingState({"model": model, "optimizer": optimizer}), None, "fp32", None)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def _store(root: Path) -> CheckpointStore:
    return CheckpointStore(root, keep=5, config_digest="d", job="ns/j/u1")


def _one_writer(folder: Path, lr: float) -> None:
    """A sharded checkpoint of step 5 as one process writes it into `folder`, committed (a small
    model and an optimizer's param_groups of lr `lr`, a non-tensor value)."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    state = {"model": nn.Linear(4, 4).state_dict(), "optimizer": {"param_groups": [{"lr": lr, "params": [0, 1]}]}}
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    torch.save({"step": 5}, folder / rank_file(0))
    files = hash_files(folder, [p for p in folder.rglob("*") if p.is_file()])
    write_manifest(folder, Manifest(5, "fp32", "d", 2, files, "ns/j/u1", layout=DCP, world_size=1))


def case_resume_manifest_rejected_on_one_rank(world: World) -> dict[str, Any]:
    """Rank 1's check of the only (sharded) checkpoint's manifest fails (here: its job's config
    digest differs; a stale or damaged copy would do the same), rank 0's passes: both reject it."""
    from mpjob_trainer.checkpoint import resume

    root = Path(sys.argv[4]) / "ckpt"
    if world.is_main:
        (root / folder_name(5)).mkdir(parents=True)
        _one_writer(root / folder_name(5), 0.1)
    dist.barrier()
    store = CheckpointStore(root, keep=5, config_digest="d" if world.is_main else "changed", job="ns/j/u1")
    loaded = resume.load(store)
    return {"step": loaded[0].step if loaded is not None else None}


def case_agreed_read_failing_on_one_rank(world: World) -> dict[str, Any]:
    """Rank 1's read of a checkpoint fails (an I/O error, no verdict on the checkpoint), rank 0's
    passes: rank 1 raises its error, rank 0 a PeerFailed naming it; neither waits for the other."""
    from mpjob_trainer.checkpoint.peers import Peers, agreed

    def check() -> str:
        if world.rank == 1:
            raise OSError(5, "Input/output error")
        return "manifest"

    try:
        agreed(check, Peers.current())
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None}


def case_bucket_manifest_missing_on_one_rank(world: World) -> dict[str, Any]:
    """Rank 1 finds no manifest of the only (sharded) checkpoint in the bucket, rank 0 finds it:
    both reject it, rank 1 without leaving rank 0 alone in the ranks' fetch of its files."""
    from memory_bucket import SETTINGS, MemoryBucket

    from mpjob_trainer.checkpoint import resume
    from mpjob_trainer.checkpoint.manifest import MANIFEST
    from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore

    source = _copy(world, folder_name(5))
    bucket = MemoryBucket()
    for path in source.iterdir():
        if world.is_main or path.name != MANIFEST:
            bucket.put(f"runs/ns/j/u1/{source.name}/{path.name}", path.read_bytes())
    location = f"{SETTINGS.url}/ns/j/u1"
    store = BucketCheckpointStore(location, SETTINGS, keep=5, config_digest="d", job="ns/j/u1", bucket=bucket)
    loaded = resume.load(store)
    return {"step": loaded[0].step if loaded is not None else None}


def case_restore_fields_rejected_on_one_rank(world: World) -> dict[str, Any]:
    """A sharded checkpoint whose rank file holds no generator state on rank 1, a good one on rank
    0: both reject it, rank 1 without leaving rank 0 alone in the ranks' read of the shards."""
    import torch.distributed.checkpoint as dcp

    from mpjob_trainer.checkpoint.shards import SHARDED_OBJECTS, SHARDS, state_dicts
    from mpjob_trainer.session.state import TrainingState, rng_state

    folder, names = Path(sys.argv[4]) / folder_name(5), {"module": "model"}
    net = wrap(gpt(1), world, "fp32")
    dcp.save(state_dicts({"model": net}, names), checkpoint_id=str(folder))
    if world.is_main:
        files = hash_files(folder, [p for p in folder.rglob("*") if p.is_file()])
        write_manifest(folder, Manifest(5, "fp32", "d", 2, files, "ns/j/u1", layout=DCP, world_size=2))
    dist.barrier()
    own = {"step": 5, "rng": rng_state() if world.is_main else None, SHARDS: str(folder), SHARDED_OBJECTS: names}
    try:
        return {"applied": TrainingState({"model": net}).restore(own, "fp32", None)}
    except CorruptCheckpoint:
        return {"rejected": True}


def _copy(world: World, name: str) -> Path:
    """This rank's own copy of the checkpoint rank 0 wrote into OUT/written (as a download is)."""
    out = Path(sys.argv[4])
    if world.is_main:
        _one_writer(out / "written" / name, 0.1)
    dist.barrier()
    return Path(shutil.copytree(out / "written" / name, out / f"copy{world.rank}" / name))


def case_rank_file_checked_elsewhere(world: World) -> dict[str, Any]:
    """A checkpoint of one process resumed on two: rank 1 loads rank-00000.pt, which rank 0's
    share of the checks reads. Rank 1's copy of it is not the one rank 0 checked."""
    folder = _copy(world, folder_name(5))
    if world.rank == 1:
        torch.save({"step": 5, "planted": True}, folder / rank_file(0))
    try:
        state = read_local(folder, read_manifest(folder), Peers.current())
    except CorruptCheckpoint as exc:
        return {"problem": str(exc)}
    return {"loaded": sorted(state)}


def _ranged_value(world: World, changed: bool) -> dict[str, Any]:
    """A checkpoint of one process in a bucket, verified by two: rank 1 reads the non-tensor value
    in __0_0.distcp (rank 0's share) by a ranged read; `changed`: the object has changed (another
    lr, the same size) since rank 0 checked it."""
    from memory_bucket import MemoryBucket

    from mpjob_trainer.checkpoint.bucket_files import BucketFiles
    from mpjob_trainer.checkpoint.shards import LISTED

    out, name = Path(sys.argv[4]), folder_name(5)
    if world.is_main:
        _one_writer(out / "later" / name, 0.5)
    source = _copy(world, name)
    bucket = MemoryBucket()
    for path in source.iterdir():
        bucket.put(f"ckpt/{name}/{path.name}", path.read_bytes())
    if changed and world.rank == 1:
        bucket.put(f"ckpt/{name}/__0_0.distcp", (out / "later" / name / "__0_0.distcp").read_bytes())
    folder = out / f"fetched{world.rank}" / name
    files = BucketFiles(bucket, f"ckpt/{name}", folder)
    shards = read_local(folder, read_manifest(source), Peers.current(), files=files)[LISTED]
    info = next(info for i, info in shards.index().storage_data.items() if i.fqn.endswith(".lr"))
    try:
        raw = shards.read(info.relative_path, info.offset, info.length)
    except CorruptCheckpoint as exc:
        return {"problem": str(exc)}
    return {"value": torch.load(io.BytesIO(raw), weights_only=True)}


def case_ranged_value_changed(world: World) -> dict[str, Any]:
    return _ranged_value(world, changed=True)


def case_ranged_value_unchanged(world: World) -> dict[str, Any]:
    return _ranged_value(world, changed=False)


def _sharded_commit(world: World, objects: dict[str, Any], names: dict[str, str], folder: Path) -> None:
    """`objects`' sharded checkpoint of step 5 in `folder`, every rank's shards and rank file,
    committed by rank 0 (its manifest listing them all)."""
    import torch.distributed.checkpoint as dcp

    from mpjob_trainer.checkpoint.shards import state_dicts

    dcp.save(state_dicts(objects, names), checkpoint_id=str(folder))
    torch.save({"step": 5}, folder / rank_file(world.rank))
    dist.barrier()
    if world.is_main:
        files = hash_files(folder, [p for p in folder.rglob("*") if p.is_file()])
        write_manifest(folder, Manifest(5, "fp32", "d", 2, files, "ns/j/u1", layout=DCP, world_size=world.size))
    dist.barrier()


def _fsdp_pair(world: World, make: Any) -> dict[str, Any]:
    """A GPT of one block sharded over the ranks, and the optimizer `make` builds, one step taken."""
    task = gpt(1)
    net = wrap(task, world, "fp32")
    optimizer = make(net.parameters())
    x, y = batch(task, world.rank, 0)
    task.loss(net(x), y).backward()
    optimizer.step()
    return {"model": net, "optimizer": optimizer}


def case_optimizer_switched(world: World) -> dict[str, Any]:
    """A sharded checkpoint of an FSDP run on SGD, resumed by the same model on AdamW: each rank
    says how the resume ended, and whether its weights are still its own."""
    from mpjob_trainer.checkpoint import resume
    from mpjob_trainer.checkpoint.shards import LISTED, SHARDS, restore_shards

    root, names = Path(sys.argv[4]) / "ckpt", {"module": "model", "optimizer": "optimizer"}
    sgd = _fsdp_pair(world, lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))
    _sharded_commit(world, sgd, names, root / folder_name(5))
    run = _fsdp_pair(world, lambda params: torch.optim.AdamW(params, lr=0.1))
    before = [p.to_local().clone() for p in run["model"].parameters()]
    store = CheckpointStore(root, keep=5, config_digest="d", job="ns/j/u1")
    try:
        resume.load(store, restore=lambda found: restore_shards(Path(found[1][SHARDS]), run, names, found[1][LISTED]))
        outcome = {"error": None, "message": ""}
    except Exception as exc:
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    after = [p.to_local() for p in run["model"].parameters()]
    return {**outcome, "unchanged": all(torch.equal(a, b) for a, b in zip(before, after, strict=True))}


def case_restore_check_fails_on_one_rank(world: World) -> dict[str, Any]:
    """A sound sharded checkpoint whose index rank 1 alone cannot read (its read of the bucket
    timed out) while the ranks check it before DCP loads: each rank says how the resume ended
    ("hung": still waiting after a minute, the rank then leaves at once)."""
    import os
    import threading

    from mpjob_trainer.checkpoint import dcp_fit, resume
    from mpjob_trainer.checkpoint.shards import LISTED, SHARDS, restore_shards

    root, names = Path(sys.argv[4]) / "ckpt", {"module": "model", "optimizer": "optimizer"}
    run = _fsdp_pair(world, lambda params: torch.optim.AdamW(params, lr=0.1))
    _sharded_commit(world, run, names, root / folder_name(5))
    if world.rank == 1:

        def timed_out(*_: Any, **__: Any) -> None:
            raise OSError("reading the checkpoint bucket timed out")

        dcp_fit.check_fit = timed_out  # type: ignore[assignment]
    outcome: dict[str, Any] = {"error": "hung", "message": ""}

    def load() -> None:
        try:
            resume.load(_store(root), restore=lambda f: restore_shards(Path(f[1][SHARDS]), run, names, f[1][LISTED]))
            outcome.update(error=None)
        except Exception as exc:
            outcome.update(error=type(exc).__name__, message=str(exc))

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(60)
    if outcome["error"] == "hung":
        (Path(sys.argv[4]) / f"rank{world.rank}.json").write_text(json.dumps(outcome))
        os._exit(0)  # a collective that never ends: no teardown would
    return outcome


def main() -> None:
    case, rank, size, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    torch.set_num_threads(1)
    world = World(rank=rank, size=size, local_rank=rank)
    if size > 1:  # a world of one makes its own group (sharding.ensure_process_group)
        store = dist.FileStore(str(out / "store"), size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    name, _, precision = case.partition(":")
    runs = {"dtypes": case_dtypes, "train": case_train}
    result = runs[name](world, precision) if name in runs else globals()[f"case_{name}"](world)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()  # no rank tears the group down while another's collectives are in flight
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
