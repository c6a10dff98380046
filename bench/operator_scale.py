"""Operator latency and footprint with N concurrent MixedPrecisionJobs on the test control
plane. A stand-in trainer (MPJOB_TRAINER_COMMAND) exits 42 in attempt 0 and 0 in attempt 1,
so every job walks create -> attempt 0 -> numeric fault -> attempt 1 -> Succeeded.

Measured at the client with watches: CR created -> attempt Job created, and trainer exit
(pod terminated, as the node reports it) -> next attempt Job created; operator CPU seconds
and peak RSS from /proc. Each N runs in its own namespace, deleted (and waited for) after.

A reference on the same cluster under the same load: with each CR the benchmark creates a
plain batch/v1 Job (one pod, `true`), and measures Kubernetes' own Job controller (Go) from
Job created to its first pod created, the same way (create returned -> ADDED seen by a watch).
mpjob's CR -> attempt Job latency is reported as a ratio to it at p50 and p99. The two are
the same kind of step: a controller sees a new object and creates its first child.

Usage: make cluster && PYTHONPATH=. uv run python bench/operator_scale.py [--tick-seconds 30] 100 500 1000
(not in scripts/bench.sh: it needs the test cluster and takes minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config, watch

from bench.k8s import new_namespace
from tests.cluster.controlplane import Layout, api_ready, running, up
from tests.helpers import free_port, wait_for

STAND_IN = [
    sys.executable,
    "-c",
    "import json,os,sys; sys.exit(42 if json.loads(os.environ['MPJOB_LAUNCH'])['attempt'] == 0 else 0)",
]
SPEC = {"task": {"builtin": "mlp"}, "precision": {"mode": "fp16"}, "resources": {"gpusPerWorker": 0}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proc_stats(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM"))
    return cpu, int(hwm.split()[1]) * 1024


def wait_gone(core: client.CoreV1Api, ns: str, timeout: float = 900) -> None:
    """Wait until the namespace and every pod in it are gone, so the next N starts clean."""

    def gone() -> bool:
        try:
            core.read_namespace(ns)
        except client.rest.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_for(gone, timeout, 2, f"namespace {ns} deleted")


def start_operator(
    ns: str, kubeconfig: str, tick_seconds: float, trainer: list[str] = STAND_IN
) -> subprocess.Popen[bytes]:
    health = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        "MPJOB_TRAINER_COMMAND": json.dumps(trainer),
        # Events drive the attempts; the ticker is the safety net and the live-progress reader.
        "MPJOB_TICK_SECONDS": str(tick_seconds),
        "MALLOC_ARENA_MAX": "2",  # as the operator image sets it
    }
    argv = [sys.executable, "-m", "mpjob.cli", "operator", "-n", ns, "--metrics-port", "0"]
    op = subprocess.Popen(
        [*argv, "--health-port", str(health), "--bind-address", "127.0.0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def healthy() -> bool:
        assert op.poll() is None, "the operator exited"
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as response:
            return response.status == 200

    wait_for(healthy, 60, 0.2, "operator healthy")
    return op


@dataclass
class Timings:
    """Client-side moments (time.monotonic) the benchmark's watches saw, by object name."""

    created: dict[str, float] = field(default_factory=dict)  # CRs and reference Jobs, when create returned
    job_seen: dict[str, float] = field(default_factory=dict)  # Job ADDED
    first_pod: dict[str, float] = field(default_factory=dict)  # a Job's first pod ADDED, by job-name
    exited: dict[str, float] = field(default_factory=dict)  # a Job's pod terminated, by job-name
    stop: threading.Event = field(default_factory=threading.Event)

    # Plain JSON events (no typed models): the benchmark's own watches share the 2 cores.
    def watch_jobs(self, batch: client.BatchV1Api, ns: str) -> None:
        for ev in watch.Watch().stream(batch.list_namespaced_job, ns, timeout_seconds=1800, deserialize=False):
            if ev["type"] == "ADDED":
                self.job_seen.setdefault(ev["object"]["metadata"]["name"], time.monotonic())
            if self.stop.is_set():
                return

    def watch_pods(self, core: client.CoreV1Api, ns: str) -> None:
        for ev in watch.Watch().stream(core.list_namespaced_pod, ns, timeout_seconds=1800, deserialize=False):
            pod = ev["object"]
            owner = pod["metadata"].get("labels", {}).get("job-name", "")
            self.first_pod.setdefault(owner, time.monotonic())
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if (cs.get("state") or {}).get("terminated"):
                    self.exited.setdefault(owner, time.monotonic())
            if self.stop.is_set():
                return


def reference_job(name: str) -> dict[str, Any]:
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}
    return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": pod}}}


