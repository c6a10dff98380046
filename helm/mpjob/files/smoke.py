"""`helm test mpjob`: create a tiny CPU MixedPrecisionJob, wait for Succeeded, delete it.

Runs in the test pod (operator image: python + the kubernetes client). Exit 0 only when the
job succeeded; on failure the job is kept for `kubectl describe mpj`.
"""

import os
import sys
import time
import uuid

from kubernetes import client, config

GROUP, VERSION, PLURAL = "mpjob.dev", "v1alpha1", "mixedprecisionjobs"


def job_body(name: str) -> dict:
    """A tiny CPU job: a small MLP, 20 steps in bf16 (fp32 as the fallback), checkpoint at 10."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "helm-test"}},
        "spec": {
            "task": {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "layers": 1, "samples": 256}},
            "training": {"steps": 20, "batchSize": 8, "logEvery": 5},
            "precision": {"mode": "bf16", "fallback": ["fp32"]},
            "checkpoint": {"everySteps": 10, "keep": 1},
            "resources": {"gpusPerWorker": 0, "requests": {"cpu": "100m"}},
            "runPolicy": {"maxAttempts": 2},
        },
    }


def main() -> int:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()  # a kubeconfig in $KUBECONFIG (test clusters)
    api = client.CustomObjectsApi()
    namespace = os.environ["MPJOB_TEST_NAMESPACE"]
    timeout = float(os.environ.get("MPJOB_TEST_TIMEOUT", "600"))
    name = f"helm-test-{uuid.uuid4().hex[:6]}"
    body = job_body(name)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    print(f"created mixedprecisionjob {namespace}/{name}", flush=True)
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        status = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}
        phase = status.get("phase")
        if phase != seen:
            print(f"phase {phase} precision {status.get('precision')} step {status.get('step')}", flush=True)
            seen = phase
        if phase == "Succeeded":
            api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            print(f"ok: {name} succeeded in {status.get('precision')} at step {status.get('step')}", flush=True)
            return 0
        if phase == "Failed":
            print(f"FAILED: {status.get('message')} (kept: kubectl describe mpj -n {namespace} {name})", flush=True)
            return 1
        time.sleep(1)
    print(f"FAILED: not Succeeded after {timeout:.0f}s (kept: kubectl describe mpj -n {namespace} {name})", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
