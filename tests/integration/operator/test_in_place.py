"""Recovery in place on the real control plane (spec.precision.inPlace): the tutorial's fp16
overflow goes on in bf16 inside the attempt's pod, and the operator records it as the restart
path's attempt (inPlace, recoverySeconds, the same Events and columns), with one Job for the
whole fp16 -> bf16 -> Succeeded story; with inPlace false the same job restarts in a second
Job. Both end with the same final weights, bit for bit."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator, pod_events

pytestmark = pytest.mark.integration

TUTORIAL = Path(__file__).resolve().parents[3] / "examples" / "tutorial"
CLAIM = "in-place-claim"


def tutorial(in_place: bool) -> dict[str, Any]:
    spec = yaml.safe_load((TUTORIAL / "tutorial.yaml").read_text())["spec"]
    spec["task"]["command"] = [sys.executable, str(TUTORIAL / "train.py"), *spec["task"]["command"][2:]]
    spec["precision"]["inPlace"] = in_place
    spec["checkpoint"]["volume"] = {"persistentVolumeClaim": {"claimName": CLAIM}}
    return spec


def final_weights(jobs: Jobs, kubeconfig: str, name: str) -> str:
    (state,) = jobs.checkpoints(kubeconfig, CLAIM, name).glob("step-000000080/state.pt")
    return hashlib.sha256(state.read_bytes()).hexdigest()


def test_a_fallback_in_place_is_one_job_recorded_as_a_restart_would_be_and_ends_bit_identical(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc(CLAIM)
    jobs.create("inplace", tutorial(True))
    jobs.create("restart", tutorial(False))
    done = {name: jobs.wait_phase(name, ("Succeeded", "Failed"), 300) for name in ("inplace", "restart")}
    for status in done.values():
        assert (status["phase"], status["precision"], status["step"]) == ("Succeeded", "bf16", 80), status
        first, second = status["attempts"]
        assert (first["precision"], first["reason"], second["precision"]) == ("fp16", "NumericFault", "bf16")
        assert second["startStep"] == 40
    moved, restarted = done["inplace"]["attempts"][1], done["restart"]["attempts"][1]
    assert moved["inPlace"] is True and "inPlace" not in restarted
    assert 0 <= moved["recoverySeconds"] < 30  # the trainer's figure: fault detected to training again
    # the restart's, from its trainer too: the fault's detection (the report's endedAt) to resumed
    assert moved["recoverySeconds"] < restarted["recoverySeconds"] < 120
    assert jobs.attempt_jobs("inplace") == ["inplace-a0"]  # the pod trained both attempts
    assert jobs.attempt_jobs("restart") == ["restart-a0", "restart-a1"]
    assert done["inplace"]["attemptCounts"]["charged"] == done["restart"]["attemptCounts"]["charged"] == 2
    jobs.events("inplace", "PrecisionFallback", "AttemptEnded")
    cost = done["inplace"]["cost"]
    assert cost["gpuSeconds"] == 0 and done["inplace"]["attempts"][0]["wastedSteps"] == 10  # steps 40-50 again
    assert final_weights(jobs, kubeconfig, "inplace") == final_weights(jobs, kubeconfig, "restart")


SLOW: dict[str, Any] = {
    "task": {
        "builtin": "mlp",
        "args": {"inputs": 8, "hidden": 16, "samples": 256, "overflowAtStep": 25},
    },
    "training": {"steps": 60, "batchSize": 8, "logEvery": 5},
    "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
    "checkpoint": {"everySteps": 10, "volume": {"persistentVolumeClaim": {"claimName": CLAIM}}},
    "resources": {"gpusPerWorker": 0},
}
SLOW["task"]["args"]["stepDelay"] = {"fp16": 0.1, "bf16": 0.2}  # seconds to act before and after the change


@pytest.mark.parametrize("down", ["before", "after"], ids=["down-during-the-change", "killed-after-recording-it"])
def test_an_operator_killed_around_a_change_in_place_records_it_once(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str, down: str
) -> None:
    """Killed while the pod changes precision (the new operator finds the change in the
    trainer's metrics, or in its report if the pod finished meanwhile), or right after it wrote
    the change (the new one reads the same series again): either way the change is one entry."""
    jobs.pvc(CLAIM)
    jobs.create("slow", SLOW)
    if down == "before":
        jobs.wait_phase("slow", "Running", 120)
        assert len(jobs.status("slow")["attempts"]) == 1  # the fault comes at step 25, seconds later
        operator.kill()
        changed = lambda: any(e["event"] == "precisionChanged" for e in pod_events(kubeconfig, namespace, "slow-a0"))  # noqa: E731
        wait_for(changed, 120, message="the pod's change in place")
    else:
        wait_for(lambda: len(jobs.status("slow").get("attempts", [])) == 2, 120, message="the change recorded")
        operator.kill()
    operator.start()
    status = jobs.wait_phase("slow", ("Succeeded", "Failed"), 180)
    assert [(a["index"], a["precision"], a["reason"], a.get("inPlace")) for a in status["attempts"]] == [
        (0, "fp16", "NumericFault", None),
        (1, "bf16", "Succeeded", True),
    ], status
    assert status["attemptCounts"]["started"] == 2 and jobs.attempt_jobs("slow") == ["slow-a0"]


def sharded(in_place: bool) -> dict[str, Any]:
    """FSDP2 over 2 pods, gathering in the attempt's precision: fp16 overflows from step 15 on."""
    return {
        "workers": 2,
        "task": {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 64, "overflowAtStep": 15}},
        "training": {"steps": 30, "batchSize": 8, "logEvery": 5},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "inPlace": in_place},
        "parallelism": {"strategy": "fsdp"},
        "checkpoint": {"everySteps": 5, "volume": {"persistentVolumeClaim": {"claimName": CLAIM}}},
        "resources": {"gpusPerWorker": 0},
    }


