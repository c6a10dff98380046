"""The data rung through the operator: a poisoned sample costs a rollback and that sample, not
the precision or the job; status.skipped and a DataSkipped Event name the step and sample."""

from __future__ import annotations

import pytest
import torch

from tests.integration.operator.conftest import Jobs, Operator, gpt_spec

pytestmark = pytest.mark.integration

MLP = {"inputs": 8, "hidden": 16, "samples": 64}


def test_a_poisoned_sample_is_skipped_and_the_job_succeeds_in_its_first_precision(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=40)
    spec["task"] = {"builtin": "mlp", "args": {**MLP, "nonFiniteSamples": [17]}}  # back in each of 5 epochs
    spec["training"]["batchSize"] = 8
    jobs.create("poisoned", spec)
    status = jobs.wait_phase("poisoned", ("Failed", "Succeeded"), 240)
    assert status["phase"] == "Succeeded", status
    (only,) = status["attempts"]  # no fallback, no second attempt
    assert (only["precision"], only["reason"]) == ("fp16", "Succeeded") and status["precision"] == "fp16"
    assert not any(c["type"] == "PrecisionFallback" for c in status["conditions"])
    skipped = status["skipped"]
    assert (skipped["count"], skipped["samples"]) == (1, 1)
    (step,) = skipped["steps"]
    assert step["cause"] == "data" and step["samples"] == [{"first": 17, "last": 17}]
    events = jobs.core.list_namespaced_event(namespace, field_selector="involvedObject.name=poisoned").items
    (said,) = [e for e in events if e.reason == "DataSkipped"]
    assert said.type == "Warning" and f"step {step['step']} skipped" in said.message
    assert said.message.endswith("samples 17")
    final = jobs.checkpoints(kubeconfig, "ckpt", "poisoned") / "step-000000040" / "state.pt"
    held = torch.load(final, weights_only=True)["quarantine"]
    assert held["records"] == [[step["step"], "data", [17]]]  # a later attempt never serves it
