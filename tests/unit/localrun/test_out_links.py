"""`mpjob run` writes its own files in --out (the workers' logs, report.json, series.json, the plot)
without following a link planted at their names: what runs in the trainers runs as the same
user and could otherwise have the runner write over a file anywhere it may write."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mpjob.localrun import workers as workers_module
from mpjob.localrun.cli import run_command
from mpjob.localrun.files import write_replacing
from mpjob.localrun.runner import LocalRun
from mpjob.localrun.series import RunSeries
from mpjob.localrun.workers import Workers
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit

KEPT = "not the runner's to write\n"


def planted(out: Path, name: str, outside: Path) -> Path:
    """A link at `out/name` to a file outside --out, which must keep its contents."""
    target = outside / f"{name}.target"
    target.write_text(KEPT)
    (out / name).symlink_to(target)
    return target


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    return out, outside


@pytest.mark.parametrize("name", ["report.tmp", "report.json"])
def test_the_report_is_written_in_out_not_through_a_link(dirs: tuple[Path, Path], name: str) -> None:
    out, outside = dirs
    target = planted(out, name, outside)
    write_replacing(out / "report.json", '{"phase": "Running"}\n')
    assert target.read_text() == KEPT
    assert not (out / "report.json").is_symlink() and json.loads((out / "report.json").read_text()) == {
        "phase": "Running"
    }
    assert not (out / "report.tmp").exists() and not (out / "report.tmp").is_symlink()


@pytest.mark.parametrize("name", ["series.tmp", "series.json"])
def test_the_series_is_written_in_out_not_through_a_link(dirs: tuple[Path, Path], name: str) -> None:
    out, outside = dirs
    target = planted(out, name, outside)
    RunSeries().save(out / "series.json")
    assert target.read_text() == KEPT
    assert not (out / "series.json").is_symlink() and RunSeries.load(out / "series.json") == RunSeries()
    assert not (out / "series.tmp").exists() and not (out / "series.tmp").is_symlink()


def test_the_workers_logs_are_written_in_out_not_through_a_link(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, outside = dirs
    targets = [planted(out, f"worker{n}.log", outside) for n in range(2)]
    spec = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "mlp"}, "workers": 2, "resources": {"gpusPerWorker": 0}}
    )
    # Workers that say a line and end, in place of the trainer's launcher.
    say = [sys.executable, "-c", "import sys; print('hello', flush=True); print('oops', file=sys.stderr)"]
    monkeypatch.setattr(workers_module, "launcher_argv", lambda *args, **kwargs: [*say, "--"])
    workers = Workers(spec, folder=out, cwd=out, python=sys.executable)
    worker0 = workers.start({})
    assert worker0.stdout is not None and worker0.stdout.read() == "hello\n"  # worker 0's stdout is piped
    for n in range(2):
        workers.wait(n)
    assert [t.read_text() for t in targets] == [KEPT, KEPT]
    assert [(out / f"worker{n}.log").is_symlink() for n in range(2)] == [False, False]
    assert (out / "worker0.log").read_text() == "oops\n" and (out / "worker1.log").read_text() == "hello\noops\n"


def test_the_plot_is_drawn_in_out_not_through_a_link(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, outside = dirs
    target = planted(out, "training.png", outside)
    job = outside / "job.yaml"
    job.write_text(json.dumps(tiny_job()))
    monkeypatch.setattr(LocalRun, "run", lambda self: MixedPrecisionJobStatus(phase="Succeeded"))
    assert run_command([str(job), "--out", str(out), "--plain"]) == 0, capsys.readouterr()
    assert target.read_text() == KEPT
    assert not (out / "training.png").is_symlink() and (out / "training.png").read_bytes()[:4] == b"\x89PNG"
