"""CheckpointsFailing on the real control plane, after the attempt it was raised for has stopped:
the checkpoint its trainer wrote on SIGTERM, named by its termination report, clears it, though
no reading of a suspended job's metrics comes to say so."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import paced, wait_for
from tests.integration.operator.conftest import UNTIL_STOPPED, Jobs, Operator, gpt_spec

pytestmark = pytest.mark.integration

EVERY = 10


def failing(status: dict[str, Any]) -> tuple[str, str] | None:
    found = [(c["status"], c["reason"]) for c in status.get("conditions", []) if c["type"] == "CheckpointsFailing"]
    return found[0] if found else None


def test_the_checkpoint_written_on_sigterm_clears_checkpoints_failing_on_a_suspended_job(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=EVERY)
    spec["precision"] = {"mode": "bf16"}
    spec["task"]["args"]["stepDelay"] = paced(0.05)
    jobs.create("lapsing", spec)
    volume = jobs.checkpoints(kubeconfig, "ckpt", "lapsing")
    wait_for(lambda: list(volume.glob("step-*/manifest.json")), 120, message="a checkpoint")
    newest = max(int(p.parent.name.split("-")[1]) for p in volume.glob("step-*/manifest.json"))
    # A file where each later save's folder goes: every periodic save fails, training goes on.
    blocked = [volume / f"step-{step:09d}" for step in range(newest + EVERY, newest + 400 * EVERY, EVERY)]
    for place in blocked:
        place.touch()
    lapsed = jobs.wait_status("lapsing", lambda s: failing(s) == ("True", "CheckpointsFailing"), 120, "lapsed")
    assert lapsed["phase"] == "Running" and lapsed["step"] - lapsed["lastCheckpoint"]["step"] >= 3 * EVERY
    jobs.patch_spec("lapsing", {"runPolicy": {"suspend": True}})
    for place in blocked:  # the save on SIGTERM lands, whichever step it stops at
        place.unlink()
    jobs.wait_phase("lapsing", "Suspended", 60)
    status = jobs.wait_status(
        "lapsing", lambda s: s["lastCheckpoint"]["step"] > lapsed["lastCheckpoint"]["step"], 90, "the SIGTERM save"
    )
    assert status["lastCheckpoint"]["step"] >= lapsed["step"], status
    status = jobs.wait_status("lapsing", lambda s: failing(s) != ("True", "CheckpointsFailing"), 30, "cleared")
    assert failing(status) == ("False", "CheckpointsCurrent"), status
    assert "CheckpointsCurrent" in {e.reason for e in jobs.events("lapsing", "CheckpointsCurrent")}
