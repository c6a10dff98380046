"""The fp32 replay across pods on the real control plane: two workers (one process each, so
the ranks meet only over the network), a poisoned sample in the second pod's share. Both
ranks replay from the first pod's last good checkpoint and agree: the job fails
NonFiniteInFp32 naming rank 1 and its samples, and neither pod is stopped mid-replay."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob_trainer.data import StepSampler
from tests.integration.operator.conftest import Jobs, Operator, pod_events

pytestmark = pytest.mark.integration

SAMPLES, BATCH, SEED, FAULT = 512, 8, 0, 13


def spec(claim: str, args: dict[str, Any], *, on_bad_data: str = "fail") -> dict[str, Any]:
    """Two workers; a data verdict ends the attempt (`fail`: the verdict is what is read) or is
    skipped by the data rung (`skip`)."""
    return {
        "workers": 2,
        "task": {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": SAMPLES, **args}},
        "training": {"steps": 20, "batchSize": BATCH, "logEvery": 5, "seed": SEED},
        "precision": {"mode": "fp16", "fallback": [], "guard": {"maxNonFiniteLosses": 1, "onBadData": on_bad_data}},
        "checkpoint": {"everySteps": 10, "volume": {"persistentVolumeClaim": {"claimName": claim}}},
        "resources": {"gpusPerWorker": 0},
    }


def test_two_workers_agree_on_a_data_verdict_naming_the_second_pods_rank(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    share = StepSampler(SAMPLES, BATCH, 1, 2, 1, SEED).step_indices(FAULT)  # rank 1's samples of step 13
    jobs.pvc("ckpt")
    jobs.create("poisoned", spec("ckpt", {"nonFiniteSamples": [share[0]]}))
    status = jobs.wait_phase("poisoned", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Failed", status
    (attempt,) = status["attempts"]
    assert (attempt["reason"], attempt["exitCode"], attempt["worldSize"]) == ("NonFiniteInFp32", 45, 2)
    assert f"step {FAULT + 1} is non-finite too" in attempt["message"]
    assert f"(rank 1; samples of that step there: [{', '.join(map(str, share))}])" in attempt["message"]
    replays = [e for e in pod_events(kubeconfig, namespace, "poisoned-a0") if e["event"] == "replay"]
    assert len(replays) == 2  # one per pod: both replayed, neither was stopped first
    for replay in replays:
        assert (replay["verdict"], replay["offendingStep"], replay["ranks"]) == ("data", FAULT, [1])
        assert replay["fromCheckpoint"] and replay["steps"] == FAULT - 10 + 1 and replay["samples"] == share


def test_two_workers_agree_that_an_fp16_overflow_is_the_precisions_fault(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    job = spec("ckpt", {"overflowAtStep": FAULT})
    job["precision"]["fallback"] = ["bf16"]
    jobs.create("overflow", job)
    status = jobs.wait_phase("overflow", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["reason"], first["exitCode"], first["worldSize"]) == ("NumericFault", 42, 2)
    assert f"fp32 replayed steps {FAULT - 2}-{FAULT + 1} finitely: the precision is at fault" in first["message"]
    assert (second["precision"], second["reason"], second["startStep"]) == ("bf16", "Succeeded", 10)
    replays = [e for e in pod_events(kubeconfig, namespace, "overflow-a0") if e["event"] == "replay"]
    assert [(r["verdict"], r["firstStep"], r["steps"], r["fromCheckpoint"]) for r in replays] == [
        ("precision", FAULT, 4, True)
    ] * 2


def test_two_workers_skip_the_sample_the_replay_named_and_succeed_in_one_attempt(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    """The data rung across pods: both roll back to the same checkpoint, quarantine only rank 1's
    bad sample, and train on in fp16; status.skipped names the step and the sample."""
    bad = StepSampler(SAMPLES, BATCH, 1, 2, 1, SEED).step_indices(FAULT)[0]
    jobs.pvc("ckpt")
    jobs.create("skipping", spec("ckpt", {"nonFiniteSamples": [bad]}, on_bad_data="skip"))
    status = jobs.wait_phase("skipping", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded", status
    (attempt,) = status["attempts"]
    assert (attempt["precision"], attempt["worldSize"]) == ("fp16", 2)
    (step,) = status["skipped"]["steps"]
    assert (step["cause"], step["step"], step["samples"]) == ("data", FAULT, [{"first": bad, "last": bad}])
