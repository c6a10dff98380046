"""Operator chaos: N concurrent MixedPrecisionJobs while the operator is SIGKILLed and
restarted at random moments K times, and the API server and etcd are each `kill -9`ed once
mid-run (the test cluster's supervisor starts them again). Every job must still converge to
Succeeded with exactly the attempt Jobs its story needs: none twice, none missing.

Half the jobs fall back once: a stand-in trainer (MPJOB_TRAINER_COMMAND) runs a random
0.5-4 s and exits 42 (numeric fault) in an fp16 attempt 0, 0 otherwise; so the fp16 jobs need
attempts a0 (fp16, NumericFault) and a1 (bf16, Succeeded), the bf16 ones a0 only. Jobs are
created through the first half of the chaos so kills land on every stage of their lives.

Reports jobs converged, duplicate and missing attempt Jobs (by name and by attempts[]), the
time from the last disruption to the last job converging, and each job's CR -> Succeeded.

Usage: make cluster && PYTHONPATH=. uv run python bench/chaos.py --jobs 20 --kills 50 [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from bench.k8s import mpjobs, new_namespace
from bench.operator_scale import connect, pct, start_operator, stop_operator, wait_gone
from tests.cluster.controlplane import Layout, api_ready
from tests.helpers import wait_for

STAND_IN = [
    sys.executable,
    "-c",
    "import json,os,random,sys,time; launch = json.loads(os.environ['MPJOB_LAUNCH']); "
    "time.sleep(random.uniform(0.5, 4)); "
    "sys.exit(42 if launch['attempt'] == 0 and launch['precision'] == 'fp16' else 0)",
]


def spec(falls_back: bool) -> dict[str, Any]:
    precision = {"mode": "fp16", "fallback": ["bf16"]} if falls_back else {"mode": "bf16"}
    return {"task": {"builtin": "mlp"}, "precision": precision, "resources": {"gpusPerWorker": 0}}


def expected_jobs(name: str, falls_back: bool) -> set[str]:
    return {f"{name}-a0", f"{name}-a1"} if falls_back else {f"{name}-a0"}


@dataclass
class Chaos:
    """The run's state: the operator process, what was created when, what was killed when."""

    ns: str
    kubeconfig: str
    layout: Layout
    api: client.ApiClient
    rng: random.Random
    op: Any = None
    created: dict[str, float] = field(default_factory=dict)
    disruptions: list[tuple[str, float]] = field(default_factory=list)

    def restart_operator(self) -> None:
        """SIGKILL the operator (no goodbye: no status write, no lease release) and start another."""
        if self.op is not None and self.op.poll() is None:
            os.killpg(self.op.pid, signal.SIGKILL)
            self.op.wait()
            self.disruptions.append(("operator", time.monotonic()))
        self.op = start_operator(self.ns, self.kubeconfig, 5, STAND_IN)

    def kill_component(self, component: str) -> None:
        """kill -9 one control-plane process; its supervisor starts it again."""
        pid = int(self.layout.child_pidfile(component).read_text())
        os.kill(pid, signal.SIGKILL)
        self.disruptions.append((component, time.monotonic()))
        wait_for(lambda: api_ready(self.layout), 120, 0.2, f"API back after killing {component}")

    def create(self, i: int) -> None:
        name = f"j{i}"
        body = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": name}}
        body["spec"] = spec(falls_back=i % 2 == 0)
        custom = client.CustomObjectsApi(self.api)
        wait_for(lambda: _created(custom, self.ns, body), 120, 0.5, f"create {name}")
        self.created[name] = time.monotonic()


def _created(custom: client.CustomObjectsApi, ns: str, body: dict[str, Any]) -> bool:
    """Create the CR, riding out an API server that is restarting (409: an earlier try landed)."""
    try:
        custom.create_namespaced_custom_object("mpjob.dev", "v1alpha1", ns, "mixedprecisionjobs", body)
    except client.rest.ApiException as exc:
        if exc.status == 409:
            return True
        if exc.status and exc.status < 500:
            raise
        return False
    except OSError:
        return False
    return True


