"""The Helm path's user-visible latencies on a cluster ($KUBECONFIG, else a running `make cluster`).

1. `helm install` to operator ready, `--runs` times (install, measure, uninstall): when
   `helm install --wait` returns (Deployment available), when kopf's /healthz answers (test
   cluster only: the node agent runs the pod on this host), and when the operator has
   reconciled a first MixedPrecisionJob (its status.phase is set).
2. `kubectl apply -f examples/quickstart.yaml` (the fp16 overflow recovering in bf16) to each
   phase a watch sees: Running fp16, Recovering, Running bf16, Succeeded.

Each run uses a fresh namespace and a release that watches only it; all is removed after.
    PYTHONPATH=. uv run --no-sync python bench/e2e_timings.py [--runs 3] [--no-quickstart]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

from kubernetes import client, config, watch

from bench.k8s import mpjob, mpjobs, new_namespace
from mpjob_contract import api
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm/mpjob"


def kubeconfig() -> str:
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    from tests.cluster.controlplane import Layout, api_ready

    layout = Layout.from_env()
    if not api_ready(layout):
        raise SystemExit("no cluster: set KUBECONFIG or run `make cluster`")
    return str(layout.kubeconfig)


def tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    from tests.cluster.controlplane import binaries

    return str(binaries() / name)


class Bench:
    def __init__(self, kubeconfig_path: str) -> None:
        self.kubeconfig = kubeconfig_path
        self.api = config.new_client_from_config(kubeconfig_path)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.helm, self.kubectl = tool("helm"), tool("kubectl")
        self.local = "/tmp/" in kubeconfig_path or (REPO / ".cluster") in Path(kubeconfig_path).parents

    def sh(self, *argv: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env={**os.environ, "KUBECONFIG": self.kubeconfig}
        )
        if result.returncode:
            raise RuntimeError(f"{' '.join(argv[:3])}: {result.stderr or result.stdout}")
        return result.stdout

    def namespace(self) -> str:
        name = f"mpjob-bench-{uuid.uuid4().hex[:6]}"
        return new_namespace(self.core, name)

    def cleanup(self, ns: str) -> None:
        subprocess.run(
            [self.helm, "--kubeconfig", self.kubeconfig, "uninstall", "mpjob", "-n", ns, "--wait"], capture_output=True
        )
        for item in mpjobs(self.custom, ns):
            self.custom.patch_namespaced_custom_object(
                api.GROUP, api.VERSION, ns, api.PLURAL, item["metadata"]["name"], {"metadata": {"finalizers": None}}
            )
        self.core.delete_namespace(ns, propagation_policy="Background")

    def install(self, ns: str) -> dict[str, float]:
        health = free_port()
        sets = [
            f"watchNamespaces={{{ns}}}",
            f"operator.metricsPort={free_port()}",
            f"operator.healthPort={health}",
            "operator.tickSeconds=2",
        ]
        args = [self.helm, "--kubeconfig", self.kubeconfig, "install", "mpjob", str(CHART), "-n", ns, "--wait"]
        for item in sets:
            args += ["--set", item]
        if os.environ.get("MPJOB_E2E_VALUES"):
            args += ["-f", os.environ["MPJOB_E2E_VALUES"]]
        start = time.monotonic()
        self.sh(*args)
        out = {"helm install --wait": time.monotonic() - start}
        if self.local:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=1):
                        break
                except OSError:
                    time.sleep(0.05)
            out["kopf /healthz answers"] = time.monotonic() - start
        probe = {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "probe"},
            "spec": {"task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": 0}, "runPolicy": {"suspend": True}},
        }
        self.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, probe)
        while not (mpjob(self.custom, ns, "probe").get("status") or {}).get("phase"):
            time.sleep(0.05)
        out["first job reconciled"] = time.monotonic() - start
        return out

    def quickstart(self, ns: str) -> list[tuple[str, float]]:
        start = time.monotonic()
        self.sh(self.kubectl, "apply", "-n", ns, "-f", str(REPO / "examples/quickstart.yaml"))
        seen: list[tuple[str, float]] = []
        last = None
        while not seen or seen[-1][0].split()[0] not in ("Succeeded", "Failed"):
            for event in watch.Watch().stream(
                self.custom.list_namespaced_custom_object,
                api.GROUP,
                api.VERSION,
                ns,
                api.PLURAL,
                field_selector="metadata.name=quickstart",
                timeout_seconds=30,
            ):
                status = event["object"].get("status") or {}
                key = f"{status.get('phase')} {status.get('precision')}"
                if status.get("phase") and key != last:
                    seen.append((key, time.monotonic() - start))
                    last = key
                if status.get("phase") in ("Succeeded", "Failed"):
                    break
        return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="install/uninstall cycles")
    parser.add_argument("--no-quickstart", action="store_true")
    args = parser.parse_args()
    bench = Bench(kubeconfig())
    results: dict[str, list[float]] = {}
    for _ in range(args.runs):
        ns = bench.namespace()
        try:
            for key, value in bench.install(ns).items():
                results.setdefault(key, []).append(value)
        finally:
            bench.cleanup(ns)
    for key, values in results.items():
        print(
            f"helm install -> {key}: median {statistics.median(values):.1f} s "
            f"(runs: {', '.join(f'{v:.1f}' for v in values)})"
        )
    if args.no_quickstart:
        return
    ns = bench.namespace()
    try:
        bench.install(ns)
        for phase, seconds in bench.quickstart(ns):
            print(f"kubectl apply -f examples/quickstart.yaml -> {phase}: {seconds:.1f} s")
    finally:
        bench.cleanup(ns)


if __name__ == "__main__":
    main()