def final_shards(jobs: Jobs, kubeconfig: str, name: str) -> dict[str, str]:
    """The final checkpoint's files by sha256 (DCP's `.metadata` names the folder it was written in)."""
    (manifest,) = jobs.checkpoints(kubeconfig, CLAIM, name).glob("step-000000030/manifest.json")
    files = json.loads(manifest.read_text())["files"]
    return {file: meta["sha256"] for file, meta in files.items() if file != ".metadata"}


def test_a_sharded_job_of_two_pods_falls_back_in_place_in_one_job_and_ends_bit_identical(
    operator: Operator, jobs: Jobs, kubeconfig: str
) -> None:
    """Both pods leave their loop and wrap their shards anew in bf16 (FSDP2's policy is fixed when
    it wraps), with no new Job; the shards at the end are the restart path's."""
    jobs.pvc(CLAIM)
    jobs.create("sharded", sharded(True))
    jobs.create("resharded", sharded(False))
    done = {name: jobs.wait_phase(name, ("Succeeded", "Failed"), 420) for name in ("sharded", "resharded")}
    for status in done.values():
        assert (status["phase"], status["precision"], status["step"]) == ("Succeeded", "bf16", 30), status
        ends = [(a["precision"], a["reason"], a["startStep"], a["worldSize"]) for a in status["attempts"]]
        assert ends == [("fp16", "NumericFault", 0, 2), ("bf16", "Succeeded", 15, 2)]
    moved, restarted = done["sharded"]["attempts"][1], done["resharded"]["attempts"][1]
    assert moved["inPlace"] is True and "inPlace" not in restarted
    assert moved["recoverySeconds"] < restarted["recoverySeconds"]
    assert jobs.attempt_jobs("sharded") == ["sharded-a0"] and jobs.attempt_jobs("resharded") == [
        "resharded-a0",
        "resharded-a1",
    ]
    shards = final_shards(jobs, kubeconfig, "sharded")
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt"]
    assert shards == final_shards(jobs, kubeconfig, "resharded")
