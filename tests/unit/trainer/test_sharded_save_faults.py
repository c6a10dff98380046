"""Sharded saves that fail (checkpoint.sharded): a part that fails on one rank only, on real gloo
process groups on the CPU (2 processes of tests/unit/trainer/sharded_save_ranks.py), and shards
that could not be written."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.checkpoint.manifest import read_manifest
from mpjob_trainer.checkpoint.sharded import ShardedWriter, StateOnlyWriter
from mpjob_trainer.checkpoint.shards import SHARDED_OBJECTS, SHARDS, state_dicts
from tests import warm

pytestmark = pytest.mark.unit

RANKS = Path(__file__).with_name("sharded_save_ranks.py")


@pytest.mark.process
def test_a_staging_copy_failing_on_one_rank_fails_the_save_on_every_rank_and_the_next_one_commits(
    tmp_path: Path,
) -> None:
    """Before, the rank whose copy failed never joined DCP's planning, and the other waited in it:
    that save hung, and the next save's collectives paired one rank's step with the other's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    procs = [
        warm.Popen(
            [sys.executable, str(RANKS), str(r), "2", str(tmp_path)],
            env=env,
            stdout=warm.PIPE,
            stderr=warm.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all("hung" not in saves for saves in outcomes), outcomes
    for r, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {r} exited {proc.returncode}:\n{out[-3000:]}"
    for first, *_ in outcomes:
        assert first.startswith("OSError") and "rank 1" in first and "staging copy" in first, outcomes
    assert [later for _, *later in outcomes] == [["saved step 10"]] * 2, outcomes
    ckpt = tmp_path / "ckpt"
    assert not (ckpt / "step-000000005").exists() and read_manifest(ckpt / "step-000000010").world_size == 2
    assert not list(ckpt.glob(".tmp-*"))


def test_a_save_whose_shards_could_not_be_written_fails_as_an_os_error_and_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while DCP writes: before, DCP's CheckpointException (a BaseException) went past
    the save's own handling, its partial files were left in a `.tmp-*` folder holding the space the
    next save needed, and a final save's failure was never logged as one (checkpointFailed)."""
    store = CheckpointStore(tmp_path, keep=3, config_digest="test", job="ns/job/u1")
    writer, pair = ShardedWriter(store), {"module": "model"}
    state = {SHARDS: state_dicts({"model": nn.Linear(4, 4)}, pair), "step": 5, SHARDED_OBJECTS: pair}
    written = StateOnlyWriter.write_data

    def disk_full(self: StateOnlyWriter, plan: Any, planner: Any) -> Any:
        Path(self.path, "__0_0.distcp").write_bytes(b"\0" * 4096)  # what it wrote before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(StateOnlyWriter, "write_data", disk_full)
    with pytest.raises(OSError, match=r"rank 0: OSError: .*No space left on device"):
        writer.start(5, "bf16", state).finish()
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(StateOnlyWriter, "write_data", written)
    assert writer.start(10, "bf16", {**state, "step": 10}).finish().ref.step == 10
