"""A sharded save whose part fails on one rank only (checkpoint.sharded), on real gloo process
groups on the CPU: 2 processes of tests/unit/trainer/sharded_save_ranks.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mpjob_trainer.checkpoint.manifest import read_manifest
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
