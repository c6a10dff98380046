"""A node lost under a training job, and its return, on the real control plane (spec.elastic).

A 3-worker CPU job whose worker 2 is shown lost by the taint manager (its pod's DisruptionTarget,
then its deletion) after a checkpoint goes on at once with 2 workers from its newest checkpoint.

And a 3-worker job, a GPU each, on the test cluster's three one-GPU nodes of the `trio` pool. Past
its step-20 checkpoint the node of worker 2 is removed (its Node object deleted, as when the
machine is gone): the node agent kills that pod's processes with it and writes nothing more
about them, its peers fail at the next collective, and the operator, seeing a running pod on a
node that no longer exists, ends the attempt ScaledDown (uncharged) at once, without waiting
for the pod garbage collector. The next attempt trains with 2 workers from the last checkpoint
in the same precision with the same global batch. The node comes back (registered again): the
job grows back to 3 at its next checkpoint, to Succeeded. Across both changes the samples
trained are exactly the data stream's, none twice, none skipped (the recording task of the
`mpjob run` elastic test, its lines written by the pods' processes).

A node can also stop answering while its Node object stays (a hung machine, a cut network): the
node agent silences it, stopping its pods' processes where they stand, so their peers block in
the next collective (Gloo's timeout is 30 minutes). The node lifecycle controller marks it once
its grace period passes (the pods' Ready condition, the `unreachable` taint), and the operator
acts on that mark, long before the taint manager would evict the pods (five minutes more): the
elastic job shrinks and grows back when the node answers again, and a job that cannot shrink
restarts at once on the nodes that answer, its blocked ranks stopped, not waited for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.disruption import lose_pod, rank_pod
from tests.cluster.nodeagent.nodes import NODES, placement, remove_node, return_node, silence_node, wake_node
from tests.helpers import wait_for
from tests.integration.operator.conftest import UNTIL_STOPPED, Jobs, Operator, gpt_spec
from tests.unit.localrun.test_elastic_run import SAMPLES, SEED, stream, trained

pytestmark = pytest.mark.integration

TRIO = [name for name in NODES if name.startswith("gpu-node-trio-")]
#: What a test does to a node: remove_node / return_node, silence_node / wake_node.
Change = Callable[[client.CoreV1Api, str], None]
STEPS, GLOBAL_BATCH = 120, 12


@pytest.fixture
def trio(core: client.CoreV1Api) -> Iterator[list[str]]:
    """The pool's three nodes; any of them a test removed or silenced is back after it."""
    yield TRIO
    for name in TRIO:
        with contextlib.suppress(ApiException):  # 409: it is there
            return_node(core, name)
        wake_node(core, name)
    wait_for(lambda: all(_ready(core, name) for name in TRIO), 60, message="the trio nodes Ready")


def _ready(core: client.CoreV1Api, name: str) -> bool:
    conditions = core.read_node(name).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _spec(claim: str, record: Path, workers: int = 3) -> dict[str, Any]:
    # No PYTHONPATH: the test node's pods import this checkout already, and one set here would
    # replace the node's, warm-start hook and all (every rank would start cold).
    env = [{"name": "MPJOB_TEST_RECORD", "value": str(record)}]
    # The first two attempts serve their samples slowly (0.3 and 0.4 s a step), however fast
    # their ranks start: the node agent sees a node gone at its next heartbeat (up to 8 s) and a
    # node back Ready at the one after, and each attempt must still be training by then.
    task_args = {"samples": SAMPLES, "stepDelay": {"bf16": 0.1}, "sampleDelay": {"0": 0.05, "1": 0.05}}
    return {
        "workers": workers,
        "task": {"module": "tests.unit.localrun.elastic_task:make_task", "args": task_args},
        "training": {"steps": STEPS, "batchSize": 4, "logEvery": 5, "learningRate": 1e-3, "seed": SEED},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": claim}}},
        "elastic": {"minWorkers": 1, "waitSeconds": 600},
        "resources": {"gpusPerWorker": 1},
        "template": {**placement("trio"), "env": env},
    }


