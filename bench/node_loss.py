"""Node loss to training again at the smaller size, on the test control plane (spec.elastic).

A 3-worker elastic job (minWorkers 2, the mlp task on the CPU node) trains past a checkpoint;
then worker 2's node goes away as the taint manager shows it: its pod gets the DisruptionTarget
condition (DeletionByTaintManager) and is deleted. The operator ends the attempt ScaledDown and
the next one trains with 2 workers from the newest checkpoint. Measured from the moment of the
deletion (this host's clock, which the node agent's pods share) to the smaller attempt's
first step, broken down at the trainers' own lines: the old attempt's pods stopped (each
checkpoints on SIGTERM), the new pod's first line (the operator's reconcile, Job and pod
creation, process start, imports, model build), its resume (checkpoint loaded), its first step.

With `--remove-node` the node itself goes: the job runs on the test cluster's three one-GPU
nodes (the `trio` pool) and the Node of worker 2 is deleted, as when its machine is gone (the
node agent notices at its next heartbeat, within 8 s, and kills that pod's processes; the peers
fail at their next collective; the operator sees the running pod on a node that no longer
exists as lost). The node is registered again after each run.

With `--silence-node` worker 2's node stops answering instead (the node agent renews neither its
Ready condition nor its Lease and stops its pods' processes where they stand, so the peers block
in their next collective): the node lifecycle controller marks it after its grace period, the
operator ends the attempt at that mark, and the blocked ranks are cut (SIGTERM, then SIGKILL 10 s
later, cutoff.CUT_GRACE_SECONDS) before the smaller attempt starts. The node answers again after
each run.

    make cluster && PYTHONPATH=. uv run --no-sync python bench/node_loss.py [--runs 3] [--remove-node | --silence-node]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

from kubernetes import client

from bench.k8s import mpjob
from bench.recovery_cluster import GROUP, PLURAL, VERSION, close, medians, namespace_with_operator, pod_lines
from tests.cluster.disruption import lose_pod, rank_pod
from tests.cluster.nodeagent.nodes import NODES, placement, remove_node, return_node, silence_node, wake_node
from tests.helpers import wait_for

CLAIM = "ckpt"
SPEC: dict[str, Any] = {
    "workers": 3,
    "task": {"builtin": "mlp", "args": {"stepDelay": {"bf16": 0.05}}},
    "training": {"steps": 200, "batchSize": 4, "logEvery": 1},
    "precision": {"mode": "bf16", "fallback": ["fp32"]},
    "checkpoint": {"everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": CLAIM}}},
    "elastic": {"minWorkers": 2, "waitSeconds": 600},
    "resources": {"gpusPerWorker": 0},
}


def lose_a_node(core: client.CoreV1Api, ns: str, name: str) -> float:
    """Worker 2's pod shown lost and deleted; the moment of the deletion."""
    return lose_pod(core, ns, rank_pod(core, ns, name, 0, 2).metadata.name)


def spec(how: str) -> dict[str, Any]:
    if how == "pod":
        return SPEC
    return {**SPEC, "resources": {"gpusPerWorker": 1}, "template": placement("trio")}


def one_job(api: client.ApiClient, kubeconfig: str, ns: str, name: str, how: str) -> dict[str, float]:
    """One job through the loss `how` ("pod", "remove", "silence"): the spans from the loss."""
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MixedPrecisionJob", "metadata": {"name": name},
            "spec": spec(how)}  # fmt: skip
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def status() -> dict[str, Any]:
        return mpjob(custom, ns, name).get("status") or {}

    wait_for(lambda: (status().get("lastCheckpoint") or {}).get("step", 0) >= 20, 300, 0.5, "a checkpoint")
    spans: dict[str, float] = {}
    if how == "pod":
        lost = lose_a_node(core, ns, name)
    else:
        node = rank_pod(core, ns, name, 0, 2).spec.node_name
        lost = time.time()
        (remove_node if how == "remove" else silence_node)(core, node)
        wait_for(lambda: len(status().get("attempts") or []) == 2, 600, 0.5, "the smaller attempt")
        spans["node lost -> attempt ended (seen in its status)"] = time.time() - lost
        (return_node if how == "remove" else wake_node)(core, node)  # it grows back at its next checkpoint

    def ended() -> dict[str, Any] | None:
        return s if (s := status()).get("phase") in ("Succeeded", "Failed") else None

    done = wait_for(ended, 600, 0.5, "the end")
    sizes = [a["worldSize"] for a in done["attempts"]]
    assert done["phase"] == "Succeeded" and sizes[:2] == [3, 2], done["attempts"]
    old = pod_lines(kubeconfig, ns, f"{name}-a0", 0)  # rank 0 writes the event lines
    new = pod_lines(kubeconfig, ns, f"{name}-a1", 0)
    resumed = next(e["time"] for e in new if e["event"] == "resume")
    stepped = next(e["time"] for e in new if e["event"] == "step")
    return {
        "node lost -> first step at 2 workers": stepped - lost,
        **spans,
        "node lost -> old attempt's rank 0 last line (SIGTERM: checkpoint; or its peer's loss)": old[-1]["time"] - lost,
        "node lost -> new pod's first line": new[0]["time"] - lost,
        "new pod's first line -> checkpoint loaded": resumed - new[0]["time"],
        "checkpoint loaded -> first step": stepped - resumed,
    }


def measure(runs: int, how: str) -> list[dict[str, float]]:
    api, kubeconfig, ns, op = namespace_with_operator("nodeloss", CLAIM)
    core = client.CoreV1Api(api)
    try:
        return [one_job(api, kubeconfig, ns, f"lost-{k}", how) for k in range(runs)]
    finally:
        for node in (n for n in NODES if n.startswith("gpu-node-trio-")):
            with contextlib.suppress(client.ApiException):  # 409: it is there
                return_node(core, node)
            wake_node(core, node)
        close(api, ns, op)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--remove-node", action="store_true", help="delete the Node itself (the trio pool)")
    how.add_argument("--silence-node", action="store_true", help="the node stops answering (the trio pool)")
    args = parser.parse_args()
    medians(measure(args.runs, "remove" if args.remove_node else "silence" if args.silence_node else "pod"))


if __name__ == "__main__":
    main()
