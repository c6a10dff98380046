"""Recovery in place vs a restart on the test control plane: bench/recovery.py's job applied as
a MixedPrecisionJob, with spec.precision.inPlace true and false, the real trainer in the node
agent's pods. In place, the bf16 attempt's recoverySeconds (the trainer's figure, as the
operator recorded it); for the restart, the same span from the trainers' own event lines in the
pods' logs: attempt 0's `fault` line to attempt 1's `resume` line, broken down at attempt 1's
first line (pod exit, the operator's reconcile, Job and pod creation, the node's start of the
process, imports, model build) and its resume (the checkpoint loaded).

    make cluster && PYTHONPATH=. uv run --no-sync python bench/recovery_cluster.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.k8s import mpjob, new_namespace
from bench.operator_scale import connect, start_operator, stop_operator, wait_gone
from bench.recovery import JOB
from tests.helpers import wait_for

GROUP, VERSION, PLURAL = "mpjob.dev", "v1alpha1", "mixedprecisionjobs"
CLAIM = "recovery"


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def pod_lines(kubeconfig: str, ns: str, attempt: str, rank: int | None = None) -> list[dict[str, Any]]:
    """The trainer's event lines of an attempt Job's pod (of that rank, where it has several), as
    the node agent keeps its log."""
    pod = f"{attempt}-*" if rank is None else f"{attempt}-{rank}-*"
    (log,) = (Path(kubeconfig).parent / "logs" / "pods").glob(f"{ns}_{pod}_trainer.log")
    return events(log)


def run_job(api: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Apply the MixedPrecisionJob `name` of `spec` and wait for its end: its status."""
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MixedPrecisionJob", "metadata": {"name": name}, "spec": spec}
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def finished() -> dict[str, Any] | None:
        status = mpjob(custom, ns, name).get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    return wait_for(finished, 600, 0.5, f"{name} to finish")


def one_job(api: client.ApiClient, kubeconfig: str, ns: str, name: str, *, in_place: bool) -> dict[str, float]:
    spec = json.loads(json.dumps(JOB["spec"]))
    spec["precision"]["inPlace"] = in_place
    spec["checkpoint"]["volume"] = {"persistentVolumeClaim": {"claimName": CLAIM}}
    status = run_job(api, ns, name, spec)
    assert status["phase"] == "Succeeded" and [a["precision"] for a in status["attempts"]] == ["fp16", "bf16"]
    if in_place:
        return {"recoverySeconds": float(status["attempts"][1]["recoverySeconds"])}
    fault = next(e["time"] for e in pod_lines(kubeconfig, ns, f"{name}-a0") if e["event"] == "fault")
    second = pod_lines(kubeconfig, ns, f"{name}-a1")
    first, resumed = second[0]["time"], next(e["time"] for e in second if e["event"] == "resume")
    return {
        "recoverySeconds": resumed - fault,
        "fault -> next pod's first line (exit, reconcile, Job, pod, process start, imports, model build)": first
        - fault,
        "first line -> checkpoint loaded": resumed - first,
    }


def namespace_with_operator(prefix: str, claim: str) -> tuple[client.ApiClient, str, str, subprocess.Popen[bytes]]:
    """On the test cluster: a new namespace `prefix-<random>` with a 1 GiB claim `claim`, and an
    operator for it running the real trainer; (API client, kubeconfig, namespace, operator)."""
    layout, api = connect()
    kubeconfig, ns = str(layout.kubeconfig), f"{prefix}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)
    new_namespace(core, ns)
    pvc = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    body: Any = {"metadata": {"name": claim}, "spec": pvc}  # sent as it is
    core.create_namespaced_persistent_volume_claim(ns, body)
    return api, kubeconfig, ns, start_operator(ns, kubeconfig, 1.0, trainer=["mpjob-trainer"])


def close(api: client.ApiClient, ns: str, op: subprocess.Popen[bytes]) -> None:
    """Stop `namespace_with_operator`'s operator and delete its namespace."""
    core = client.CoreV1Api(api)
    stop_operator(op)
    core.delete_namespace(ns, propagation_policy="Foreground")
    wait_gone(core, ns)


def medians(rows: list[dict[str, float]]) -> None:
    """Print each span's median over the runs, and the runs."""
    for key in rows[0]:
        values = [row[key] for row in rows]
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"{key}: median {statistics.median(values):.2f} s (runs: {each})")


def measure(runs: int) -> dict[str, list[dict[str, float]]]:
    api, kubeconfig, ns, op = namespace_with_operator("recovery", CLAIM)
    rows: dict[str, list[dict[str, float]]] = {"in place": [], "restart": []}
    try:
        for k in range(runs):
            for label, in_place in (("in place", True), ("restart", False)):
                name = f"{label.replace(' ', '')}-{k}"
                rows[label].append(one_job(api, kubeconfig, ns, name, in_place=in_place))
    finally:
        close(api, ns, op)
    return rows


def show(rows: dict[str, list[dict[str, float]]], where: str) -> None:
    for label, figures in rows.items():
        for key in figures[0]:
            values = [f[key] for f in figures]
            each = ", ".join(f"{v:.3f}" for v in values)
            print(f"{where} {label:9s} {key}: median {statistics.median(values):.3f} s (runs: {each})")
    placed, restarted = (statistics.median(f["recoverySeconds"] for f in rows[k]) for k in ("in place", "restart"))
    print(f"{where} in place / restart: {placed / restarted:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    show(measure(parser.parse_args().runs), "cluster")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
