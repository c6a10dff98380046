"""`mpjob run` charges only what its trainers ran on: a manifest that asks for a GPU per worker,
run on a machine without one, trains on the CPU and claims no GPU-seconds (it said `cost: 21
GPU-seconds`) in its summary, its report.json or its attempts; on a GPU the same run is charged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from mpjob.localrun.cli import run_command
from mpjob.localrun.gpu_time import GpuTime
from mpjob.planning.cost import gpus_held, gpus_per_worker
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobSpec
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit


def spec(gpus: int) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": gpus}})


@pytest.mark.parametrize(("device", "charged"), [("cuda", 2), ("cuda:1", 2), ("cpu", 0), (None, 0)])
def test_a_worker_is_charged_its_gpus_only_when_it_ran_on_one(device: str | None, charged: int) -> None:
    assert gpus_per_worker(spec(2), device) == charged


def test_a_clusters_pod_is_charged_the_gpus_it_asked_for() -> None:
    assert gpus_per_worker(spec(2)) == 2 and gpus_per_worker(spec(0)) == 0


def start_line(device: str, rank: int = 0) -> str:
    """A trainer's start line, as it writes it, naming the device it trains on."""
    fields = {"attempt": 0, "precision": "bf16", "requestedPrecision": "bf16", "device": device, "worldSize": 2}
    return events.format_line("start", {**fields, "startStep": 0, "totalSteps": 10, "rank": rank})


def devices_of(*lines: str) -> list[str]:
    return [e.device for line in lines if isinstance(e := events.parse_line(line), events.Start)]


@pytest.mark.parametrize(
    ("workers", "devices", "charged"),
    [
        (2, ["cuda:0"], 1),  # two workers sharing the machine's one GPU: one GPU, not workers x gpusPerWorker
        (2, ["cuda:0", "cuda:0"], 1),
        (2, ["cuda:0", "cuda:1"], 2),
        (1, ["cuda:0", "cuda:1", "cuda:2"], 2),  # never more than the workers asked for (1 x 2)
        (2, ["cpu", "cpu"], 0),
        (2, [], 0),  # no start line seen: nothing claimed
    ],
)
def test_local_workers_are_charged_the_distinct_gpus_their_start_lines_name(
    workers: int, devices: list[str], charged: int
) -> None:
    seen = devices_of(*(start_line(device, rank) for rank, device in enumerate(devices)))
    assert gpus_held(spec(2 if workers == 1 else 1), workers, seen) == charged


def test_one_worker_of_two_processes_is_charged_every_gpu_its_start_line_names() -> None:
    """processesPerWorker 2 on a machine of two GPUs: only rank 0 writes the start line, and it
    names both ranks' devices; the worker is charged two GPUs, not rank 0's one."""
    line = events.format_line(
        "start",
        {"attempt": 0, "precision": "bf16", "requestedPrecision": "bf16", "device": "cuda:0",
         "devices": ["cuda:0", "cuda:1"], "worldSize": 2, "startStep": 0, "totalSteps": 10, "rank": 0},
    )  # fmt: skip
    charged = GpuTime(spec(2))
    charged.begin(1)
    event = events.parse_line(line)
    assert event is not None
    charged.seen(event)
    assert charged.gpus(1) == 2
    charged.charge_seen(0, 1, 10.0)
    assert charged.seconds == {0: 20.0}


def test_a_start_line_naming_no_devices_is_charged_its_own_device() -> None:
    """A line from a trainer that names no `devices` (an older log, replayed after a kill)."""
    charged = GpuTime(spec(2))
    event = events.parse_line(start_line("cuda:0"))
    assert event is not None
    charged.seen(event)
    assert charged.gpus(1) == 1


@pytest.mark.process
def test_a_gpu_job_run_on_the_cpu_claims_no_gpu_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tiny_job()
    doc["spec"]["resources"] = {"gpusPerWorker": 1}
    doc["spec"]["training"] = {"steps": 4, "logEvery": 2}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert run_command([str(tmp_path / "job.yaml"), "--out", str(out), "--plain", "--no-plot"]) == 0
    report = json.loads((out / "report.json").read_text())
    (attempt,) = report["attempts"]
    said = capsys.readouterr().out
    if torch.cuda.is_available():  # the trainers took the GPU: the run is charged for it
        assert attempt["gpuSeconds"] > 0 and report["cost"]["gpuSeconds"] > 0 and "GPU-seconds" in said
        return
    assert attempt["gpuSeconds"] == 0 and report["cost"]["gpuSeconds"] == 0, report
    assert "GPU-seconds" not in said, said