def unleash(chaos: Chaos, jobs: int, kills: int) -> None:
    """K operator kills at random gaps; jobs created through the first half; the API server and
    etcd killed once each, a third and two thirds of the way through."""
    pending = list(range(jobs))
    plane = {kills // 3: "kube-apiserver", (2 * kills) // 3: "etcd"}
    chaos.restart_operator()
    for k in range(kills):
        while pending and len(pending) > jobs - (jobs * (k + 1)) // max(1, kills // 2):
            chaos.create(pending.pop(0))
        time.sleep(chaos.rng.uniform(0.0, 2.0))
        if k in plane:
            chaos.kill_component(plane[k])
        chaos.restart_operator()
        print(f"kill {k + 1}/{kills}: operator restarted; {len(chaos.created)} jobs created", flush=True)
    for i in pending:
        chaos.create(i)


def converged(custom: client.CustomObjectsApi, ns: str, jobs: int) -> dict[str, float]:
    """Job name -> when it was seen Succeeded (only those that are)."""
    done: dict[str, float] = {}

    def check() -> bool:
        try:
            items = mpjobs(custom, ns)
        except (client.rest.ApiException, OSError):
            return False
        for item in items:
            if (item.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                done.setdefault(item["metadata"]["name"], time.monotonic())
        return len(done) >= jobs

    wait_for(check, 900, 0.5, f"{jobs} jobs finished")
    return done


def audit(api: client.ApiClient, ns: str, jobs: int) -> tuple[list[str], list[str], list[str]]:
    """(not Succeeded, duplicate, missing): attempt Jobs by name and owner, and attempts[] in status."""
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    items = mpjobs(custom, ns)
    by_name = {i["metadata"]["name"]: i for i in items}
    attempt_jobs: dict[str, set[str]] = {}
    for job in batch.list_namespaced_job(ns).items:
        meta = job.metadata
        assert meta is not None and meta.name is not None  # the API server names every Job
        owner = next((o.name for o in meta.owner_references or [] if o.controller), "")
        attempt_jobs.setdefault(owner, set()).add(meta.name)
    failed, duplicate, missing = [], [], []
    for i in range(jobs):
        name, falls_back = f"j{i}", i % 2 == 0
        status = by_name[name].get("status") or {}
        if status.get("phase") != "Succeeded":
            failed.append(f"{name}: {status.get('phase')} {status.get('message', '')}")
        want, have = expected_jobs(name, falls_back), attempt_jobs.get(name, set())
        duplicate += sorted(have - want)
        missing += sorted(want - have)
        if len(status.get("attempts", [])) != len(want):
            duplicate.append(f"{name}: attempts[] has {len(status.get('attempts', []))}, expected {len(want)}")
    return failed, duplicate, missing


def run(layout: Layout, api: client.ApiClient, *, jobs: int, kills: int, seed: int) -> None:
    core = client.CoreV1Api(api)
    ns = f"chaos-{uuid.uuid4().hex[:6]}"
    new_namespace(core, ns, {"mpjob.dev/bench": "chaos"})
    chaos = Chaos(ns, str(layout.kubeconfig), layout, api, random.Random(seed))
    started = time.monotonic()
    try:
        unleash(chaos, jobs, kills)
        last = chaos.disruptions[-1][1]
        done = converged(client.CustomObjectsApi(api), ns, jobs)
        failed, duplicate, missing = audit(api, ns, jobs)
        lives = [done[k] - t for k, t in chaos.created.items() if k in done]
        print(f"N={jobs}, K={kills} operator kills, +1 kube-apiserver and +1 etcd kill -9, seed {seed}: "
              f"chaos phase {last - started:.0f} s")  # fmt: skip
        print(f"converged: {jobs - len(failed)}/{jobs} Succeeded; duplicate attempts: {len(duplicate)}; "
              f"missing attempts: {len(missing)}")  # fmt: skip
        print(f"last disruption -> every job converged: {max(0.0, max(done.values()) - last):.1f} s; "
              f"CR -> Succeeded p50 {statistics.median(lives):.1f} s, p99 {pct(lives, 0.99):.1f} s")  # fmt: skip
        for line in failed + duplicate + missing:
            print("  ", line)
    finally:
        if chaos.op is not None:
            stop_operator(chaos.op)
        core.delete_namespace(ns, propagation_policy="Foreground")
        wait_gone(core, ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    layout, api = connect()
    run(layout, api, jobs=args.jobs, kills=args.kills, seed=args.seed)


if __name__ == "__main__":
    main()
