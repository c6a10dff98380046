"""`mpjob status DIR`: the folder `mpjob run --out DIR` left (or its report.json) is summed up as
`mpjob run` summed it up at its end; it took DIR for a cluster job's name and failed on its format.
A run still going, or killed, says so; a folder that is no run's, or a damaged report, is one
line naming what is wrong, not a traceback; an argument that is neither form names both."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from mpjob.cli import main
from mpjob.localrun import leftover
from mpjob.localrun.cli import run_command
from mpjob.localrun.paths import MAX_REPORT_BYTES, Paths, prepare
from mpjob.localrun.series import RunSeries
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.binding import bound_settings
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit

#: What a run of the tiny job holds its checkpoints to (job.json).
BINDS = bound_settings(MixedPrecisionJobSpec.model_validate(tiny_job()["spec"]))

ENDED = {
    "phase": "Failed",
    "precision": "bf16",
    "step": 30,
    "attempts": [
        {"index": 0, "precision": "fp16", "startStep": 0, "endStep": 20, "reason": "NumericFault",
         "message": "overflow", "finishTime": "2026-01-01T00:00:10+00:00"},
        {"index": 1, "precision": "bf16", "startStep": 10, "endStep": 30, "reason": "ConfigError",
         "message": "gone", "finishTime": "2026-01-01T00:00:20+00:00"},
    ],
}  # fmt: skip
SUMMARY = [
    "skip: Failed in bf16 at step 30",
    "  attempt 0: fp16 steps 0-20 NumericFault (overflow)",
    "  attempt 1: bf16 steps 10-30 ConfigError (gone)",
    "  recoveries: 1 (fp16 -> bf16)",
]


def run_folder(root: Path, report: dict[str, object] | None = None, *, job: str = "skip") -> Paths:
    """A folder as `mpjob run --out` leaves it: its job.json, and the report written by the runner's own call."""
    paths = Paths(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.json").write_text(json.dumps({"name": job}) + "\n")
    if report is not None:
        paths.save_report(MixedPrecisionJobStatus.model_validate(report))
    return paths


def status(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(["status", *argv])
    return code, capsys.readouterr().out.splitlines()


def test_a_folder_is_summed_up_as_the_run_summed_it_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = run_folder(tmp_path / "out" / "skip", ENDED)
    code, lines = status(capsys, str(paths.root))
    assert code == 0 and lines == [*SUMMARY, f"  report: {paths.report}"]
    code, lines = status(capsys, str(paths.report))  # its report.json names it too
    assert code == 0 and lines == [*SUMMARY, f"  report: {paths.report}"]


def test_a_job_named_folder_here_is_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_folder(tmp_path / "skip", ENDED)
    monkeypatch.chdir(tmp_path)
    assert status(capsys, "skip") == (0, [*SUMMARY, "  report: skip/report.json"])


def test_the_plot_is_named_only_when_drawn_at_this_ending(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = run_folder(tmp_path / "out", ENDED)
    paths.plot.write_bytes(b"png")
    assert status(capsys, str(paths.root))[1][-1] == f"  plot:   {paths.plot}"
    written = paths.report.stat().st_mtime
    os.utime(paths.plot, (written - 60, written - 60))  # an earlier run's plot, this one with --no-plot
    assert status(capsys, str(paths.root))[1][-1] == f"  report: {paths.report}"


def test_a_run_still_going_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    going = {**ENDED, "phase": "Running", "attempts": [{"index": 0, "precision": "fp16", "startStep": 0}]}
    paths = run_folder(tmp_path / "out", going)
    paths.plot.write_bytes(b"png")  # an earlier run's: this one has drawn none yet
    with prepare(paths.root, fresh=False, job="skip", binds=BINDS):  # what a live `mpjob run` holds
        code, lines = status(capsys, str(paths.root))
    assert code == 0 and "an `mpjob run` is running it" in lines[0], lines
    assert lines[1:] == [
        "skip: Running in bf16 at step 30",
        "  attempt 0: fp16 steps 0-? running",
        f"  report: {paths.report}",
    ]
    code, lines = status(capsys, str(paths.root))  # its runner gone, the attempt never ended: killed
    assert code == 0 and "was killed before the run ended (what follows is as of its newest attempt's" in lines[0]
    assert lines[0].endswith("run it again with the same --out to resume"), lines  # not 'Running' as if seen
    assert "the rerun records how far it got" in lines[0]  # worker 0 logged no step
    paths.attempt(0).mkdir(parents=True, exist_ok=True)
    step = events.format_line("step", {"time": 1004.0, "step": 25, "loss": 3.5})
    (paths.attempt(0) / leftover.EVENT_LOG).write_text(step + "\n" + '{"event": "step", "step": 2')  # cut by the kill
    code, lines = status(capsys, str(paths.root))
    assert code == 0 and "; its worker 0 log reached step 25); run it again" in lines[0], lines


def test_a_run_starting_has_no_report_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = run_folder(tmp_path / "out")
    with prepare(paths.root, fresh=False, job="skip", binds=BINDS):
        assert status(capsys, str(paths.root)) == (
            1,
            [f"error: {paths.root}: an `mpjob run` is starting in it; it has written no report.json yet"],
        )


def test_a_folder_that_is_no_run_names_what_it_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text("")
    code, lines = status(capsys, str(tmp_path))
    assert code == 1 and lines == [
        f"error: {tmp_path}: not a local run's folder: it holds no report.json (`mpjob run --out DIR` writes one)"
    ]
    code, lines = status(capsys, str(tmp_path / "train.py"))
    assert code == 1 and lines == [f"error: {tmp_path / 'train.py'}: not a local run's folder nor its report.json"]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b'{"phase": "Running", "attempts": [{"index": "x"', "Invalid JSON"),
        (b'{"attempts": 3}', "attempts: Input should be a valid array"),
        (b"{}", "it names no attempt"),
        (b"[" * 10, "Invalid JSON"),
        (b" " * (MAX_REPORT_BYTES + 1), f"over {MAX_REPORT_BYTES} bytes"),
        (b"fifo", "not a regular file"),  # reading it would hang
        (b"folder", "not a regular file"),
    ],
    ids=["cut-short", "wrong-type", "empty", "not-an-object", "too-big", "fifo", "folder"],
)
def test_a_damaged_report_is_one_line_naming_why(
    tmp_path: Path, content: bytes, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = run_folder(tmp_path / "out")
    if content == b"fifo":
        os.mkfifo(paths.report)
    elif content == b"folder":
        paths.report.mkdir()
    else:
        paths.report.write_bytes(content)
    code, lines = status(capsys, str(paths.root))
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {paths.report}: not a run's report (") and said in lines[0], lines


def test_a_damaged_job_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = run_folder(tmp_path / "out", ENDED)
    (paths.root / "job.json").write_text('{"name": "\\u001b[2Jx"}')  # no job's name: not printed
    assert status(capsys, str(paths.root)) == (
        1,
        [f"error: {paths.report}: not a run's report (job.json does not name the job its run was of)"],
    )


@pytest.mark.parametrize("argument", ["runs/nowhere", "", "Skip_1"])
def test_neither_a_folder_nor_a_name_says_both_forms_are_taken(
    argument: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["status", argument])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and f"{argument!r}: neither a local run's folder or report.json" in err, err
    assert "nor a job's name (must be lowercase letters" in err


def test_a_cluster_option_beside_a_path_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = run_folder(tmp_path / "out", ENDED)
    for option in (["-n", "team"], ["--kubeconfig", "/nonexistent"]):
        with pytest.raises(SystemExit) as ended:
            main(["status", str(paths.root), *option])
        assert ended.value.code == 2 and "are for a job on a cluster" in capsys.readouterr().err


def recorded_series() -> RunSeries:
    """What the run of ENDED recorded: its attempts' spans and step lines."""
    series = RunSeries()
    for attempt, precision, start, end in ((0, "fp16", 0, 20), (1, "bf16", 10, 30)):
        series.begin_attempt(attempt, precision, start)
        for step in range(start + 5, end + 1, 5):
            line = events.parse_line(events.format_line("step", {"step": step, "loss": 2.0}))
            assert line is not None
            series.ingest(attempt, precision, line)
        series.end_attempt(attempt, end, "NumericFault" if attempt == 0 else "ConfigError")
    return series


def test_a_folder_is_drawn_later_from_the_series_it_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with --no-plot drew no training.png but left its series.json: `--plot FILE` draws it
    from that (it was refused for any folder: 'are for a job on a cluster')."""
    paths = run_folder(tmp_path / "out", ENDED)
    recorded_series().save(paths.series)
    png = tmp_path / "later.png"
    code, lines = status(capsys, str(paths.root), "--plot", str(png))
    assert code == 0 and lines == [*SUMMARY, f"  report: {paths.report}", f"  plot: {png}"], lines
    assert png.read_bytes()[:4] == b"\x89PNG" and not paths.plot.exists()  # the folder's own is left alone


@pytest.mark.parametrize(
    ("series", "said"),
    [
        (None, "holds no series.json, which the plot is drawn from (`mpjob run` writes it)"),
        ('{"points": [{"attempt": 0}]}', "series.json: not a run's series (points.0.precision: Field required)"),
        ("link", "series.json: not a run's series (missing, a link or not a regular file)"),
    ],
    ids=["missing", "damaged", "a-link"],
)
def test_a_folder_without_a_readable_series_is_summed_up_and_its_plot_refused(
    tmp_path: Path, series: str | None, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = run_folder(tmp_path / "out", ENDED)
    if series == "link":
        recorded_series().save(tmp_path / "elsewhere.json")
        paths.series.symlink_to(tmp_path / "elsewhere.json")
    elif series is not None:
        paths.series.write_text(series)
    png = tmp_path / "later.png"
    code, lines = status(capsys, str(paths.root), "--plot", str(png))
    assert code == 1 and lines[:-1] == [*SUMMARY, f"  report: {paths.report}"], lines
    assert lines[-1].startswith(f"error: --plot {png}: ") and lines[-1].endswith(said), lines
    assert not png.exists()


def test_a_name_with_a_cluster_option_is_the_clusters_job_even_beside_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_folder(tmp_path / "skip", ENDED)
    monkeypatch.chdir(tmp_path)
    code, lines = status(capsys, "skip", "--kubeconfig", str(tmp_path / "nonexistent"))
    assert code == 1 and len(lines) == 1 and "kubeconfig" in lines[0] and "report" not in lines[0], lines


def test_a_job_name_that_no_cluster_answers_points_at_its_local_run_under_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mpjob run job.yaml` (its --out by default runs/<name>), then `mpjob status <name>`: the
    name went to a cluster, and the one line said only that no kubeconfig was usable."""
    run_folder(tmp_path / "runs" / "skip", ENDED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nonexistent"))
    code, lines = status(capsys, "skip")
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert lines[0].endswith("; the local run of that name: mpjob status runs/skip"), lines


@pytest.mark.process
def test_status_prints_again_what_the_run_printed_at_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(tiny_job("skip")))
    out = tmp_path / "out" / "skip"
    assert run_command([str(tmp_path / "job.yaml"), "--out", str(out), "--plain"]) == 0
    printed = capsys.readouterr().out.splitlines()
    ending = printed[
        next(i for i, line in enumerate(printed) if re.match(r"skip: Succeeded in \w+ at step 2$", line)) :
    ]
    assert ending[-2:] == [f"  report: {out / 'report.json'}", f"  plot:   {out / 'training.png'}"], printed
    assert status(capsys, str(out)) == (0, ending)
