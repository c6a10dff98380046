"""Two test clusters' node agents share one hosts file: neither may lose the other's block,
and a resolver reading at any instant finds the lines that were there before."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tests.cluster.nodeagent import hosts

pytestmark = pytest.mark.unit

BASE = "127.0.0.1 localhost\n"
ROUNDS = 300


def _agent(hosts_path: str, state_dir: str, name: str) -> None:
    import os

    os.environ["MPJOB_AGENT_HOSTS_FILE"] = hosts_path
    for n in range(ROUNDS):
        hosts.write_hosts(Path(state_dir), {f"uid-{n}": [f"127.9.0.{n % 250 + 2} {name}-{n}.svc"]})


def test_two_agents_rewriting_at_once_keep_both_blocks_and_the_base_lines(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text(BASE)
    ctx = multiprocessing.get_context("fork")
    agents = [ctx.Process(target=_agent, args=(str(path), str(tmp_path / name), name)) for name in ("left", "right")]
    for agent in agents:
        agent.start()
    emptied = 0
    while any(agent.is_alive() for agent in agents):
        emptied += "localhost" not in path.read_text()
    for agent in agents:
        agent.join(30)
        assert agent.exitcode == 0
    text = path.read_text()
    assert text.startswith(BASE)
    for name in ("left", "right"):
        begin, end = hosts.markers(tmp_path / name)
        assert text.count(begin) == 1 and text.count(end) == 1
        assert f"{name}-{ROUNDS - 1}.svc" in text  # each agent's last block, not one lost to the other's write
    assert emptied == 0  # a lookup never found the base lines gone


def test_an_empty_block_removes_the_agents_lines_and_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "hosts"
    path.write_text(BASE)
    monkeypatch.setenv("MPJOB_AGENT_HOSTS_FILE", str(path))
    hosts.write_hosts(tmp_path / "a", {"u": ["127.9.0.2 a.svc"]})
    assert "a.svc" in path.read_text()
    hosts.write_hosts(tmp_path / "a", {})
    assert path.read_text() == BASE
