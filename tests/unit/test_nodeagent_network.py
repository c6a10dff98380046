"""The test node runs pods on the machine's network: each attempt's rendezvous gets a port of
its own, the same for all its pods, so two multi-process jobs never both listen on 29500."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.cluster.nodeagent.network import RENDEZVOUS_PORTS, own_rendezvous

pytestmark = pytest.mark.unit


def pod(namespace: str, job: str, index: int) -> Any:
    labels = {"batch.kubernetes.io/job-name": job}
    return SimpleNamespace(metadata=SimpleNamespace(namespace=namespace, name=f"{job}-{index}-x", labels=labels))


def env_of(p: Any, addr: str = "wide-a0-0.wide-a0.ns.svc") -> dict[str, str]:
    env = {"MASTER_ADDR": addr, "MASTER_PORT": "29500", "OTHER": "1"}
    own_rendezvous(p, env)
    return env


def test_every_pod_of_an_attempt_gets_the_same_port_and_other_attempts_their_own() -> None:
    first, second = env_of(pod("ns", "wide-a0", 0)), env_of(pod("ns", "wide-a0", 1))
    assert first == second and int(first["MASTER_PORT"]) in RENDEZVOUS_PORTS and first["OTHER"] == "1"
    others = {
        env_of(pod(ns, job, 0))["MASTER_PORT"] for ns in ("ns", "t-1", "t-2") for job in ("wide-a1", "evicted-a0")
    }
    assert first["MASTER_PORT"] not in others and len(others) == 6


def test_a_pod_without_a_rendezvous_is_left_alone() -> None:
    env = {"OTHER": "1"}
    own_rendezvous(pod("ns", "single-a0", 0), env)
    assert env == {"OTHER": "1"}
