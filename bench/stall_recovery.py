"""A hung attempt to training again, on the test control plane (runPolicy.progressDeadlineSeconds).

The progress-deadline tests' job (tests/unit/localrun/stall_task.py: the mlp task, a checkpoint
every 10 steps, a 30 s deadline) whose data loader hangs for good after step 25 while its
metrics endpoint answers on. The operator ends the attempt Stalled once the step has stood
still 30 s as its reads saw, cuts its pod (SIGTERM, then SIGKILL cutoff.CUT_GRACE_SECONDS later:
the hung rank cannot act on SIGTERM) and, once that pod is gone, the next attempt resumes from
step 20. Spans from the trainers' own lines (this host's clock, shared by the node agent's pods)
and the status's attempt end (whole seconds): the hang (attempt 0's last step line) to the
verdict, the verdict to the next pod's first line (the cut, the pod's removal, the reconcile,
Job and pod creation, process start, imports, model build), its resume and its first step.

    make cluster && PYTHONPATH=. uv run --no-sync python bench/stall_recovery.py [--runs 3]
"""

from __future__ import annotations

import argparse
from datetime import datetime

from kubernetes import client

from bench.recovery_cluster import close, medians, namespace_with_operator, pod_lines, run_job
from tests.unit.localrun.stall_task import SPEC, stalled_then_retried

CLAIM = "stall"


def one_job(api: client.ApiClient, kubeconfig: str, ns: str, name: str) -> dict[str, float]:
    """One hung job to its end: the spans from its hang."""
    spec = {**SPEC, "checkpoint": {**SPEC["checkpoint"], "volume": {"persistentVolumeClaim": {"claimName": CLAIM}}}}
    status = run_job(api, ns, name, spec)
    stalled_then_retried(status, "rank 0's metrics")
    hung = max(e["time"] for e in pod_lines(kubeconfig, ns, f"{name}-a0") if e["event"] == "step")
    ended = datetime.fromisoformat(status["attempts"][0]["finishTime"]).timestamp()
    new = pod_lines(kubeconfig, ns, f"{name}-a1")
    resumed = next(e["time"] for e in new if e["event"] == "resume")
    stepped = next(e["time"] for e in new if e["event"] == "step")
    return {
        "hang -> first step again": stepped - hung,
        "hang -> attempt ended Stalled (the 30 s deadline, from the reads)": ended - hung,
        "attempt ended -> next pod's first line (the cut, then the next Job)": new[0]["time"] - ended,
        "next pod's first line -> checkpoint loaded": resumed - new[0]["time"],
        "checkpoint loaded -> first step": stepped - resumed,
    }


def measure(runs: int) -> list[dict[str, float]]:
    api, kubeconfig, ns, op = namespace_with_operator("stall", CLAIM)
    try:
        return [one_job(api, kubeconfig, ns, f"hung-{k}") for k in range(runs)]
    finally:
        close(api, ns, op)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    medians(measure(parser.parse_args().runs))


if __name__ == "__main__":
    main()
