"""A sharded checkpoint on a volume is loaded from the very bytes its sha256 was checked on, each
file read once: a shard file or DCP's index replaced right after its check is never loaded."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from mpjob_trainer.checkpoint import CheckpointStore, checked, manifest
from mpjob_trainer.checkpoint.manifest import hash_files
from mpjob_trainer.checkpoint.shards import INDEX, LISTED, rank_file, restore_shards

pytestmark = pytest.mark.unit

NAMES = {"module": "model", "optimizer": "optimizer"}


def objects_of(seed: int, width: int = 4) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width))
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=0.1)}


def commit(store: CheckpointStore, step: int, width: int = 4) -> Path:
    """A sharded checkpoint of one rank at `step`, committed as the trainer commits one."""
    objects = objects_of(step, width)
    model_sd, optim_sd = get_state_dict(objects["model"], [objects["optimizer"]])
    tmp = store.root / f".tmp-{step:09d}-0"
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"step": step}, tmp / rank_file(0))
    files = hash_files(tmp, [p for p in tmp.rglob("*") if p.is_file()])
    return Path(store.commit(tmp, step, "bf16", files, world_size=1).ref.path)


def store_at(root: Path) -> CheckpointStore:
    return CheckpointStore(root, keep=5, config_digest="d1", job="ns/j/u1")


def swap_after_check(monkeypatch: pytest.MonkeyPatch, name: str, planted: Path) -> list[str]:
    """Once the sha256 of the file `name` is compared with its manifest's, the file is replaced by
    `planted` (the same size, other values). Returns the names whose checks have passed."""
    seen: list[str] = []
    compare = manifest.same_sha256

    def then_swap(folder: Path, file: str, actual: str, meta: dict[str, Any]) -> None:
        compare(folder, file, actual, meta)
        seen.append(file)
        if file == name and seen.count(name) == 1:
            shutil.copyfile(planted, folder / name)

    monkeypatch.setattr(manifest, "same_sha256", then_swap)
    monkeypatch.setattr(checked, "same_sha256", then_swap)
    return seen


@pytest.mark.parametrize("restore_alone", [False, True], ids=["verified", "restored-unverified"])
def test_a_shard_swapped_right_after_its_check_is_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_alone: bool
) -> None:
    """__0_0.distcp replaced by another checkpoint's (same shapes) once its check passed: the
    objects get the values checked, never the planted ones."""
    store = store_at(tmp_path / "ckpt")
    folder = commit(store, 20)
    planted = commit(store_at(tmp_path / "other"), 30) / "__0_0.distcp"
    assert planted.read_bytes() != (folder / "__0_0.distcp").read_bytes()
    seen = swap_after_check(monkeypatch, "__0_0.distcp", planted)
    listed = None if restore_alone else store.verify(folder)[1][LISTED]
    objects = objects_of(0)
    restore_shards(folder, objects, NAMES, listed)
    assert "__0_0.distcp" in seen  # the swap happened
    assert (folder / "__0_0.distcp").read_bytes() == planted.read_bytes()
    written = objects_of(20)["model"].state_dict()
    assert all(torch.equal(v, written[k]) for k, v in objects["model"].state_dict().items())


def test_an_index_swapped_right_after_its_check_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP's index replaced by garbage of its size once its check passed: verify and restore read
    the index that was checked."""
    store = store_at(tmp_path / "ckpt")
    folder = commit(store, 20)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\0" * (folder / INDEX).stat().st_size)
    swap_after_check(monkeypatch, INDEX, garbage)
    _, state = store.verify(folder)
    objects = objects_of(0)
    restore_shards(folder, objects, NAMES, state[LISTED])
    assert (folder / INDEX).read_bytes() == garbage.read_bytes()
    written = objects_of(20)["model"].state_dict()
    assert all(torch.equal(v, written[k]) for k, v in objects["model"].state_dict().items())


def _bytes_read() -> int:
    """What this process has read through read(2) so far (Linux: /proc/self/io)."""
    text = Path("/proc/self/io").read_text().splitlines()
    return int(next(line for line in text if line.startswith("rchar")).split()[1])


def test_a_sharded_checkpoint_is_read_once_from_verification_to_restore(tmp_path: Path) -> None:
    """Verifying and restoring a ~12 MB sharded checkpoint reads its files once, not twice."""
    store = store_at(tmp_path / "ckpt")
    restore_shards(commit(store, 10), objects_of(0), NAMES)  # the readers' code loaded before counting
    folder = commit(store, 20, width=1000)
    size = sum(p.stat().st_size for p in folder.iterdir())
    objects = objects_of(0, width=1000)
    before = _bytes_read()
    _, state = store.verify(folder)
    restore_shards(folder, objects, NAMES, state[LISTED])
    read = _bytes_read() - before
    assert size <= read < 1.2 * size, (read, size)
    assert torch.equal(objects["model"][0].weight, objects_of(20, width=1000)["model"][0].weight)
