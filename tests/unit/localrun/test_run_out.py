"""`mpjob run --out DIR`: a DIR that cannot hold the run is refused before anything starts,
naming --out and what to do, and `--fresh` deletes only a run's own folder."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.localrun.cli import run_command
from mpjob.localrun.runner import LocalRun
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit

JOB = tiny_job()


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    return path


@pytest.fixture
def never_launched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that would start trainers fails the test instead."""

    def launched(self: LocalRun) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(LocalRun, "run", launched)


@pytest.mark.usefixtures("never_launched")
def test_fresh_leaves_a_folder_that_holds_more_than_a_run(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = job.parent  # `--out . --fresh` from the project's folder
    (folder / "train.py").write_text("precious\n")
    (folder / "attempts").mkdir()
    assert run_command([str(job), "--out", str(folder), "--fresh"]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"error: --out {folder}: ") and "job.yaml, train.py" in out and "--fresh" in out, out
    assert (folder / "train.py").read_text() == "precious\n" and job.exists()


@pytest.mark.usefixtures("never_launched")
@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_an_out_that_is_not_a_folder_is_refused(job: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    (job.parent / "a-file").write_text("kept\n")
    for fresh in ([], ["--fresh"]):
        assert run_command([str(job), "--out", str(job.parent / where), *fresh]) == 2
        out = capsys.readouterr().out
        assert out.startswith(f"error: --out {job.parent / where}: ") and "folder" in out, out
    assert (job.parent / "a-file").read_text() == "kept\n"


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("report.json", "junk", "report.json is not a run's report"),
        ("report.json", "{}", "report.json names no attempt"),
        ("report.json", None, "report.json is not a run's report"),
        ("series.json", "[1, 2]", "series.json is not a run's series"),
    ],
    ids=["report-not-json", "report-no-attempt", "report-a-folder", "series-not-a-series"],
)
def test_a_run_folder_it_cannot_read_is_refused_and_fresh_starts_over(
    job: Path, name: str, content: str | None, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = job.parent / "out"
    out.mkdir()
    if name == "series.json":  # beside a report that reads
        report = {"phase": "Running", "attempts": [{"index": 0, "precision": "fp32", "startStep": 0}]}
        (out / "report.json").write_text(json.dumps(report))
    if content is None:
        (out / name).mkdir()
    else:
        (out / name).write_text(content)
    assert run_command([str(job), "--out", str(out), "--plain"]) == 2
    said = capsys.readouterr().out
    assert f"error: --out {out}: {needle}" in said and "--fresh" in said, said
    assert (out / name).exists()  # nothing of it lost


def test_fresh_empties_a_run_folder_and_starts_over(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = job.parent / "out"
    (out / "attempts" / "a0").mkdir(parents=True)
    (out / "checkpoints").mkdir()
    (out / "report.json").write_text("junk")
    found: list[list[str]] = []

    def started(self: LocalRun) -> MixedPrecisionJobStatus:
        found.append(sorted(p.name for p in out.iterdir()))
        return MixedPrecisionJobStatus(phase="Succeeded")

    monkeypatch.setattr(LocalRun, "run", started)
    assert run_command([str(job), "--out", str(out), "--fresh", "--plain", "--no-plot"]) == 0, capsys.readouterr()
    assert found == [["job.json"]]  # the job it is a run of, and nothing else


@pytest.mark.process
def test_an_out_that_holds_another_jobs_run_is_refused(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not taken for this job's run (it said the other job's Succeeded as its own, exit 0)."""
    out = job.parent / "out"
    assert run_command([str(job), "--out", str(out), "--plain", "--no-plot"]) == 0, capsys.readouterr()
    report = (out / "report.json").read_text()
    other = job.parent / "other.yaml"
    other.write_text(yaml.safe_dump({**JOB, "metadata": {"name": "other"}}))
    capsys.readouterr()
    assert run_command([str(other), "--out", str(out), "--plain", "--no-plot"]) == 2
    said = capsys.readouterr().out
    assert said.startswith(f"error: --out {out}: it holds a run of the job 'local', not 'other'")
    assert "pick another --out (runs/other is this job's own), or --fresh to delete the run of 'local'" in said
    assert (out / "report.json").read_text() == report
    assert run_command([str(job), "--out", str(out), "--plain", "--no-plot"]) == 0  # its own job's: as before
    assert "already ended Succeeded" in capsys.readouterr().out


def test_a_finished_run_rerun_with_other_steps_is_left_as_it_ended_and_says_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rerun ran nothing, yet rewrote the ended run's report.json with the manifest's
    training.steps (totalSteps 4 for a job that trained its 2), and said only 'use --fresh'; it
    printed the spec's warnings first, as if the spec were about to run."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text(json.dumps({"name": "local"}) + "\n")
    ended = {"phase": "Succeeded", "precision": "bf16", "step": 2, "totalSteps": 2, "attempts": [
        {"index": 0, "precision": "bf16", "startStep": 0, "endStep": 2, "reason": "Succeeded",
         "finishTime": "2026-01-01T00:00:10+00:00"}]}  # fmt: skip
    (out / "report.json").write_text(json.dumps(ended))
    report = (out / "report.json").read_text()
    longer = tmp_path / "longer.yaml"
    longer.write_text(yaml.safe_dump({**JOB, "spec": {**JOB["spec"], "training": {"steps": 4}}}))
    assert run_command([str(longer), "--out", str(out), "--plain", "--no-plot"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == (  # first: no warnings of a spec that runs nothing (4 steps, a checkpoint every 200)
        f"{out / 'report.json'} says this run already ended Succeeded; its training.steps was 2, "
        "this manifest's is 4 (a run's checkpoints hold to its own settings): use --fresh"
    ), said
    assert not [line for line in said if "warning:" in line], said
    assert json.loads((out / "report.json").read_text())["totalSteps"] == 2, report


@pytest.mark.usefixtures("never_launched")
def test_an_empty_out_is_refused_not_taken_for_the_current_folder(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--out "$DIR"` with DIR unset: Path("") is ".", and the run's files went into the current folder."""
    here = job.parent / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(SystemExit) as ended:
        run_command([str(job), "--out", ""])
    assert ended.value.code == 2
    assert "argument --out: an empty path; name the run's folder" in capsys.readouterr().err
    assert list(here.iterdir()) == []


def test_a_run_folder_in_use_is_refused_until_its_run_ends(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `mpjob run` of the same --out while the first runs took the first's attempt for a
    killed one and trained beside it (and `--fresh` deleted its checkpoints): it is refused."""
    out = job.parent / "out"
    runs: list[str] = []  # the runs that got as far as training
    second: list[int] = []

    def running(self: LocalRun) -> MixedPrecisionJobStatus:
        runs.append(self.name)
        if len(runs) == 1:  # the first run: meanwhile, a second one of its folder
            (out / "checkpoints").mkdir()
            for fresh in ([], ["--fresh"]):
                second.append(run_command([str(job), "--out", str(out), *fresh, "--plain", "--no-plot"]))
        return MixedPrecisionJobStatus(phase="Succeeded")

    monkeypatch.setattr(LocalRun, "run", running)
    assert run_command([str(job), "--out", str(out), "--plain", "--no-plot"]) == 0
    said = capsys.readouterr().out
    assert second == [2, 2] and len(runs) == 1, said
    assert said.count(f"error: --out {out}: another `mpjob run` is using it") == 2, said
    assert (out / "checkpoints").is_dir() and (out / "job.json").exists()  # nothing of the first run's lost
    assert run_command([str(job), "--out", str(out), "--fresh", "--plain", "--no-plot"]) == 0  # free once it ended


def test_a_folder_on_a_filesystem_without_locks_is_used_unheld(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An NFS mount without its lock service answers ENOLCK: the run goes on as before the lock was taken."""

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(LocalRun, "run", lambda self: MixedPrecisionJobStatus(phase="Succeeded"))
    assert run_command([str(job), "--out", str(job.parent / "out"), "--plain", "--no-plot"]) == 0, capsys.readouterr()


def _with(**args: int) -> dict[str, Any]:
    """The tiny job with these builtin args (what a user edits between two runs)."""
    return {**JOB, "spec": {**JOB["spec"], "task": {"builtin": "mlp", "args": args}}}


def test_a_rerun_of_other_checkpointed_settings_is_refused_before_anything_starts(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rerun whose task.args changed went on in the folder: its trainers started over at step
    0 and moved the run's checkpoints aside as `.corrupt-*` as they reached their steps, where
    keep-K pruned them; the earlier settings could no longer resume. It is refused, naming what
    changed and the two ways on; the earlier settings go on, and --fresh starts over."""
    out, runs = job.parent / "out", []

    def stopped(self: LocalRun) -> MixedPrecisionJobStatus:  # Ctrl-C'd after a checkpoint
        runs.append(self.spec.task.args)
        (out / "checkpoints" / "step-000000020").mkdir(parents=True, exist_ok=True)
        return MixedPrecisionJobStatus(phase="Suspended")

    monkeypatch.setattr(LocalRun, "run", stopped)
    first, edited = job.parent / "first.yaml", job.parent / "edited.yaml"
    first.write_text(yaml.safe_dump(_with(hidden=8, samples=64)))
    edited.write_text(yaml.safe_dump({**_with(hidden=16, samples=64), "spec": {**_with(hidden=16, samples=64)["spec"],
        "training": {"steps": 2, "seed": 7}}}))  # fmt: skip
    plain = ["--out", str(out), "--plain", "--no-plot"]
    assert run_command([str(first), *plain]) == 130
    kept = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    assert run_command([str(edited), *plain]) == 2
    said = capsys.readouterr().out
    assert said.startswith(f"error: --out {out}: its run was of other settings than this manifest's"), said
    assert "spec.task.args.hidden (8 -> 16); spec.training.seed (0 -> 7)." in said, said
    assert "--fresh to delete that run and start over, another --out to keep it" in said, said
    assert (
        len(runs) == 1 and sorted(p.relative_to(out) for p in out.rglob("*")) == kept
    )  # nothing started, nothing lost
    assert run_command([str(first), *plain]) == 130 and len(runs) == 2  # its own settings: goes on
    assert run_command([str(edited), *plain, "--fresh"]) == 130 and runs[-1] == {"hidden": 16, "samples": 64}
    assert json.loads((out / "job.json").read_text())["binds"]["seed"] == 7  # the new run's from now on
    assert run_command([str(first), *plain]) == 2


def test_a_job_file_from_before_its_settings_were_recorded_is_taken_and_one_it_cannot_read_refused(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(LocalRun, "run", lambda self: MixedPrecisionJobStatus(phase="Suspended"))
    out = job.parent / "out"
    out.mkdir()
    (out / "job.json").write_text(json.dumps({"name": "local"}) + "\n")
    plain = [str(job), "--out", str(out), "--plain", "--no-plot"]
    assert run_command(plain) == 130, capsys.readouterr()
    assert json.loads((out / "job.json").read_text())["binds"]["task"]["builtin"] == "mlp"
    for binds in ({"task": {}}, [1], {"task": {}, "seed": 0, "samplesPerStep": 1, "more": 1}):
        (out / "job.json").write_text(json.dumps({"name": "local", "binds": binds}))
        assert run_command(plain) == 2
        said = capsys.readouterr().out
        assert f"error: --out {out}: job.json binds: not the settings a run's checkpoints hold to" in said, said


@pytest.mark.process
def test_a_trained_run_keeps_its_checkpoint_from_a_rerun_of_other_args(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = job.parent / "out"
    assert run_command([str(job), "--out", str(out), "--plain", "--no-plot"]) == 0, capsys.readouterr()
    saved = {p.relative_to(out): p.read_bytes() for p in (out / "checkpoints").rglob("*") if p.is_file()}
    assert any(p.name == "manifest.json" for p in saved), saved
    edited = job.parent / "edited.yaml"
    edited.write_text(yaml.safe_dump(_with(hidden=16)))
    capsys.readouterr()
    assert run_command([str(edited), "--out", str(out), "--plain", "--no-plot"]) == 2
    assert "spec.task.args.hidden (unset -> 16)." in capsys.readouterr().out
    assert {p.relative_to(out): p.read_bytes() for p in (out / "checkpoints").rglob("*") if p.is_file()} == saved


def test_fresh_starts_over_from_no_checkpoint_of_the_earlier_run_in_a_bucket(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """checkpoint.storage.s3: the run's checkpoints lie in the bucket, below a folder named for
    --out. `--fresh` deleted --out, not that folder, and its first attempt's trainers resumed
    from the newest checkpoint they found there: the earlier run's, not a start over. A rerun
    without --fresh goes on in the same folder; so does one of a folder from before job.json
    named its run."""
    s3 = {"bucket": "bkt", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "keys"}
    job.write_text(yaml.safe_dump({**JOB, "spec": {**JOB["spec"], "checkpoint": {"storage": {"s3": s3}}}}))
    used: list[str] = []

    def ran(self: LocalRun) -> MixedPrecisionJobStatus:
        used.append(self.checkpoint_dir)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        status = MixedPrecisionJobStatus(phase="Suspended", attempts=[AttemptStatus(index=0, precision="fp32")])
        self.paths.save_report(status)
        return status

    monkeypatch.setattr(LocalRun, "run", ran)
    out = job.parent / "out"
    plain = [str(job), "--out", str(out), "--plain", "--no-plot"]
    for argv in (plain, plain, [*plain, "--fresh"], plain):
        assert run_command(argv) == 130, capsys.readouterr()
    first, rerun, fresh, fresh_rerun = used
    assert first.startswith("s3://bkt/mpjob/local/local/local-") and rerun == first and fresh_rerun == fresh
    assert fresh != first
    (out / "job.json").write_text(json.dumps({"name": "local"}) + "\n")  # a run from before: its folder kept
    assert run_command(plain) == 130
    assert (
        used[-1] == f"s3://bkt/mpjob/local/local/local-{hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]}"
    )
