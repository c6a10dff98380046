"""Profiles on demand in the trainer: the kernel-time split by precision from a real
torch.profiler trace, a capture of N steps written compressed and bounded into the job's
checkpoint folder, each id captured once, and the control route on the metrics port."""

from __future__ import annotations

import gzip
import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from mpjob_contract.tracking import MAX_TRACE_BYTES, ProfileAnswer
from mpjob_trainer import control, profiling
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.profiling import ProfileCapture
from mpjob_trainer.profiling.kernels import kernel_time, op_class
from mpjob_trainer.profiling.places import BucketProfiles
from mpjob_trainer.spool import OWNER
from tests.helpers import wait_for
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

METRICS = TrainerMetrics("job", "ns", 0, "bf16")


def train_steps(capture: ProfileCapture, steps: range, *, low: bool) -> None:
    torch.manual_seed(0)
    # Wide enough that the bf16 matmuls outweigh the fp32 optimizer ops on a loaded CPU: the share
    # is measured in op time, and a preemption inside a small fp32 op skews it. The batch is made
    # once: drawing it (aten::normal_) is an fp32 op too. (Drawn each step at 128 rows, it ranged
    # 0.35-0.96 beside 2 busy loops on 2 cores and once failed a whole suite's run at 0.41; made
    # once at 512 rows, 0.77-0.98 beside 3.)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.randn(512, 256)
    for step in steps:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
            loss = model(batch).float().pow(2).mean()
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


def finished(capture: ProfileCapture, profile_id: int, steps: int) -> ProfileAnswer:
    done = wait_for(lambda: (a := capture.ask(profile_id, steps)) and a.state in ("Captured", "Failed") and a, 120)
    assert isinstance(done, ProfileAnswer)
    return done


def test_op_classes_follow_the_floating_input_types() -> None:
    assert op_class(["c10::BFloat16", "float"]) == "low" and op_class(["c10::Half"]) == "low"
    assert op_class(["float", "long int", "Scalar"]) == "fp32" and op_class(["long int", "Scalar"]) is None


@pytest.mark.parametrize(("low", "expect_low"), [(True, True), (False, False)])
def test_a_capture_of_n_steps_lands_once_in_the_checkpoint_folder(tmp_path: Path, low: bool, expect_low: bool) -> None:
    lines: list[str] = []
    capture = capture_in(tmp_path, lines)
    first = capture.ask(3, 4)
    assert first is not None and first.state == "Requested"
    assert capture.ask(4, 2) is None  # one capture in flight: another id is refused until it is written
    train_steps(capture, range(1, 9), low=low)  # asked before step 1 ends: steps 2..5 are captured
    done = finished(capture, 3, 4)
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


def post(url: str, token: str | None = None, method: str = "POST") -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=10) as got:
            return got.status, got.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_control_route_answers_posts_and_leaves_metrics_alone(tmp_path: Path) -> None:
    asked: list[tuple[int, int]] = []

    def ask(profile_id: int, steps: int) -> ProfileAnswer | None:
        asked.append((profile_id, steps))
        return ProfileAnswer(id=profile_id, state="Requested", steps=steps) if profile_id == 2 else None

    port = control.serve(0, "127.0.0.1", control.routes(CollectorRegistry(), ask, "s3cret-token"))
    base = f"http://127.0.0.1:{port}"
    code, body = post(f"{base}/profile?id=2&steps=20", "s3cret-token")
    assert code == 200 and json.loads(body) == {"id": 2, "state": "Requested", "steps": 20}
    assert post(f"{base}/profile?id=2&steps=20", "s3cret-token", method="GET")[0] == 405
    assert post(f"{base}/profile?id=x&steps=2", "s3cret-token")[0] == 400
    assert post(f"{base}/profile?id=7&steps=2", "s3cret-token")[0] == 409  # another capture in flight
    assert post(f"{base}/metrics", method="GET")[0] == 200
    assert asked == [(2, 20), (7, 2)]


@pytest.mark.parametrize("token", [None, "", "wrong-token", "s3cret-token-and-more", "s3cret-toke"])
def test_a_profile_request_without_the_attempts_token_is_refused(token: str | None) -> None:
    asked: list[tuple[int, int]] = []

    def ask(profile_id: int, steps: int) -> ProfileAnswer:
        asked.append((profile_id, steps))
        return ProfileAnswer(id=profile_id, state="Requested", steps=steps)

    port = control.serve(0, "127.0.0.1", control.routes(CollectorRegistry(), ask, "s3cret-token"))
    code, _ = post(f"http://127.0.0.1:{port}/profile?id=2&steps=20", token)
    assert code == 401 and asked == []


def test_a_trainer_given_no_token_answers_no_profile_request() -> None:
    port = control.serve(0, "127.0.0.1", control.routes(CollectorRegistry(), lambda i, s: None, None))
    assert post(f"http://127.0.0.1:{port}/profile?id=2&steps=20", "anything")[0] == 403


def test_a_trace_past_the_read_bound_fails_unparsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "MAX_RAW_TRACE_BYTES", 1000)
    monkeypatch.setattr(profiling.json, "loads", lambda *_: pytest.fail("an oversize trace was parsed"))
    capture = capture_in(tmp_path, [])
    capture.ask(1, 2)
    train_steps(capture, range(1, 5), low=False)
    done = finished(capture, 1, 2)
    assert done.state == "Failed" and "more than the 1000 bytes read" in (done.message or "")
    assert not list((tmp_path / "ck" / "profiles" / "p1").iterdir())  # nothing of it kept
    assert capture.ask(2, 1) is not None  # and the next one may go


def test_an_attempt_keeps_its_newest_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "KEPT_TRACES", 2)
    capture = capture_in(tmp_path, [])
    for profile_id in (1, 2, 3):
        capture.ask(profile_id, 1)
        train_steps(capture, range(1, 4), low=False)
        assert finished(capture, profile_id, 1).state == "Captured"
    assert sorted(p.name for p in (tmp_path / "ck" / "profiles").iterdir()) == ["p2", "p3"]


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


def test_a_bucket_jobs_profiles_go_to_its_bucket_and_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "KEPT_TRACES", 1)
    bucket = MemoryBucket()
    place = BucketProfiles(f"{SETTINGS.url}/ns/job/uid", lambda: bucket)
    capture = ProfileCapture(place, device=torch.device("cpu"), log=EventLog(0, io.StringIO()), metrics=METRICS)
    for profile_id in (1, 2):
        capture.ask(profile_id, 1)
        train_steps(capture, range(1, 4), low=False)
        done = finished(capture, profile_id, 1)
        assert done.state == "Captured", done.message
    assert done.path == f"{SETTINGS.url}/ns/job/uid/profiles/p2/trace.json.gz"
    key = f"{SETTINGS.prefix}/ns/job/uid/profiles/p2"
    assert sorted(bucket.objects) == [f"{key}/summary.json", f"{key}/trace.json.gz"]  # p1 pruned
    assert json.loads(gzip.decompress(bucket.objects[f"{key}/trace.json.gz"]))["traceEvents"]
    assert [p.name for p in place.spool.iterdir()] == [OWNER]  # nothing left on the pod's disk but its owner mark
