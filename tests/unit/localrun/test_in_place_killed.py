"""`mpjob run` killed (SIGKILL, trainers with it) during a fallback in place (while the fp32
replay runs, before the change) and right after it (the new attempt training in bf16), then run
again with the same --out: the rerun records every attempt once, each change the log shows as
the in-place attempt it began, and ends bit for bit where a run never killed ends."""

from __future__ import annotations

import hashlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import warm
from tests.helpers import children, gone, wait_for
from tests.unit.localrun.test_run import manifest, mpjob_run, start_runner

pytestmark = pytest.mark.unit

STEPS = 40
#: fp16 overflows from step 25 (detected at the read of step 30); the fp32 replay and the bf16
#: steps are slowed, so a kill lands while the replay runs or while attempt 1 trains: 4 s of
#: either is left after the line the test waits for, however late a starved test sends the kill.
TASK = {
    "builtin": "mlp",
    "args": {"inputs": 8, "hidden": 16, "samples": 256, "overflowAtStep": 25, "stepDelay": {"fp32": 0.4, "bf16": 0.4}},
}


def job(tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    return manifest(
        tmp, task=TASK, training={"steps": STEPS, "batchSize": 8, "logEvery": 5}, checkpoint={"everySteps": 10}
    )


def final_sha(out: Path) -> str:
    (state,) = out.glob(f"checkpoints/step-{STEPS:09d}/state.pt")
    return hashlib.sha256(state.read_bytes()).hexdigest()


def logged(out: Path) -> list[dict[str, Any]]:
    lines = (out / "attempts" / "a0" / "worker0.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def kill_when(out: Path, proc: Any, seen: Any) -> None:
    wait_for(lambda: (out / "attempts" / "a0" / "worker0.log").exists() and any(seen(e) for e in logged(out)), 180)
    workers = children(proc.pid)
    ranks = [pid for worker in workers for pid in children(worker)]
    ranks += warm.forked_for(workers + ranks)  # warm ranks: the server's children, not the stand-ins'
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(lambda: all(gone(pid) for pid in workers + ranks), 30, message="the trainers to die with the runner")


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("straight")
    done = mpjob_run(str(job(tmp)), "--out", str(tmp / "out"), "--plain")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp / "out" / "report.json").read_text())
    assert [(a["precision"], a.get("inPlace")) for a in report["attempts"]] == [("fp16", None), ("bf16", True)]
    return final_sha(tmp / "out")


def during_the_replay(event: dict[str, Any]) -> bool:
    return event["event"] == "step" and event["step"] == 30  # the read that detects the fault


def after_the_change(event: dict[str, Any]) -> bool:
    return event["event"] == "step" and event["step"] == 30 and event.get("precision") == "bf16"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.process
@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (during_the_replay, [("fp16", "Suspended", None), ("fp16", "NumericFault", None), ("bf16", "Succeeded", True)]),
        (after_the_change, [("fp16", "NumericFault", None), ("bf16", "Suspended", True), ("bf16", "Succeeded", None)]),
    ],
    ids=["during", "after"],
)
def test_a_run_killed_around_a_change_in_place_resumes_exactly(
    tmp_path: Path, straight: str, seen: Any, expected: list[tuple[str, str, bool | None]]
) -> None:
    out = tmp_path / "out"
    kill_when(out, start_runner(job(tmp_path), out), seen)
    changes = [e for e in logged(out) if e["event"] == "precisionChanged"]
    assert len(changes) == (1 if seen is after_the_change else 0)  # where the kill landed

    again = mpjob_run(str(job(tmp_path)), "--out", str(out), "--plain")
    assert again.returncode == 0, again.stdout + again.stderr
    report = json.loads((out / "report.json").read_text())
    attempts = report["attempts"]
    assert [(a["precision"], a["reason"], a.get("inPlace")) for a in attempts] == expected
    assert [a["index"] for a in attempts] == list(range(len(attempts)))  # none twice, none lost
    assert report["phase"] == "Succeeded" and report["attemptCounts"]["started"] == len(attempts)
    if changes:  # the in-place attempt as the killed run's log told it
        assert (attempts[1]["startStep"], attempts[1]["recoverySeconds"]) == (
            changes[0]["startStep"],
            changes[0]["recoverySeconds"],
        )
    assert final_sha(out) == straight