def _lost_and_back(jobs: Jobs, name: str, record: Path, lose: Change, back: Change) -> list[dict[str, Any]]:
    """The 3-worker job `name`, past its step-20 checkpoint, loses the node of worker 2 (`lose`)
    and goes on with 2 workers (never through the taint manager's eviction); the node comes back
    (`back`) and the job grows to 3 again, to Succeeded, the data stream exact. Its attempts."""
    jobs.pvc("ckpt")
    jobs.create(name, _spec("ckpt", record))
    node = _at_a_checkpoint(jobs, name, 2)
    lose(jobs.core, node)

    def training_at_two(status: dict[str, Any]) -> bool:
        attempts = status.get("attempts") or []
        return len(attempts) == 2 and status.get("phase") == "Running" and status.get("step", 0) > 40

    # A node that stops answering is marked after the controller's grace period (50 s); the
    # taint manager would evict its pods 300 s after that.
    jobs.wait_status(name, training_at_two, 240, "attempt 1 training on 2 workers")
    _not_evicted(jobs, name, 2)
    back(jobs.core, node)
    status = jobs.wait_phase(name, ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    attempts: list[dict[str, Any]] = status["attempts"]
    sizes = [(a["precision"], a["worldSize"], a["reason"], a["charged"]) for a in attempts]
    expected = [("bf16", 3, "ScaledDown", False), ("bf16", 2, "ScaledUp", False), ("bf16", 3, "Succeeded", True)]
    assert sizes == expected, [(a["startStep"], a.get("endStep"), a.get("message")) for a in attempts]
    assert "a node was lost" in attempts[0]["message"]
    # Shrunk from the newest checkpoint (its peers had no chance to write another).
    assert attempts[1]["startStep"] >= 20 and attempts[1]["startStep"] % 20 == 0
    for a in attempts:
        assert a["worldSize"] * a["microBatch"] * a["gradAccumulation"] == GLOBAL_BATCH
    assert trained(attempts, record) == stream(STEPS * GLOBAL_BATCH)
    return attempts


def test_a_node_removed_shrinks_the_job_at_once_and_its_return_grows_it_back(
    operator: Operator, jobs: Jobs, trio: list[str], tmp_path: Path
) -> None:
    attempts = _lost_and_back(jobs, "trio", tmp_path / "samples.txt", remove_node, return_node)
    # Grown at the checkpoint the smaller attempt wrote on SIGTERM, at or past the last step the
    # operator read from it before it ended it.
    assert attempts[2]["startStep"] >= attempts[1]["endStep"] > attempts[1]["startStep"]


def _at_a_checkpoint(jobs: Jobs, name: str, rank: int) -> str:
    """The node of `rank` (of the first attempt of job `name`) once the job has a checkpoint."""
    jobs.wait_status(name, lambda s: (s.get("lastCheckpoint") or {}).get("step", 0) >= 20, 240, "a checkpoint")
    node = str(rank_pod(jobs.core, jobs.namespace, name, 0, rank).spec.node_name)
    assert node in TRIO
    return node


def _not_evicted(jobs: Jobs, name: str, rank: int) -> None:
    """The first attempt's pod of `rank` was never evicted by the taint manager: the operator
    acted on the node lifecycle controller's mark (or the Node's deletion), not on an eviction."""
    selector = f"mpjob.dev/job={name},mpjob.dev/attempt=0"
    for pod in jobs.core.list_namespaced_pod(jobs.namespace, label_selector=selector).items:
        if pod.metadata.name.startswith(f"{name}-a0-{rank}-"):
            reasons = [c.reason for c in pod.status.conditions or [] if c.type == "DisruptionTarget"]
            assert "DeletionByTaintManager" not in reasons, reasons


def test_a_node_that_stops_answering_shrinks_the_job_at_its_mark_and_grows_it_back_when_it_answers(
    operator: Operator, jobs: Jobs, trio: list[str], tmp_path: Path
) -> None:
    _lost_and_back(jobs, "hush", tmp_path / "samples.txt", silence_node, wake_node)


def test_a_job_that_cannot_shrink_restarts_at_once_on_the_nodes_that_answer(
    operator: Operator, jobs: Jobs, trio: list[str], tmp_path: Path
) -> None:
    jobs.pvc("ckpt")
    record = tmp_path / "samples.txt"
    spec = {**_spec("ckpt", record, workers=2), "elastic": None}
    jobs.create("stuck", {k: v for k, v in spec.items() if v is not None})
    silent = _at_a_checkpoint(jobs, "stuck", 1)
    silence_node(jobs.core, silent)
    status = jobs.wait_phase("stuck", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    _not_evicted(jobs, "stuck", 1)
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["charged"]) == ("bf16", "NodeLost", False), first
    assert "NodeUnreachable" in first["message"]
    assert (second["precision"], second["worldSize"], second["reason"]) == ("bf16", 2, "Succeeded")
    assert second["startStep"] >= 20 and second["startStep"] % 20 == 0
    placed = {
        p.spec.node_name
        for p in jobs.core.list_namespaced_pod(jobs.namespace, label_selector="mpjob.dev/attempt=1").items
    }
    assert silent not in placed and len(placed) == 2, placed
    assert trained(status["attempts"], record) == stream(STEPS * 2 * 4)


def test_a_node_lost_while_training_shrinks_the_job_at_once_from_the_last_checkpoint(
    operator: Operator, jobs: Jobs
) -> None:
    """The node of worker 2 goes away: its pod gets the taint manager's DisruptionTarget and is
    deleted, as when a node stays unreachable. The job goes on with 2 workers at once, from its
    newest checkpoint."""
    jobs.pvc("ckpt")
    spec = {
        "workers": 3,
        "task": {"builtin": "mlp", "args": {"stepDelay": {"bf16": 0.05}}},
        "training": {"steps": 120, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        "elastic": {"minWorkers": 2, "waitSeconds": 600},
        "resources": {"gpusPerWorker": 0},
    }
    jobs.create("lost", spec)
    wait_for(
        lambda: (jobs.status("lost").get("lastCheckpoint") or {}).get("step", 0) >= 20, 240, message="a checkpoint"
    )
    lose_pod(jobs.core, jobs.namespace, rank_pod(jobs.core, jobs.namespace, "lost", 0, 2).metadata.name)
    status = jobs.wait_phase("lost", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["worldSize"], first["reason"], first["charged"]) == (3, "ScaledDown", False), first
    assert "a node was lost" in first["message"]
    assert (second["precision"], second["worldSize"], second["reason"]) == ("bf16", 2, "Succeeded")
    # From the newest checkpoint: the last periodic one, or the one the trainers wrote on SIGTERM
    # (the deleted pod had its grace period; a node that vanishes gives none).
    assert second["startStep"] >= 20
    assert second["worldSize"] * second["microBatch"] * second["gradAccumulation"] == 3 * 4


def test_an_operator_restarted_while_a_suspended_attempt_s_pod_stops_resumes_only_once_it_has(
    operator: Operator, jobs: Jobs, trio: list[str], kubeconfig: str
) -> None:
    """Suspended: the operator deletes the attempt's Job and its pod checkpoints on SIGTERM. The
    operator restarts meanwhile: its first listing has that pod but not its Job. The pod's node
    does not answer, so the pod stops only once it does: the resume waits for it (two attempts
    never write checkpoints at once), then starts from the checkpoint it wrote."""
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=20)
    spec["precision"], spec["template"] = {"mode": "bf16"}, placement("trio")
    jobs.create("restart", spec)
    node = _at_a_checkpoint(jobs, "restart", 0)
    pod = rank_pod(jobs.core, jobs.namespace, "restart", 0, 0).metadata.name
    silence_node(jobs.core, node)
    agent = Path(kubeconfig).parent / "logs" / "node-agent.log"
    wait_for(lambda: f"{jobs.namespace}/{pod} stopped" in agent.read_text(), 30, message="its pod stopped")
    jobs.patch_spec("restart", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("restart", "Suspended", 60)
    wait_for(lambda: not jobs.attempt_jobs("restart"), 60, message="attempt 0's Job removed")
    operator.kill()
    operator.start()
    jobs.patch_spec("restart", {"runPolicy": {"suspend": False}})
    generation = jobs.get("restart")["metadata"]["generation"]
    status = jobs.wait_status("restart", lambda s: s.get("observedGeneration") == generation, 60, "the resume read")
    assert (status["phase"], len(status["attempts"]), jobs.attempt_jobs("restart")) == ("Suspended", 1, []), status
    wake_node(jobs.core, node)
    status = jobs.wait_status("restart", lambda s: len(s.get("attempts", [])) == 2, 120, "resumed once the pod stopped")
    assert status["attempts"][1]["startStep"] >= 20
    jobs.patch_spec("restart", {"runPolicy": {"suspend": True}})  # the run ends here
