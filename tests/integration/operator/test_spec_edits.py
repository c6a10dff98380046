"""A running job's spec edited on the real control plane: the attempt running trains on the spec
it was launched with, and the status tells what it did; an edit of what its checkpoints bind is
refused by the API server (docs/walkthrough.md, "Change a running job")."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client

from mpjob.builders.attempt import TRAINER_CONTAINER
from mpjob.controller.records import JOB_NAME_LABEL
from mpjob_contract import api, binding
from tests.helpers import paced
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_fault_policy import mlp_spec

pytestmark = pytest.mark.integration

#: At 0.05 s a step, 18 s at least are left once the status shows step 30 (it lags the trainer by
#: a read or two), for the test's change to land while the attempt runs, on a starved machine too.
STEPS = 400


def test_steps_lowered_below_the_running_step_leave_the_attempt_s_steps_and_checkpoints_true(
    operator: Operator, jobs: Jobs
) -> None:
    """The attempt trains on to its own end; its steps and last checkpoint are recorded as it
    names them, not held to the lowered end (they once read step 20 with step 160's checkpoint)."""
    status = _edited_while_running(jobs, "cut", "fp16", {"training": {"steps": 20}})
    assert status["phase"] == "Succeeded", status
    (attempt,) = status["attempts"]
    assert (status["step"], attempt["endStep"], status["totalSteps"]) == (STEPS, STEPS, STEPS)
    checkpoint = status["lastCheckpoint"]
    assert checkpoint["step"] == STEPS and checkpoint["path"].endswith(f"step-{STEPS:09d}"), checkpoint


def test_gpus_per_worker_edited_while_the_attempt_runs_leave_its_cost_what_its_pod_held(
    operator: Operator, jobs: Jobs
) -> None:
    """The attempt's pod asked for 1 GPU; an edit to 3 while it ran is for the attempts after it.
    Its gpuSeconds are 1 GPU x the seconds its trainer container ran (it was once charged 3)."""
    status = _edited_while_running(jobs, "regpu", "bf16", {"resources": {"gpusPerWorker": 3}})
    assert status["phase"] == "Succeeded", status
    (attempt,) = status["attempts"]
    (pod,) = jobs.core.list_namespaced_pod(jobs.namespace, label_selector=f"{JOB_NAME_LABEL}=regpu-a0").items
    ran = next(c for c in pod.status.container_statuses if c.name == TRAINER_CONTAINER).state.terminated
    seconds = (ran.finished_at - ran.started_at).total_seconds()
    assert seconds > 0 and attempt["gpuSeconds"] == pytest.approx(1 * seconds, abs=1e-3), (attempt, seconds)


def _edited_while_running(jobs: Jobs, name: str, precision: str, edit: dict[str, Any]) -> dict[str, Any]:
    """The status job `name` (`STEPS` steps in `precision`, a checkpoint every 20) ends with, its spec
    edited by `edit` (a merge patch) once it is past step 30 and the edit read while it runs."""
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", precision, every=20, stepDelay=paced(0.05))
    spec["training"]["steps"] = STEPS
    jobs.create(name, spec)
    jobs.wait_status(name, lambda s: s.get("step", 0) >= 30, 120, "the attempt past step 30")
    jobs.patch_spec(name, edit)
    jobs.wait_status(name, lambda s: s.get("observedGeneration") == 2, 30, "the edit read")
    return jobs.wait_phase(name, ("Succeeded", "Failed"), 180)


def _refused(jobs: Jobs, name: str, edit: dict[str, Any]) -> str:
    """The API server's message refusing the spec edit `edit` (a merge patch, as `kubectl edit`)."""
    with pytest.raises(client.ApiException) as refused:
        jobs.patch_spec(name, edit)
    assert refused.value.status == 422, refused.value.body
    said: str = json.loads(refused.value.body)["message"]
    return said


def _replace(jobs: Jobs, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The job's spec replaced by `spec` whole (what `kubectl apply` or `replace` of a file sends)."""
    job = jobs.get(name)
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": job["metadata"], "spec": spec}
    made: dict[str, Any] = jobs.custom.replace_namespaced_custom_object(
        api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, name, body
    )
    return made


def test_the_api_server_refuses_an_edit_of_what_the_checkpoints_bind_and_takes_every_other(
    shipped_crd: None, jobs: Jobs
) -> None:
    """task (its args too), training.seed and the samples per step are refused, each naming its
    field and the ways on; a re-split of the same samples per step, steps and workers are taken."""
    written = mlp_spec("ckpt", "fp16", every=20)
    written["training"].update(batchSize=4, gradAccumulation=1, seed=7)
    jobs.create("bound", written)
    stored = jobs.get("bound")["spec"]
    ways_on = "delete the job and create it again, or create a job under a new name"

    said = _refused(jobs, "bound", {"task": {"args": {"hidden": 32}}})
    assert f'spec.task: Invalid value: "object": {binding.UNCHANGED["task"].message}' in said, said
    assert ways_on in said
    said = _refused(jobs, "bound", {"training": {"seed": 8}})
    assert f'spec.training.seed: Invalid value: "object": {binding.UNCHANGED["seed"].message}' in said, said
    said = _refused(jobs, "bound", {"training": {"batchSize": 8}})
    assert f'spec.training: Invalid value: "object": {binding.UNCHANGED["samplesPerStep"].message}' in said
    other_seed = copy.deepcopy(stored)
    other_seed["training"]["seed"] = 0
    with pytest.raises(client.ApiException) as refused:
        _replace(jobs, "bound", other_seed)
    assert "spec.training.seed: " in json.loads(refused.value.body)["message"]
    assert jobs.get("bound")["spec"] == stored, "a refused edit left the spec as it was"

    assert _replace(jobs, "bound", written)["metadata"]["generation"] == 1, "the file again, changing nothing"
    jobs.patch_spec("bound", {"training": {"steps": 60, "batchSize": 2, "gradAccumulation": 2}, "workers": 2})
    training = jobs.get("bound")["spec"]["training"]
    assert (training["steps"], training["batchSize"], training["gradAccumulation"]) == (60, 2, 2)
    assert jobs.get("bound")["spec"]["workers"] == 2
