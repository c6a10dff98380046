"""`mpjob run` with precision.inPlace: an fp16 overflow goes on in bf16 in the same trainer
process, recorded as the attempt a restart would have started (inPlace: true), and the run
ends where the restart path ends, bit for bit. The same with a re-promotion after the fallback
(a transient overflow): bf16 in place, then fp16 again in place, in one trainer process."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.unit.localrun.test_run import manifest, mpjob_run

pytestmark = pytest.mark.unit

GPT = {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000, "overflowAtStep": 25}


def run(tmp: Path, *, in_place: bool, gpt: dict = GPT, **precision: object) -> tuple[dict, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    precision = {"mode": "fp16", "fallback": ["bf16", "fp32"], "inPlace": in_place, **precision}
    job = manifest(tmp, task={"builtin": "gpt", "args": gpt}, precision=precision)
    result = mpjob_run(str(job), "--out", str(tmp / "out"), "--plain")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp / "out" / "report.json").read_text()), result.stdout


def series_steps(tmp: Path) -> dict[int, list[int]]:
    """Each attempt's steps in the run's series.json (what the plot draws), in order."""
    points = json.loads((tmp / "out" / "series.json").read_text())["points"]
    return {a: [p["step"] for p in points if p["attempt"] == a] for a in sorted({p["attempt"] for p in points})}


def final_sha(tmp: Path) -> str:
    (state,) = (tmp / "out").rglob("step-000000040/state.pt")
    return hashlib.sha256(state.read_bytes()).hexdigest()


@pytest.mark.process
def test_an_fp16_overflow_falls_back_in_place_and_ends_as_the_restart_path_does(tmp_path: Path) -> None:
    inplace, said = run(tmp_path / "inplace", in_place=True)
    restart, _ = run(tmp_path / "restart", in_place=False)
    for report in (inplace, restart):
        assert report["phase"] == "Succeeded" and [a["precision"] for a in report["attempts"]] == ["fp16", "bf16"]
        first, second = report["attempts"]
        assert first["reason"] == "NumericFault" and 0 < second["startStep"] < first["endStep"]
        assert second["recoverySeconds"] >= 0
    assert inplace["attempts"][1]["inPlace"] is True and restart["attempts"][1].get("inPlace") is None
    assert inplace["attempts"][1]["startStep"] == restart["attempts"][1]["startStep"]
    assert any(c["type"] == "PrecisionFallback" and c["status"] == "True" for c in inplace["conditions"])
    assert "in place" in said
    assert final_sha(tmp_path / "inplace") == final_sha(tmp_path / "restart")
    # The steps run again from the checkpoint are the second attempt's points, once each, as a restart logs them.
    steps = series_steps(tmp_path / "inplace")
    assert steps == series_steps(tmp_path / "restart"), steps
    assert steps[1][0] < inplace["attempts"][0]["endStep"] and len(set(steps[1])) == len(steps[1])
    # One trainer process for the whole in-place run; the restart path started a second.
    attempts = tmp_path / "inplace" / "out" / "attempts"
    assert sorted(p.name for p in attempts.iterdir()) == ["a0"]
    lines = (attempts / "a0" / "worker0.log").read_text().splitlines()
    assert sum(1 for line in lines if line.startswith("{") and json.loads(line)["event"] == "start") == 1
    assert sorted(p.name for p in (tmp_path / "restart" / "out" / "attempts").iterdir()) == ["a0", "a1"]


@pytest.mark.process
def test_a_fallback_and_a_repromotion_in_place_end_as_the_restart_path_does(tmp_path: Path) -> None:
    transient = {**GPT, "overflowAtStep": 12, "overflowUntilStep": 18}
    runs = {k: run(tmp_path / k, in_place=k == "inplace", gpt=transient, repromoteAfterSteps=10)[0]
            for k in ("inplace", "restart")}  # fmt: skip
    for report in runs.values():
        ends = [(a["precision"], a["reason"]) for a in report["attempts"]]
        assert ends == [("fp16", "NumericFault"), ("bf16", "Repromote"), ("fp16", "Succeeded")], report["attempts"]
        assert report["attempts"][2]["repromoted"] is True
    assert [a.get("inPlace") for a in runs["inplace"]["attempts"]] == [None, True, True]
    assert [a.get("inPlace") for a in runs["restart"]["attempts"]] == [None, None, None]
    assert sorted(p.name for p in (tmp_path / "inplace" / "out" / "attempts").iterdir()) == ["a0"]  # one process
    starts = {k: [a["startStep"] for a in report["attempts"]] for k, report in runs.items()}
    assert starts["inplace"] == starts["restart"]
    assert final_sha(tmp_path / "inplace") == final_sha(tmp_path / "restart")


@pytest.mark.process
def test_a_repromoted_precision_that_faults_again_falls_back_in_place_too(tmp_path: Path) -> None:
    """The overflow stays: fp16 faults, bf16 in place, fp16 again in place after 10 clean steps,
    which faults again, and bf16 goes on in place to the end (no further re-promotion): four
    attempts in one trainer process, ending where four restarted attempts end."""
    lasting = {**GPT, "overflowAtStep": 12}
    runs = {k: run(tmp_path / k, in_place=k == "inplace", gpt=lasting, repromoteAfterSteps=10)[0]
            for k in ("inplace", "restart")}  # fmt: skip
    for report in runs.values():
        ends = [(a["precision"], a["reason"]) for a in report["attempts"]]
        assert ends == [
            ("fp16", "NumericFault"), ("bf16", "Repromote"), ("fp16", "NumericFault"), ("bf16", "Succeeded")
        ], report["attempts"]  # fmt: skip
    assert [a.get("inPlace") for a in runs["inplace"]["attempts"]] == [None, True, True, True]
    assert sorted(p.name for p in (tmp_path / "inplace" / "out" / "attempts").iterdir()) == ["a0"]  # one process
    starts = {k: [a["startStep"] for a in report["attempts"]] for k, report in runs.items()}
    assert starts["inplace"] == starts["restart"]
    assert final_sha(tmp_path / "inplace") == final_sha(tmp_path / "restart")
