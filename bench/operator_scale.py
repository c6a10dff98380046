"""Operator latency and footprint with N concurrent MixedPrecisionJobs on the test control
plane. A stand-in trainer (MPJOB_TRAINER_COMMAND) exits 42 in attempt 0 and 0 in attempt 1,
so every job walks create -> attempt 0 -> numeric fault -> attempt 1 -> Succeeded.

Measured at the client with watches: CR created -> attempt Job created, and trainer exit
(pod terminated) -> next attempt Job created; operator CPU seconds and peak RSS from /proc.

Usage: PYTHONPATH=. python bench/operator_scale.py 100 [500]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from kubernetes import client, config, watch

from tests.cluster.controlplane import Layout, api_ready, running, up

STAND_IN = [
    sys.executable,
    "-c",
    "import json,os,sys; sys.exit(42 if json.loads(os.environ['MPJOB_LAUNCH'])['attempt'] == 0 else 0)",
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proc_stats(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM"))
    return cpu, int(hwm.split()[1]) * 1024


def run(n: int, api: client.ApiClient, kubeconfig: str) -> None:
    core, batch, custom = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    ns = f"scale-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        "MPJOB_TRAINER_COMMAND": json.dumps(STAND_IN),
        "MPJOB_TICK_SECONDS": "30",
    }
    op = subprocess.Popen(
        [sys.executable, "-m", "mpjob.cli", "operator", "-n", ns, "--metrics-port", "0", "--health-port", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    created: dict[str, float] = {}
    job_seen: dict[str, float] = {}
    exited: dict[str, float] = {}
    stop = threading.Event()

    def watch_jobs() -> None:
        w = watch.Watch()
        for ev in w.stream(batch.list_namespaced_job, ns, timeout_seconds=600):
            if ev["type"] == "ADDED":
                job_seen.setdefault(ev["object"].metadata.name, time.monotonic())
            if stop.is_set():
                return

    def watch_pods() -> None:
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, ns, timeout_seconds=600):
            pod = ev["object"]
            for cs in pod.status.container_statuses or []:
                if cs.state and cs.state.terminated:
                    exited.setdefault(pod.metadata.labels.get("job-name", ""), time.monotonic())
            if stop.is_set():
                return

    threads = [threading.Thread(target=f, daemon=True) for f in (watch_jobs, watch_pods)]
    for t in threads:
        t.start()
    time.sleep(3)  # operator started and watching
    for i in range(n):
        name = f"j{i}"
        custom.create_namespaced_custom_object(
            "mpjob.dev",
            "v1alpha1",
            ns,
            "mixedprecisionjobs",
            {
                "apiVersion": "mpjob.dev/v1alpha1",
                "kind": "MixedPrecisionJob",
                "metadata": {"name": name},
                "spec": {"task": {"builtin": "mlp"}, "precision": {"mode": "fp16"}, "resources": {"gpusPerWorker": 0}},
            },
        )
        created[name] = time.monotonic()
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and sum(1 for k in job_seen if k.endswith("-a1")) < n:
        time.sleep(1)
    cpu, rss = proc_stats(op.pid)
    stop.set()
    first = [job_seen[f"{k}-a0"] - t for k, t in created.items() if f"{k}-a0" in job_seen]
    nxt = [job_seen[f"{k}-a1"] - exited[f"{k}-a0"] for k in created if f"{k}-a1" in job_seen and f"{k}-a0" in exited]
    print(
        f"N={n}: CR created -> attempt Job created: p50 {statistics.median(first):.2f} s, p99 {pct(first, 0.99):.2f} s "
        f"({len(first)}/{n})"
    )
    print(
        f"N={n}: trainer exit -> next attempt created: p50 {statistics.median(nxt):.2f} s, "
        f"p99 {pct(nxt, 0.99):.2f} s ({len(nxt)}/{n})"
    )
    print(f"N={n}: operator CPU {cpu:.1f} s, peak RSS {rss / 2**20:.0f} MiB")
    os.killpg(op.pid, signal.SIGTERM)
    op.wait(timeout=30)
    core.delete_namespace(ns)


def main() -> None:
    layout = Layout.from_env()
    if not (running(layout) and api_ready(layout)):
        up(layout)
    api = config.new_client_from_config(str(layout.kubeconfig))
    crd = Path("crds/mixedprecisionjobs.mpjob.dev.yaml")
    subprocess.run([str(Path(__file__).parent.parent / ".venv/bin/python"), "-c", "pass"], check=True)
    import yaml

    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(crd.read_text())
    try:
        ext.create_custom_resource_definition(body)
        time.sleep(2)
    except client.rest.ApiException as exc:
        if exc.status != 409:
            raise
    for n in [int(a) for a in sys.argv[1:]] or [100]:
        run(n, api, str(layout.kubeconfig))


if __name__ == "__main__":
    main()