def create_load(n: int, ns: str, api: client.ApiClient, t: Timings) -> None:
    """N MixedPrecisionJobs, each followed by one reference Job, interleaved: both controllers
    see the same load at the same moments."""
    batch, custom = client.BatchV1Api(api), client.CustomObjectsApi(api)
    for i in range(n):
        body = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": f"j{i}"}}
        body["spec"] = SPEC
        custom.create_namespaced_custom_object("mpjob.dev", "v1alpha1", ns, "mixedprecisionjobs", body)
        t.created[f"j{i}"] = time.monotonic()
        batch.create_namespaced_job(ns, cast(Any, reference_job(f"ref{i}")))  # a body sent as it is
        t.created[f"ref{i}"] = time.monotonic()


def report(n: int, t: Timings, cpu: float, rss: int) -> None:
    jobs = [k for k in t.created if k.startswith("j")]
    first = [t.job_seen[f"{k}-a0"] - t.created[k] for k in jobs if f"{k}-a0" in t.job_seen]
    refs = [t.first_pod[k] - t.created[k] for k in t.created if k.startswith("ref") and k in t.first_pod]
    both = [k for k in jobs if f"{k}-a1" in t.job_seen and f"{k}-a0" in t.exited]
    nxt = [t.job_seen[f"{k}-a1"] - t.exited[f"{k}-a0"] for k in both]
    print(f"N={n}: CR created -> attempt Job created: p50 {statistics.median(first):.2f} s, "
          f"p99 {pct(first, 0.99):.2f} s ({len(first)}/{n})")  # fmt: skip
    print(f"N={n}: reference, Job created -> first pod created (Job controller): p50 {statistics.median(refs):.2f} s, "
          f"p99 {pct(refs, 0.99):.2f} s ({len(refs)}/{n})")  # fmt: skip
    p50 = statistics.median(first) / statistics.median(refs)
    p99 = pct(first, 0.99) / pct(refs, 0.99)
    print(f"N={n}: ratio mpjob / Job controller: p50 {p50:.2f}x, p99 {p99:.2f}x")
    print(f"N={n}: trainer exit -> next attempt created: p50 {statistics.median(nxt):.2f} s, "
          f"p99 {pct(nxt, 0.99):.2f} s ({len(nxt)}/{n})")  # fmt: skip
    print(f"N={n}: operator CPU {cpu:.1f} s, peak RSS {rss / 2**20:.0f} MiB", flush=True)


def stop_operator(op: subprocess.Popen[bytes]) -> None:
    if op.poll() is None:
        os.killpg(op.pid, signal.SIGTERM)
        try:
            op.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(op.pid, signal.SIGKILL)
            op.wait()


def run(n: int, api: client.ApiClient, kubeconfig: str, tick_seconds: float) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    ns = f"scale-{uuid.uuid4().hex[:6]}"
    new_namespace(core, ns, {"mpjob.dev/bench": "operator-scale"})
    t = Timings()
    op = start_operator(ns, kubeconfig, tick_seconds)
    try:
        threading.Thread(target=t.watch_jobs, args=(batch, ns), daemon=True).start()
        threading.Thread(target=t.watch_pods, args=(core, ns), daemon=True).start()
        create_load(n, ns, api, t)
        wait_for(lambda: sum(1 for k in t.job_seen if k.endswith("-a1")) >= n, 1800, 1, f"{n} second attempts")
        wait_for(lambda: sum(1 for k in t.first_pod if k.startswith("ref")) >= n, 600, 1, f"{n} reference pods")
        cpu, rss = proc_stats(op.pid)
        t.stop.set()
        report(n, t, cpu, rss)
    finally:
        t.stop.set()
        stop_operator(op)
        core.delete_namespace(ns, propagation_policy="Foreground")
        wait_gone(core, ns)


def install_crd(api: client.ApiClient) -> None:
    """The MixedPrecisionJob CRD from crds/ (no chart: the operator runs as a local process)."""
    body = yaml.safe_load(Path("crds/mixedprecisionjobs.mpjob.dev.yaml").read_text())
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(body)
    except client.rest.ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        conditions = (crd.status.conditions if crd.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, 30, 0.2, "CRD established")


def connect() -> tuple[Layout, client.ApiClient]:
    """The test cluster (started when it is not running), a client for it, and the CRD installed."""
    layout = Layout.from_env()
    if not (running(layout) and api_ready(layout)):
        up(layout)
    api = config.new_client_from_config(str(layout.kubeconfig))
    install_crd(api)
    return layout, api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jobs", type=int, nargs="*", default=[100], help="N concurrent jobs, one run each")
    parser.add_argument("--tick-seconds", type=float, default=30, help="the operator's ticker (chart default 5)")
    args = parser.parse_args()
    layout, api = connect()
    for n in args.jobs:
        run(n, api, str(layout.kubeconfig), args.tick_seconds)


if __name__ == "__main__":
    main()
