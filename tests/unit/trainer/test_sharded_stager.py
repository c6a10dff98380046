"""ShardedWriter across torch versions: torch 2.11's DCP DefaultStager closes its
StateDictStager once it has staged (its copy table emptied, so a second save fails with
KeyError: <class 'type'>); later torch keeps it. The writer takes a new stager for each save, so every
save of a run commits on both. Here, in one process without a process group, the stager is
closed after each save as torch 2.11 closes it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.checkpoint.sharded import ShardedWriter
from mpjob_trainer.checkpoint.shards import SHARDS

pytestmark = pytest.mark.unit


def close_as_torch_2_11_does(writer: ShardedWriter) -> None:
    writer.stager.close()


def test_every_save_commits_when_the_stager_closes_itself_after_staging(tmp_path: Path) -> None:
    writer = ShardedWriter(CheckpointStore(tmp_path, keep=3, config_digest="test"))
    model = nn.Linear(4, 4)
    for step in (5, 10, 15):
        with torch.no_grad():
            model.weight.fill_(float(step))
        result = writer.start(step, "bf16", {SHARDS: {"model": model.state_dict()}, "step": step}).finish()
        assert result.ref.step == step
        close_as_torch_2_11_does(writer)
        restored = {"model": nn.Linear(4, 4).state_dict()}
        dcp.load(restored, checkpoint_id=str(result.ref.path), no_dist=True)
        assert torch.equal(restored["model"]["weight"], model.weight.detach())
    assert [step for step, _ in writer.store.steps()] == [5, 10, 15]


def test_a_save_holds_the_buffers_of_its_step_not_those_the_next_forward_wrote(tmp_path: Path) -> None:
    """The training thread goes on with the next forward pass while the save is staged: a forward
    changes a BatchNorm's running statistics in place (FSDP2 leaves buffers whole, plain tensors,
    among the shards), so the checkpoint of step 5 must hold them as they were at step 5."""
    writer = ShardedWriter(CheckpointStore(tmp_path, keep=3, config_digest="test"))
    model = nn.BatchNorm1d(4)
    model(torch.randn(8, 4) + 3.0)
    at_save = {name: buffer.clone() for name, buffer in model.named_buffers()}
    pending = writer.start(5, "bf16", {SHARDS: {"model": model.state_dict()}, "step": 5})
    model(torch.randn(8, 4) - 7.0)  # step 6's forward, before the writer thread has copied anything
    result = pending.finish()
    restored = {"model": nn.BatchNorm1d(4).state_dict()}
    dcp.load(restored, checkpoint_id=str(result.ref.path), no_dist=True)
    for name, value in at_save.items():
        assert torch.equal(restored["model"][name], value), name
