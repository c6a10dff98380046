"""A checkpoint's sha256 (the manifest's state sha256, the one `mpjob run` prints and a mark of
an unloadable checkpoint names) is a function of the training state alone: two saves of one
state, in other folders (another --out, another temporary name) and at other times, name it
alike. Single-file and sharded layouts, the latter in one process without a process group."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.checkpoint.manifest import read_manifest
from mpjob_trainer.checkpoint.sharded import ShardedWriter
from mpjob_trainer.checkpoint.shards import SHARDS

pytestmark = pytest.mark.unit


def a_state(step: int) -> dict[str, object]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    return {"model": model.state_dict(), "step": step, "rng": torch.get_rng_state()}


def test_two_single_file_saves_of_one_state_name_it_alike(tmp_path: Path) -> None:
    first = CheckpointStore(tmp_path / "a", keep=3, config_digest="test").write(10, "bf16", a_state(10))
    time.sleep(1.1)  # createdAt has whole seconds: the manifests differ, the state's sha256 must not
    second = CheckpointStore(tmp_path / "b" / "deeper", keep=3, config_digest="test").write(10, "bf16", a_state(10))
    assert first.ref.path != second.ref.path
    assert first.ref.sha256 == second.ref.sha256
    other = CheckpointStore(tmp_path / "c", keep=3, config_digest="test").write(10, "bf16", a_state(11))
    assert other.ref.sha256 != first.ref.sha256  # the sha256 does tell states apart


def sharded_save(root: Path, step: int) -> Path:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    writer = ShardedWriter(CheckpointStore(root, keep=3, config_digest="test"))
    try:
        result = writer.start(step, "bf16", {SHARDS: {"model": model.state_dict()}, "step": step}).finish()
    finally:
        writer.stager.close()
    return Path(result.ref.path)


def test_two_sharded_saves_of_one_state_name_it_alike(tmp_path: Path) -> None:
    first, second = sharded_save(tmp_path / "a", 10), sharded_save(tmp_path / "b" / "deeper", 10)
    one, two = read_manifest(first), read_manifest(second)
    differing = sorted(name for name in one.files if one.files[name] != two.files.get(name))
    assert differing == []  # DCP's index named its folder and a random save id
    assert one.state_sha256 == two.state_sha256
    assert read_manifest(sharded_save(tmp_path / "c", 11)).state_sha256 != one.state_sha256
