"""The operator with many MixedPrecisionJobs that stay put, on the test control plane: what it
costs the API server while nothing changes, and how fast it takes in a burst of new, edited and
deleted jobs and picks every job back up after a restart.

N jobs over 3 namespaces: most suspended, some unschedulable (a nodeSelector no node has: their
pods stay Pending), a few running a stand-in trainer that sleeps (no trainer CPU). One operator
watches the 3 namespaces (tick `--tick-seconds`, chart default 5).

Figures: seconds until every new job shows a phase (client watch); the operator's API requests
per job per minute over a quiet window, by verb and resource (the API server's
apiserver_request_total, less the same window with the operator stopped); its reconciles, status
writes and errors from its own metrics; its CPU and RSS (/proc); seconds until edits and deletes
are taken in; seconds from a restart until every job is reconciled again.

Usage: make cluster && PYTHONPATH=. uv run python bench/operator_steady.py [--jobs 60] [--window 60]
(not in scripts/bench.sh: it needs the test cluster and takes minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from typing import Any

from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families

from bench.k8s import new_namespace
from bench.operator_scale import connect, proc_stats, stop_operator, wait_gone
from mpjob_contract.api import GROUP, PLURAL, VERSION
from tests.helpers import free_port, wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]
KINDS = ("suspended", "unschedulable", "running")


def kind_of(i: int, n: int) -> str:
    """Job i of n: one in 12 runs, one in 4 is unschedulable, the rest are suspended."""
    return "running" if i % 12 == 0 else "unschedulable" if i % 4 == 1 else "suspended"


def body(name: str, kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"task": {"builtin": "mlp"}, "precision": {"mode": "fp16"}}
    spec["resources"] = {"gpusPerWorker": 0, "requests": {"cpu": "10m", "memory": "16Mi"}}
    if kind == "suspended":
        spec["runPolicy"] = {"suspend": True}
    if kind == "unschedulable":
        spec["template"] = {"nodeSelector": {"mpjob.dev/bench-no-such-node": "x"}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MixedPrecisionJob", "metadata": {"name": name}, "spec": spec}


class Operator:
    """`mpjob operator` for the namespaces, with its metrics and health ports."""

    def __init__(self, namespaces: list[str], kubeconfig: str, tick_seconds: float) -> None:
        self.metrics, health = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": kubeconfig, "MPJOB_TRAINER_COMMAND": json.dumps(SLEEPER)}
        env |= {"MPJOB_TICK_SECONDS": str(tick_seconds), "MALLOC_ARENA_MAX": "2"}
        argv = [sys.executable, "-m", "mpjob.cli", "operator", *(a for ns in namespaces for a in ("-n", ns))]
        argv += ["--metrics-port", str(self.metrics), "--health-port", str(health), "--bind-address", "127.0.0.1"]
        self.log = open(f"/tmp/operator-steady-{os.getpid()}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=self.log, start_new_session=True)
        self.started = time.monotonic()
        url = f"http://127.0.0.1:{health}/healthz"
        wait_for(lambda: self._ok(url), 60, 0.2, "operator healthy")

    def _ok(self, url: str) -> bool:
        assert self.proc.poll() is None, "the operator exited"
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)

    def figures(self) -> Counter[str]:
        """The operator's own counters (sample name + labels -> value)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as response:
            text = response.read().decode()
        out: Counter[str] = Counter()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("mpjob_operator_"):
                    labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                    out[f"{s.name}{{{labels}}}"] = int(s.value)
        return out

    def stop(self) -> None:
        stop_operator(self.proc)
        self.log.close()


def api_requests(api: client.ApiClient) -> Counter[str]:
    """apiserver_request_total by verb and resource (every client, watches included)."""
    response = api.call_api("GET", f"{api.configuration.host}/metrics", header_params={"Accept": "text/plain"})
    response.read()
    text = (response.data or b"").decode()
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "apiserver_request":
            for s in family.samples:
                if s.name == "apiserver_request_total":
                    sub = f"/{s.labels['subresource']}" if s.labels.get("subresource") else ""
                    out[f"{s.labels['verb']} {s.labels['resource']}{sub}"] += int(s.value)
    return out


class Phases:
    """A watch on the jobs of the namespaces: when each first showed a phase, its last body."""

    def __init__(self, api: client.ApiClient, namespaces: list[str]) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.phased: dict[tuple[str, str], float] = {}
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        for ns in namespaces:
            threading.Thread(target=self._watch, args=(ns,), daemon=True).start()

    def _watch(self, ns: str) -> None:
        stream = watch.Watch().stream(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, timeout_seconds=3600
        )
        for ev in stream:
            obj = ev["object"]
            key = (ns, obj["metadata"]["name"])
            if ev["type"] == "DELETED":
                self.bodies.pop(key, None)
                continue
            self.bodies[key] = obj
            if (obj.get("status") or {}).get("phase"):
                self.phased.setdefault(key, time.monotonic())


def create_all(custom: client.CustomObjectsApi, namespaces: list[str], n: int) -> dict[tuple[str, str], float]:
    """N jobs round-robin over the namespaces, created as fast as the API server takes them."""
    created: dict[tuple[str, str], float] = {}
    for i in range(n):
        ns, name = namespaces[i % len(namespaces)], f"j{i}"
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body(name, kind_of(i, n)))
        created[(ns, name)] = time.monotonic()
    return created


