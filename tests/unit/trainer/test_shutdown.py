"""A rank's shutdown on gloo (mpjob_trainer.distributed.shutdown): the ranks meet and tear their
group down; a rank whose peer lives but never reaches its shutdown (hung where it is) still
leaves, after SHUTDOWN_MEET_SECONDS, where it used to wait for that peer for good."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port

pytestmark = [pytest.mark.unit, pytest.mark.process]

SCRIPT = Path(__file__).with_name("shutdown_script.py")
REPO = Path(__file__).resolve().parents[3]


def rank(index: int, port: int, peer: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, str(SCRIPT), str(index), str(port), peer]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def test_the_ranks_meet_and_tear_their_group_down() -> None:
    port = free_port()
    ranks = [rank(i, port, "meet") for i in (0, 1)]
    outs = [r.communicate(timeout=120)[0] for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0]
    assert outs == [f"rank {i} left, its group torn down\n" for i in (0, 1)]


def test_a_rank_whose_peer_hangs_alive_leaves_without_it() -> None:
    port = free_port()
    hung, crashed = rank(0, port, "hang"), rank(1, port, "hang")
    try:
        out = crashed.communicate(timeout=120)[0]  # before: never, monitored_barrier waited for rank 0
        assert (crashed.returncode, out) == (0, "rank 1 left, its group left as it was\n")
        assert hung.poll() is None  # the peer was alive all along
    finally:
        hung.kill()
        crashed.kill()
        hung.wait()
