"""What the ladder cost and where the run went, through the operator on the real control plane:
per-attempt GPU-seconds and wasted steps, their sums and price, the operator's counters (once,
also across a restart) and the loss-scale history of a fallback in status.timeline."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator, gpt_spec, operator_samples, pod_events
from tests.integration.operator.test_attempts import OVERFLOW

pytestmark = pytest.mark.integration

PRICE = {"amount": 3.0, "currency": "EUR"}
COUNTERS = ("mpjob_operator_gpu_", "mpjob_operator_wasted_gpu_")


def metrics_port() -> int:
    """A port for the operator's metrics beside this cluster's own (its port base + 90)."""
    return int(os.environ.get("MPJOB_CLUSTER_PORT_BASE", "18000")) + 90


@pytest.fixture
def counted(kubeconfig: str, namespace: str, crd_installed: None, tmp_path: Path) -> Iterator[Operator]:
    with Operator.running(kubeconfig, namespace, tmp_path / "operator.log", metrics_port=metrics_port()) as op:
        yield op


def samples(port: int) -> dict[str, float]:
    """The operator's cost samples (`name{labels}` -> value) from its metrics endpoint."""
    return operator_samples(port, *COUNTERS, "mpjob_operator_jobs{")


def scrape(port: int) -> dict[str, float] | None:
    try:
        return samples(port)
    except OSError:
        return None


def test_a_fallback_shows_what_it_cost_and_where_it_went(
    counted: Operator, jobs: Jobs, namespace: str, kubeconfig: str, cluster_bin: Path
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", every=20)
    # fp16's 25 steps and bf16's 40 each take over a second: the status's times have whole
    # seconds, and the in-place change splits the pod's time at the trainer's moment of it (bf16
    # alone once ran its 40 steps within the second of the change, and was charged 0 s).
    spec["task"]["args"] = {**OVERFLOW, "stepDelay": {"fp16": 0.05, "bf16": 0.05}}
    spec["costPerGpuHour"] = PRICE
    jobs.create("costly", spec)
    status = jobs.wait_phase("costly", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], second["precision"]) == ("fp16", "NumericFault", "bf16")
    # GPU-seconds: 1 pod x gpusPerWorker 1 (the test nodes' fake GPUs) x the seconds it ran, the
    # one pod's time split where its trainer changed precision in place.
    assert second["inPlace"] is True and first["gpuSeconds"] > 0 and second["gpuSeconds"] > 0
    # Wasted: the steps between the last good checkpoint (20) and the fault, trained again in bf16.
    fault = next(e for e in pod_events(kubeconfig, namespace, "costly-a0") if e["event"] == "precisionChanged")
    assert second["startStep"] == 20
    assert first["wastedSteps"] == fault["step"] - 20 == first["endStep"] - second["startStep"] > 0
    share = first["gpuSeconds"] * first["wastedSteps"] / (first["endStep"] - first["startStep"])
    assert first["wastedGpuSeconds"] == pytest.approx(share, abs=1e-3)
    assert "wastedSteps" not in second and second["samples"] == (60 - 20) * 4
    # The sums match the attempts, and the price turns them into money.
    cost = status["cost"]
    assert cost["gpuSeconds"] == pytest.approx(first["gpuSeconds"] + second["gpuSeconds"], abs=1e-3)
    assert cost["wastedGpuSeconds"] == pytest.approx(first["wastedGpuSeconds"], abs=1e-3)
    assert cost["wastedSteps"] == first["wastedSteps"]
    assert cost["currency"] == "EUR"
    assert cost["amount"] == pytest.approx(cost["gpuSeconds"] / 3600 * 3.0, rel=1e-4)
    assert cost["wastedAmount"] == pytest.approx(cost["wastedGpuSeconds"] / 3600 * 3.0, rel=1e-4)
    check_timeline(status, fault_step=fault["step"])
    check_kubectl_shows_it(cluster_bin, kubeconfig, namespace)
    check_counted_once(counted, first=first, second=second)


def check_timeline(status: dict[str, Any], *, fault_step: int) -> None:
    """The loss-scale history shows the collapse before the fallback; one span per precision."""
    points = [p for p in status["timeline"]["lossScale"] if p["attempt"] == 0]
    at = {p["step"]: p["scale"] for p in points}
    assert 20 in at, points  # the last good checkpoint's point
    last = points[-1]
    assert 20 < last["step"] <= fault_step and last["scale"] <= at[20] / 4, points
    assert not [p for p in status["timeline"]["lossScale"] if p["attempt"] == 1]  # bf16 has no scale
    spans = [(s["attempt"], s["precision"], s["fromStep"], s.get("toStep")) for s in status["timeline"]["precision"]]
    assert spans == [(0, "fp16", 0, status["attempts"][0]["endStep"]), (1, "bf16", 20, 60)]


def check_kubectl_shows_it(cluster_bin: Path, kubeconfig: str, namespace: str) -> None:
    kubectl = [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace]
    shown = subprocess.run(
        [*kubectl, "get", "mpj", "costly", "-o", "yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    status = yaml.safe_load(shown)["status"]
    assert status["cost"]["wastedSteps"] > 0 and status["timeline"]["lossScale"]


def check_counted_once(op: Operator, *, first: dict[str, Any], second: dict[str, Any]) -> None:
    """The counters hold each attempt's figures once; a restarted operator counts none again."""
    port, succeeded = op.metrics_port, 'mpjob_operator_gpu_seconds_total{outcome="Succeeded"}'
    # counted right after the status write that showed them: wait for the last attempt's figure
    seen = wait_for(lambda: (got := scrape(port)) and succeeded in got and got, 30, message="the counted figures")
    assert seen['mpjob_operator_gpu_seconds_total{outcome="NumericFault"}'] == pytest.approx(first["gpuSeconds"])
    assert seen[succeeded] == pytest.approx(second["gpuSeconds"])
    wasted = seen['mpjob_operator_wasted_gpu_seconds_total{reason="rollback"}']
    assert wasted == pytest.approx(first["wastedGpuSeconds"], abs=1e-3)
    money = seen['mpjob_operator_gpu_cost_total{currency="EUR",outcome="NumericFault"}']
    assert money == pytest.approx(first["gpuSeconds"] / 3600 * 3.0, rel=1e-3)
    op.stop()
    op.start()

    def reconciled() -> dict[str, float] | None:
        """The restarted operator's samples once it has reconciled the finished job (its phase count)."""
        got = scrape(port)
        return got if got and got.get('mpjob_operator_jobs{phase="Succeeded"}', 0) >= 1 else None

    again = wait_for(reconciled, 60, message="the restarted operator reconciled the job")
    assert not [k for k, v in again.items() if k.startswith(COUNTERS) and v], again