def window(api: client.ApiClient, op: Operator | None, seconds: float) -> tuple[Counter[str], Counter[str]]:
    """API server requests and the operator's counters over `seconds` of quiet."""
    before, mine = api_requests(api), op.figures() if op else Counter()
    time.sleep(seconds)
    after, mine_after = api_requests(api), op.figures() if op else Counter()
    return after - before, mine_after - mine


def per_job_minute(delta: Counter[str], jobs: int, seconds: float) -> dict[str, float]:
    """Requests per job per minute, watches left out (other clients' watches restart now and then:
    noise, never a cost per job)."""
    return {k: round(v / jobs / (seconds / 60), 3) for k, v in sorted(delta.items()) if v and "WATCH" not in k}


def reconciles(figures: Counter[str]) -> float:
    return figures.get("mpjob_operator_reconcile_duration_seconds_count{}", 0.0)


def quiet(api: client.ApiClient, op: Operator, n: int, seconds: float) -> None:
    with_op, mine = window(api, op, seconds)
    print(f"quiet {seconds:.0f} s with the operator: reconciles {reconciles(mine):.0f}, "
          f"errors {dict((k, v) for k, v in mine.items() if 'errors' in k or 'retries' in k)}")  # fmt: skip
    print("  API requests per job per minute (all clients):", per_job_minute(with_op, n, seconds))
    op.stop()
    without, _ = window(api, None, seconds)
    print("  ... with the operator stopped:", per_job_minute(without, n, seconds))
    print("  the operator's share:", per_job_minute(with_op - without, n, seconds), flush=True)


def restart(api: client.ApiClient, namespaces: list[str], kubeconfig: str, tick: float, n: int) -> Operator:
    t0 = time.monotonic()
    op = Operator(namespaces, kubeconfig, tick)
    healthy = time.monotonic() - t0
    wait_for(lambda: reconciles(op.figures()) >= n, 300, 0.2, f"{n} reconciles after the restart")
    print(f"restart: healthy after {healthy:.2f} s, every one of {n} jobs reconciled after "
          f"{time.monotonic() - t0:.2f} s", flush=True)  # fmt: skip
    return op


def churn(custom: client.CustomObjectsApi, phases: Phases, n: int) -> None:
    """Edit every other suspended job (training.steps) and delete every third other job."""
    keys = sorted(phases.bodies, key=lambda k: int(k[1][1:]))
    edits = [k for k in keys if kind_of(int(k[1][1:]), n) == "suspended"][::2]
    deletes = [k for k in keys if k not in edits][::3]
    t0 = time.monotonic()
    for ns, name in edits:
        patch = {"spec": {"training": {"steps": 777}}}
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, patch)
    for ns, name in deletes:
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    sent = time.monotonic() - t0

    def taken() -> bool:
        seen = [phases.bodies.get(k) or {} for k in edits]
        done = [b for b in seen if (b.get("status") or {}).get("observedGeneration") == b["metadata"]["generation"]]
        return len(done) == len(edits) and not any(k in phases.bodies for k in deletes)

    wait_for(taken, 300, 0.1, "edits observed and deletes gone")
    print(f"churn: {len(edits)} edits + {len(deletes)} deletes sent in {sent:.2f} s, all taken in "
          f"{time.monotonic() - t0:.2f} s", flush=True)  # fmt: skip


def run(args: argparse.Namespace) -> None:
    layout, api = connect()
    core, custom, kubeconfig = client.CoreV1Api(api), client.CustomObjectsApi(api), str(layout.kubeconfig)
    tag = uuid.uuid4().hex[:5]
    namespaces = [new_namespace(core, f"steady-{tag}-{i}", {"mpjob.dev/bench": "operator-steady"}) for i in range(3)]
    op = Operator(namespaces, kubeconfig, args.tick_seconds)
    try:
        phases = Phases(api, namespaces)
        created = create_all(custom, namespaces, args.jobs)
        wait_for(lambda: len(phases.phased) >= args.jobs, 300, 0.2, "every job phased")
        lag = sorted(phases.phased[k] - created[k] for k in created)
        span = max(phases.phased.values()) - min(created.values())
        print(f"N={args.jobs}: created -> phase shown: p50 {lag[len(lag) // 2]:.2f} s, max {lag[-1]:.2f} s, "
              f"all within {span:.2f} s of the first create")  # fmt: skip
        print(f"  phases {Counter((b.get('status') or {}).get('phase') for b in phases.bodies.values())}")
        time.sleep(2 * args.tick_seconds)
        cpu, rss = proc_stats(op.proc.pid)
        print(f"  operator CPU {cpu:.1f} s since start, peak RSS {rss / 2**20:.0f} MiB", flush=True)
        quiet(api, op, args.jobs, args.window)
        op = restart(api, namespaces, kubeconfig, args.tick_seconds, args.jobs)
        churn(custom, phases, args.jobs)
        _, mine = window(api, op, args.window)
        cpu, rss = proc_stats(op.proc.pid)
        print(f"after: {dict((k, v) for k, v in mine.items() if v and ('errors' in k or 'retries' in k))}, "
              f"CPU {cpu:.1f} s, peak RSS {rss / 2**20:.0f} MiB", flush=True)  # fmt: skip
    finally:
        op.stop()
        for ns in namespaces:
            core.delete_namespace(ns)
        for ns in namespaces:
            wait_gone(core, ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--window", type=float, default=60, help="seconds of each quiet window")
    parser.add_argument("--tick-seconds", type=float, default=5, help="the operator's ticker (chart default 5)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
