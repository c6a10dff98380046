"""A local run's folder read back: `mpjob status DIR` (DIR: `mpjob run --out`'s folder, or its
report.json) prints the summary `mpjob run` printed at its end, from the report it left.

What is read is untrusted (`paths.read_report`, `paths.recorded_job`). A run whose runner still
holds the folder (`paths.held_by_a_run`) is said to be going, its report being as of its newest
attempt's start or end; one whose newest attempt never ended, its folder held by no runner, was
killed: the rerun of the same --out ends that attempt and goes on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mpjob.localrun import leftover, rerun
from mpjob.localrun.paths import Paths, Unreadable, held_by_a_run, read_report, recorded_job
from mpjob.localrun.series import RunSeries, read_series
from mpjob.planning import history
from mpjob.summary import summary_lines
from mpjob_contract import formats
from mpjob_contract.api import MixedPrecisionJobStatus

REPORT = "report.json"
#: What the lines of a run that has not ended are: report.json is written at each attempt's start and end.
AS_OF = "what follows is as of its newest attempt's start or end"


class NotARun(Exception):
    """The folder is not a local run's, or its files cannot be read; the message says why."""


def is_folder_argument(text: str, *, cluster: bool) -> bool:
    """Whether `mpjob status TEXT` names a local run's folder or report, not a cluster job: what no
    job can be named (a path: `out/run`, `.`, `report.json`), or a job's name that is a folder here
    (`--out skip` from this folder), unless the command names a cluster (`cluster`: -n, --kubeconfig)."""
    if not re.fullmatch(formats.JOB_NAME.pattern, text):
        return True
    return not cluster and Path(text).is_dir()


def ending_lines(name: str, status: MixedPrecisionJobStatus, report: Path, plot: Path | None) -> list[str]:
    """What `mpjob run` prints at its end: the job's summary, where its report is and its plot."""
    lines = summary_lines(name, status)
    if (fix := rerun.fix_line(status)) is not None:
        lines.append(fix)
    lines.append(f"  report: {report}")
    if plot is not None:
        lines.append(f"  plot:   {plot}")
    return lines


@dataclass(frozen=True)
class RunFolder:
    """A local run's folder as read back: where it is, its report and the status it holds, the
    job's name, and whether a runner holds the folder (None: cannot be told)."""

    root: Path
    report: Path
    status: MixedPrecisionJobStatus
    name: str
    held: bool | None


def read_folder(target: Path) -> RunFolder:
    """The local run whose folder (or report.json) is `target`; NotARun says why there is none."""
    root, report = (target, target / REPORT) if target.is_dir() else (target.parent, target)
    if report.name != REPORT:
        raise NotARun(f"{target}: not a local run's folder nor its {REPORT}")
    try:
        held = held_by_a_run(root)
        if not report.exists() and not report.is_symlink():
            if held:
                raise NotARun(f"{root}: an `mpjob run` is starting in it; it has written no {REPORT} yet")
            raise NotARun(f"{root}: not a local run's folder: it holds no {REPORT} (`mpjob run --out DIR` writes one)")
        status = read_report(report)
        if not status.attempts and status.phase != "Suspended":  # runPolicy.suspend starts none
            raise Unreadable("it names no attempt")
        name = recorded_job(root) or root.resolve().name
    except Unreadable as exc:
        raise NotARun(f"{report}: not a run's report ({exc})") from exc
    except OSError as exc:
        raise NotARun(f"{root}: cannot read it ({exc.strerror or exc})") from exc
    return RunFolder(root, report, status, name, held)


def folder_lines(run: RunFolder) -> list[str]:
    """The summary of the local run read back, as `mpjob run` printed it at its end."""
    plot = _plot(Paths(run.root), run.report, run.held)
    return _going(run.root, run.status, run.held) + ending_lines(run.name, run.status, run.report, plot)


def folder_series(run: RunFolder) -> RunSeries:
    """The series the run recorded (series.json, written with report.json whether or not it drew
    its plot: `mpjob run --no-plot`), to draw it later; NotARun says why it cannot be read."""
    path = Paths(run.root).series
    if not path.exists() and not path.is_symlink():
        raise NotARun(f"{run.root}: holds no {path.name}, which the plot is drawn from (`mpjob run` writes it)")
    try:
        return read_series(path)
    except Unreadable as exc:
        raise NotARun(f"{path}: not a run's series ({exc})") from exc


def _going(root: Path, status: MixedPrecisionJobStatus, held: bool | None) -> list[str]:
    """A line before the summary of a run that has not ended: going, killed, or not known which."""
    ended = not status.attempts or status.attempts[-1].finish_time is not None
    if held:
        return [f"{root}: an `mpjob run` is running it; {AS_OF}"]
    if ended:
        return []
    if held is None:
        return [f"{root}: its newest attempt has not ended, and whether its `mpjob run` still runs cannot be told"]
    step = _logged_step(root, status)
    got = f"its worker 0 log reached step {step}" if step is not None else "the rerun records how far it got"
    return [
        f"{root}: its `mpjob run` was killed before the run ended ({AS_OF}; {got}); "
        "run it again with the same --out to resume"
    ]


def _logged_step(root: Path, status: MixedPrecisionJobStatus) -> int | None:
    """The step the newest attempt's lines in worker 0's log reach (as the rerun reads them:
    `leftover`); None when none names one or the log cannot be read."""
    owner = history.job_index(status, status.attempts[-1].index)  # one begun in place logs in its chain's
    try:
        return leftover.reached_step(leftover.logged_events(Paths(root).attempt(owner)))
    except OSError:
        return None


def _plot(paths: Paths, report: Path, held: bool | None) -> Path | None:
    """The run's training.png when it was drawn at the run's end (not older than its report: a run
    with --no-plot leaves an earlier run's, which is not this ending's); none while it runs."""
    try:
        drawn, written = paths.plot.stat(), report.stat()
    except OSError:
        return None
    return paths.plot if not held and paths.plot.is_file() and drawn.st_mtime >= written.st_mtime else None
