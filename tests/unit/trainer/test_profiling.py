"""Profiles on demand in the trainer: the kernel-time split by precision from a real
torch.profiler trace, a capture of N steps written compressed and bounded into the job's
checkpoint folder, each id captured once, and the control route on the metrics port."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from mpjob_contract.tracking import MAX_TRACE_BYTES, ProfileAnswer
from mpjob_trainer import control
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.profiling import ProfileCapture
from mpjob_trainer.profiling.kernels import kernel_time, op_class
from tests.helpers import wait_for

pytestmark = pytest.mark.unit


def train_steps(capture: ProfileCapture, steps: range, *, low: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
            loss = model(torch.randn(16, 32)).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        capture.step(step)


def capture_in(tmp_path: Path, lines: list[str]) -> ProfileCapture:
    class Lines:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    metrics = TrainerMetrics("job", "ns", 0, "bf16")
    return ProfileCapture(str(tmp_path / "ck"), device=torch.device("cpu"), log=EventLog(0, Lines()), metrics=metrics)


def test_op_classes_follow_the_floating_input_types() -> None:
    assert op_class(["c10::BFloat16", "float"]) == "low" and op_class(["c10::Half"]) == "low"
    assert op_class(["float", "long int", "Scalar"]) == "fp32" and op_class(["long int", "Scalar"]) is None


@pytest.mark.parametrize(("low", "expect_low"), [(True, True), (False, False)])
def test_a_capture_of_n_steps_lands_once_in_the_checkpoint_folder(tmp_path: Path, low: bool, expect_low: bool) -> None:
    lines: list[str] = []
    capture = capture_in(tmp_path, lines)
    first = capture.ask(3, 4)
    assert first.state == "Requested"
    assert capture.ask(4, 2).state == "Requested" and capture.ask(4, 2).message  # waits for the one before
    train_steps(capture, range(1, 9), low=low)  # asked before step 1 ends: steps 2..5 are captured
    done = wait_for(lambda: (a := capture.ask(3, 4)).state in ("Captured", "Failed") and a, timeout=120)
    assert done.state == "Captured", done.message
    assert (done.steps, done.first_step) == (4, 2)
    trace = tmp_path / "ck" / "profiles" / "p3" / "trace.json.gz"
    assert done.path == str(trace) and done.trace_bytes == trace.stat().st_size <= MAX_TRACE_BYTES
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    optimizer_steps = [e for e in events if str(e.get("name", "")).startswith("Optimizer.step#")]
    assert len(optimizer_steps) == 4
    share = done.low_precision_kernel_share
    assert share is not None and ((share > 0.5) if expect_low else (share == 0.0))
    summary = ProfileAnswer.model_validate_json((trace.parent / "summary.json").read_text())
    assert summary.low_precision_kernel_share == share
    assert not list(trace.parent.glob(".tmp-*"))  # nothing half-written left behind
    profile_lines = [json.loads(line) for line in lines if '"profile"' in line]
    assert [line["id"] for line in profile_lines] == [3]
    # asked again (the operator asks on every tick): the same answer, no second capture
    assert capture.ask(3, 4) == done and capture.pending is None


def test_the_control_route_answers_posts_and_leaves_metrics_alone(tmp_path: Path) -> None:
    asked: list[tuple[int, int]] = []

    def ask(profile_id: int, steps: int) -> ProfileAnswer:
        asked.append((profile_id, steps))
        return ProfileAnswer(id=profile_id, state="Requested", steps=steps)

    port = control.serve(0, "127.0.0.1", control.routes(CollectorRegistry(), ask))
    base = f"http://127.0.0.1:{port}"
    request = urllib.request.Request(f"{base}/profile?id=2&steps=20", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read()) == {"id": 2, "state": "Requested", "steps": 20}
    for bad, code in (("/profile?id=2&steps=20", 405), ("/profile?id=x&steps=2", 400)):
        method = "GET" if code == 405 else "POST"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(base + bad, method=method), timeout=10)
        assert err.value.code == code
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
        assert answer.status == 200
    assert asked == [(2, 20)]


def test_kernel_time_on_a_gpu_trace_counts_kernels_by_their_launching_op() -> None:
    half, single = {"External id": 1, "Input type": ["c10::Half"]}, {"External id": 2, "Input type": ["float"]}
    trace = {
        "traceEvents": [
            {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5, "args": half},
            {"cat": "cpu_op", "name": "aten::add", "ts": 6, "dur": 5, "args": single},
            {"cat": "kernel", "name": "sm80_gemm", "ts": 1, "dur": 30, "args": {"External id": 1}},
            {"cat": "kernel", "name": "elementwise", "ts": 7, "dur": 10, "args": {"External id": 2}},
        ]
    }
    assert kernel_time(trace).low_share == 0.75
