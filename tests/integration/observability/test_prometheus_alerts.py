"""A real Prometheus (the Debian binary) scrapes real trainer runs on loopback with the
chart's alert rules loaded: NumericFaultHalt fires for an fp16 run whose activations
overflow, and never for a stable fp16 run. Needs no Kubernetes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import LAUNCH_ENV
from mpjob_contract.metrics import METRICS_PORT_ENV
from tests import warm
from tests.helpers import free_port, wait_for
from tests.unit.observability.promtool import RULES, require

pytestmark = pytest.mark.integration

SCRAPE = "250ms"
EVALUATE = "1s"
#: Each fp16 step sleeps 20 ms (stepDelay): the runs last as long as the scrapes need while
#: their cores stay mostly free (the stable run trains until the test has seen the alert).
TASK = {
    "builtin": "gpt",
    "args": {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000, "stepDelay": {"fp16": 0.02}},
}
# The guard allows a run of overflowing steps (one log line each, ~5 s of them) before it
# ends fp16, so the scrapes (every 250 ms) see the non-finite losses climb before it exits 42.
OVERFLOW_GUARD = {"maxNonFiniteLosses": 200, "maxConsecutiveOverflows": 200, "minLossScale": 0}


@dataclass
class Prometheus:
    url: str

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr)["result"])

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        alerts = self.get("/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def trainer(tmp: Path, job: str, port: int, overflow_at: int | None, steps: int) -> warm.Popen:
    args = dict(TASK["args"]) | ({"overflowAtStep": overflow_at} if overflow_at is not None else {})
    precision: dict[str, Any] = {"mode": "fp16"} | ({"guard": OVERFLOW_GUARD} if overflow_at is not None else {})
    spec = {
        "task": {"builtin": TASK["builtin"], "args": args},
        "training": {"steps": steps, "batchSize": 4, "logEvery": 1 if overflow_at is not None else 10},
        "precision": precision,
        "checkpoint": {"everySteps": 50, "keep": 1},
        "resources": {"gpusPerWorker": 0},
    }
    launch = {
        "jobName": job,
        "namespace": "obs",
        "attempt": 0,
        "precision": "fp16",
        "checkpointDir": str(tmp / job / "ckpt"),
        "spec": spec,
    }
    env = {
        **os.environ,
        LAUNCH_ENV: json.dumps(launch),
        METRICS_PORT_ENV: str(port),
        "MPJOB_METRICS_HOST": "127.0.0.1",
        "MPJOB_TERMINATION_LOG": str(tmp / job / "report.json"),
        "OMP_NUM_THREADS": "1",
    }
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    (tmp / job).mkdir()
    with (tmp / job / "stdout.log").open("wb") as out:
        return warm.Popen([sys.executable, "-m", "mpjob_trainer"], env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    """Start Prometheus scraping the given loopback ports, with the mpjob rules loaded."""
    binary = require("prometheus")
    started: list[subprocess.Popen[bytes]] = []

    def start(targets: list[int]) -> Prometheus:
        port = free_port()
        config = {
            "global": {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE, "evaluation_interval": EVALUATE},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "mpjob-trainer",
                    "honor_labels": True,  # the trainer's `job` label is the MixedPrecisionJob
                    "static_configs": [{"targets": [f"127.0.0.1:{t}" for t in targets]}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                return response.status == 200

        wait_for(ready, 30, message="Prometheus ready")
        return Prometheus(url)

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_numeric_fault_halt_fires_for_an_overflowing_fp16_run_and_not_for_a_stable_one(
    tmp_path: Path, prometheus_for: Any
) -> None:
    overflow_port, stable_port = free_port(), free_port()
    prom = prometheus_for([overflow_port, stable_port])
    rules = {r["name"]: r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]}
    assert "NumericFaultHalt" in rules

    overflowing = trainer(tmp_path, "overflow", overflow_port, overflow_at=100, steps=5000)
    # The stable run trains until the test has seen what it needs, then is preempted: it never
    # races the scrapes by finishing early.
    stable = trainer(tmp_path, "stable", stable_port, overflow_at=None, steps=1_000_000)
    try:

        def stable_scraped() -> bool:
            assert stable.poll() is None, (tmp_path / "stable/stdout.log").read_text()[-3000:]
            return bool(prom.query('mpjob_trainer_step{job="stable",precision="fp16"} > 0'))

        wait_for(stable_scraped, 120, 0.25, "a scrape of the stable run past step 0")
        assert overflowing.wait(timeout=240) == ExitCode.NUMERIC_FAULT, (tmp_path / "overflow/stdout.log").read_text()

        # What the scrapes saw before the overflowing trainer exited.
        seen = prom.query('max_over_time(mpjob_trainer_non_finite_losses_total{job="overflow"}[10m])')
        assert seen and float(seen[0]["value"][1]) > 0, "the scrapes should have caught the NaN/Inf losses"

        firing = wait_for(lambda: prom.firing("NumericFaultHalt"), 120, 0.5, "NumericFaultHalt firing")
        assert stable.poll() is None, "the stable run is still training while the alert fires"
    finally:
        for proc in (overflowing, stable):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (overflowing, stable):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert stable.returncode == ExitCode.PREEMPTED, (tmp_path / "stable/stdout.log").read_text()[-3000:]

    expected = {"alertname": "NumericFaultHalt", "job": "overflow", "namespace": "obs", "precision": "fp16"}
    assert [a["labels"] for a in firing] == [expected | {"severity": "page"}]
    assert firing[0]["annotations"]["runbook_url"] == "docs/runbooks/NumericFaultHalt.md"

    # Never, not even pending, for the stable run (ALERTS keeps every evaluation's state).
    assert prom.query('ALERTS{alertname="NumericFaultHalt",job="overflow",alertstate="firing"}')
    assert prom.query('count_over_time(ALERTS{alertname="NumericFaultHalt",job="stable"}[15m])') == []
    # Every rule evaluates cleanly against real trainer series.
    rules = {r["name"]: r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]}
    assert {name: r["health"] for name, r in rules.items()} == dict.fromkeys(rules, "ok")
