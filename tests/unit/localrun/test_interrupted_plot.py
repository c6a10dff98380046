"""Ctrl-C (or SIGTERM) while `mpjob run` draws its plot, after the run ended: the summary is still
printed, no half-drawn training.png is left for `mpjob status DIR` to name, and the command exits
130, as any Ctrl-C of it does. The run is stood in for (no trainer starts)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from mpjob.cli import main
from mpjob.localrun import plot, runner
from mpjob.localrun.folder import folder_lines, read_folder
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit


def succeeded(self: runner.LocalRun) -> MixedPrecisionJobStatus:
    """A run that ended Succeeded at once (its one attempt as the status records it)."""
    self.paths.root.mkdir(parents=True, exist_ok=True)
    self.status.phase = "Succeeded"
    self.status.attempts = [AttemptStatus(index=0, precision="fp32", start_step=0, end_step=2, reason="Succeeded")]
    self.record.save()
    return self.status


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_stop_while_the_plot_is_drawn_ends_with_the_summary_and_no_half_drawn_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sig: int
) -> None:
    """It printed `interrupted` alone, the summary lost, and left the PNG's first bytes as
    training.png, which `mpjob status DIR` then named as the run's plot."""

    def stopped_midway(series: Any, into: IO[bytes], title: str, **kwargs: Any) -> None:
        into.write(b"\x89PNG\r\n")  # the drawing's first bytes
        signal.raise_signal(sig)  # its handler runs before the next line

    job, out = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(tiny_job()))
    monkeypatch.setattr(runner.LocalRun, "run", succeeded)
    monkeypatch.setattr(plot, "render", stopped_midway)
    # Ctrl-C as a terminal's foreground command gets it: a process a shell started in the background
    # (a CI script's `&`) inherits SIGINT ignored, and Python then keeps it so.
    interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main(["run", str(job), "--out", str(out), "--plain"])
    finally:
        signal.signal(signal.SIGINT, interrupt)
    said = capsys.readouterr().out
    assert code == 130, said
    assert "local: Succeeded" in said and f"  report: {out / 'report.json'}" in said, said
    assert "plot was not drawn" in said and "Traceback" not in said, said
    assert not (out / "training.png").exists() and not list(out.glob("*.tmp")), sorted(out.iterdir())
    assert not any("training.png" in line for line in folder_lines(read_folder(out)))


def test_a_run_killed_while_its_plot_is_drawn_is_still_a_runs_folder_that_fresh_empties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runner killed as it drew its plot (SIGKILL, a closed terminal) leaves the drawing's file,
    training.png.tmp, in --out; `--fresh` then refused the run's own folder as one holding what no
    run wrote (exit 2), and the user had to delete it by hand."""
    job, out = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(tiny_job()))
    monkeypatch.setattr(runner.LocalRun, "run", succeeded)
    assert main(["run", str(job), "--out", str(out), "--plain", "--no-plot"]) == 0
    (out / "training.png.tmp").write_bytes(b"\x89PNG\r\n")  # the drawing the kill left: its first bytes
    capsys.readouterr()
    code = main(["run", str(job), "--out", str(out), "--plain", "--no-plot", "--fresh"])
    said = capsys.readouterr().out
    assert code == 0 and "local: Succeeded" in said, said
    assert not (out / "training.png.tmp").exists(), sorted(out.iterdir())
