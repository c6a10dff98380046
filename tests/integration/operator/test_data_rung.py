"""The data rung through the operator: a poisoned sample costs a rollback and that sample, not
the precision or the job; status.skipped and a DataSkipped Event name the step and sample, while
the attempt still runs, once, also across an operator restart."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import wait_for
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
    events = jobs.events("poisoned", "DataSkipped")
    (said,) = [e for e in events if e.reason == "DataSkipped"]
    assert said.type == "Warning" and f"step {step['step'] + 1} skipped" in said.message
    assert said.message.endswith("samples 17")
    final = jobs.checkpoints(kubeconfig, "ckpt", "poisoned") / "step-000000040" / "state.pt"
    held = torch.load(final, weights_only=True)["quarantine"]
    assert held["records"] == [[step["step"], "data", [17]]]  # a later attempt never serves it


def test_a_bad_record_before_the_first_checkpoint_costs_bf16_nothing_but_the_record(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    """bf16 applies the bad step and, with checkpoints every 20 steps, none exists when sample 5
    first poisons the weights (step 1 of 8 per epoch): the trainer replays and rolls back from
    the attempt's step 0, and the job Succeeds in bf16 in one attempt."""
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=30, every=20)
    spec["task"] = {"builtin": "mlp", "args": {**MLP, "nonFiniteSamples": [5]}}
    spec["training"]["batchSize"] = 8
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    jobs.create("early", spec)
    status = jobs.wait_phase("early", ("Failed", "Succeeded"), 240)
    assert status["phase"] == "Succeeded", status
    (only,) = status["attempts"]
    assert (only["precision"], only["reason"]) == ("bf16", "Succeeded")
    (step,) = status["skipped"]["steps"]
    assert step["step"] < 8 and step["samples"] == [{"first": 5, "last": 5}]


def data_skipped(jobs: Jobs, namespace: str, name: str) -> list:
    events = jobs.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.reason == "DataSkipped"]


def test_a_skip_shows_in_status_and_events_while_the_attempt_runs_and_a_restart_announces_it_once(
    operator: Operator, jobs: Jobs, namespace: str
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=120)
    # Sample 17 is in the first epoch's 8 steps; each fp16 step then takes 0.25 s more, so the
    # attempt trains on for half a minute after the skip (the fp32 replay is not slowed).
    spec["task"] = {"builtin": "mlp", "args": {**MLP, "nonFiniteSamples": [17], "stepDelay": {"fp16": 0.25}}}
    spec["training"]["batchSize"] = 8
    jobs.create("live", spec)
    status = wait_for(lambda: (s := jobs.status("live")).get("skipped") and s, 240, 0.5, "status.skipped")
    (running,) = status["attempts"]
    assert status["phase"] == "Running" and running.get("reason") is None, status  # seen live, not at the end
    assert (status["skipped"]["count"], status["skipped"]["samples"]) == (1, 1)
    (step,) = status["skipped"]["steps"]
    assert step["cause"] == "data" and step["samples"] == [{"first": 17, "last": 17}]
    (said,) = wait_for(lambda: data_skipped(jobs, namespace, "live"), 30, 0.5, "a DataSkipped Event")
    assert said.message.startswith(f"step {step['step'] + 1} skipped") and said.message.endswith("samples 17")
    assert jobs.status("live")["phase"] == "Running"  # announced while the attempt ran
    # A restarted operator reads the status it wrote, reads the trainer again and announces nothing twice.
    operator.kill()
    at = jobs.status("live").get("step", 0)
    operator.start()
    wait_for(lambda: jobs.status("live").get("step", 0) > at, 120, 0.5, "a live read by the restarted operator")
    final = jobs.wait_phase("live", ("Failed", "Succeeded"), 240)
    assert final["phase"] == "Succeeded", final
    assert final["skipped"] == status["skipped"]  # the report merged in: counted once
    events = jobs.events("live", "Succeeded")  # the last of the plan's Events: a second one would be in
    assert [e.reason for e in events].count("DataSkipped") == 1
