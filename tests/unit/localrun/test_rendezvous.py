"""Where a local attempt's ranks meet (mpjob.localrun.rendezvous): a distributed attempt's port
is the runner's from before its workers start, so no other process can take it between the
pick and rank 0's bind (that race ended attempts InfraError, EADDRINUSE, having trained
nothing); the ranks, told torch's agent-store switch, meet at the runner's store."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from mpjob.localrun.rendezvous import HOST, Rendezvous

pytestmark = pytest.mark.unit

#: Two ranks that form a gloo group from the environment, as the trainer does, and sum a 1.
RANKS = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2)
one = torch.ones(1)
dist.all_reduce(one)
print(int(one.item()))
dist.destroy_process_group()
"""


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((HOST, port)) != 0


def test_a_distributed_attempts_port_is_held_from_before_its_workers_start_and_let_go_after() -> None:
    meet = Rendezvous(4)
    try:
        env = meet.env()
        assert env["MASTER_ADDR"] == HOST and env["MASTER_PORT"] == str(meet.port)
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True" and meet.hosted
        with socket.socket() as rival, pytest.raises(OSError) as taken:
            rival.bind((HOST, meet.port))
        assert taken.value.errno == errno.EADDRINUSE
        assert not refused(meet.port)  # a rank that comes before the store serves waits in the backlog
        meet.serve()
        client = TCPStore(HOST, meet.port, None, False, timedelta(seconds=10))
        client.set("said", "1")
        assert client.get("said") == b"1"
        del client
    finally:
        meet.close()
    assert refused(meet.port)


def test_ranks_told_the_runners_store_meet_there_and_none_binds_the_port() -> None:
    meet = Rendezvous(2)
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", **meet.env()}
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANKS, str(rank)], env=env, stdout=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    try:
        meet.serve()
        said = [rank.communicate(timeout=120)[0].strip() for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
        meet.close()
    assert [rank.returncode for rank in ranks] == [0, 0] and said == ["2", "2"]


def test_a_world_of_one_forms_no_group_of_ours_and_holds_nothing() -> None:
    meet = Rendezvous(1)
    meet.serve()
    assert not meet.hosted and set(meet.env()) == {"MASTER_ADDR", "MASTER_PORT"}
    assert refused(meet.port)
    meet.close()
