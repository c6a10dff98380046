"""`mpjob run FILE [--out DIR]`: the job on this machine, no cluster."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from mpjob.localrun.files import created
from mpjob.localrun.folder import ending_lines
from mpjob.localrun.jsonlines import error_line
from mpjob.localrun.launching import unresolved_env, unusable_working_dir
from mpjob.localrun.paths import UnusableOut, default_out, prepare, said
from mpjob.planning.backoff import BASE_SECONDS, ENV_BASE, RetryBackoff, backoff_base
from mpjob.validation import InvalidManifest, Problem, check_text, read_manifest
from mpjob_contract.binding import bound_settings
from mpjob_contract.spec_warnings import spec_warnings

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from mpjob.localrun.progress import ProgressView
    from mpjob.localrun.runner import LocalRun
    from mpjob_contract.api import MixedPrecisionJob, MixedPrecisionJobStatus


#: The exit code of `mpjob run` stopped by the user (Ctrl-C, SIGTERM), as a shell reports SIGINT.
INTERRUPTED = 130
#: The summary's plot line when the user stopped the drawing of training.png.
PLOT_INTERRUPTED = "interrupted: the plot was not drawn; `mpjob status {out} --plot FILE` draws it"
#: What a run stopped by a file it could not write tells the user to do.
UNWRITTEN = (
    "free some space or mend the permissions, then run the same command again: it resumes from its newest checkpoint"
)


def load_job(path: str | Path) -> MixedPrecisionJob:
    """The one MixedPrecisionJob in a file, or InvalidManifest naming every problem."""
    jobs, problems = check_text(read_manifest(str(path)), str(path))
    if problems:
        raise InvalidManifest(problems)
    if len(jobs) != 1:
        names = ", ".join(job.metadata.name for job in jobs)
        found = f"{len(jobs)} ({names}): mpjob run takes one file a job" if jobs else "none"
        raise InvalidManifest([Problem(str(path), 0, "", f"expected one MixedPrecisionJob, found {found}")])
    return jobs[0]


def run_command(argv: list[str]) -> int:
    json_out = _wants_json(argv)
    try:
        from mpjob.localrun.elastic import BadSchedule, WorkersSchedule
        from mpjob.localrun.progress import make_view
        from mpjob.localrun.runner import LocalRun
    except ModuleNotFoundError as exc:  # the progress view and plot are an extra
        _error(json_out, f"`mpjob run` needs the local extra ({exc.name} is missing): pip install 'mpjob[local]'")
        return 2
    args = _parser(json_errors=json_out).parse_args(argv)

    try:
        job = load_job(args.file)
    except InvalidManifest as exc:
        for problem in exc.problems:
            _error(json_out, str(problem), **({"field": problem.field} if problem.field else {}))
        return 2
    schedule = None
    if args.workers_available is not None:
        try:
            schedule = WorkersSchedule.parse(args.workers_available)
            schedule.check(job.spec)
        except BadSchedule as exc:
            _error(json_out, f"--workers-available {exc}")
            return 2
    if (why := unusable_working_dir(job.spec, Path(args.file).parent)) is not None:
        _error(json_out, f"{args.file}: spec.task.workingDir: {why}", field="spec.task.workingDir")
        return 2
    try:  # as the operator's flag reads it (mpjob.planning.backoff)
        retries = RetryBackoff(base=backoff_base(os.environ.get(ENV_BASE) or f"{BASE_SECONDS:g}"))
    except ValueError as exc:
        _error(json_out, f"{ENV_BASE}: {exc}")
        return 2
    out: Path = args.out or default_out(job.metadata.name)
    try:
        with prepare(out, fresh=args.fresh, job=job.metadata.name, binds=bound_settings(job.spec)):
            view = make_view(args.mode, job.spec.training.steps)
            warnings = spec_warnings(job.spec, in_pods=False)  # its checkpoints: a folder on disk, not in pods
            notes = (*unresolved_env(job.spec), *((f"spec.{w.field}", w.line(args.file)) for w in warnings))
            run = LocalRun(
                job, out, view, base_dir=Path(args.file).parent, schedule=schedule, notes=notes, retries=retries
            )
            status, plot, undrawn = _ran(run, view, no_plot=args.no_plot)
    except UnusableOut as exc:
        _error(json_out, f"--out {exc}")
        return 2
    except OSError as exc:  # a folder made unwritable, a full disk: said, not a traceback
        _error(json_out, f"--out {out}: the run stopped: {said(exc)}; {UNWRITTEN}")
        return 1
    lines = ending_lines(job.metadata.name, status, run.paths.report, plot)  # as `mpjob status DIR` prints it again
    if undrawn:
        lines.append(f"  plot:   {PLOT_INTERRUPTED.format(out=out)}")
    shown = {"report": str(run.paths.report), **({"plot": str(plot)} if plot is not None else {})}
    view.info("\n".join(lines), **shown, phase=status.phase)
    if status.phase == "Succeeded" and not undrawn:
        return 0
    return INTERRUPTED if status.phase == "Suspended" or undrawn else 1


def _ran(run: LocalRun, view: ProgressView, *, no_plot: bool) -> tuple[MixedPrecisionJobStatus, Path | None, bool]:
    """The run to its end, its view closed, and its plot (none with --no-plot), drawn while the
    folder is still held; and whether the user stopped the drawing (Ctrl-C or SIGTERM: the run
    had ended, its report stands, and the summary is still said)."""
    try:
        status = run.run()
    finally:
        view.close()
    if no_plot:
        return status, None, False
    try:
        return status, _plot(run), False
    except KeyboardInterrupt:
        return status, None, True


def _plot(run: LocalRun) -> Path:
    """The run's training.png, drawn from its series and status into a file of its own, renamed
    over training.png once whole: a stop while it is drawn (SIGTERM as Ctrl-C: KeyboardInterrupt)
    leaves no half-drawn PNG that `mpjob status DIR` would name. A link planted at either name (by
    what ran in the trainers) is replaced, not written through."""
    from mpjob.localrun.plot import render  # matplotlib loads only when the plot is drawn

    drawing = run.paths.plot.with_suffix(".png.tmp")
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with os.fdopen(created(drawing), "wb") as file:
            render(run.series, file, f"{run.name}: {run.status.phase}", timeline=run.status.timeline)
        os.replace(drawing, run.paths.plot)
    finally:
        signal.signal(signal.SIGTERM, previous)
        drawing.unlink(missing_ok=True)
    return run.paths.plot


def _error(json_out: bool, message: str, **fields: Any) -> None:
    """An error that ends the command before the run: an `error` event with --json, else an `error:` line."""
    print(error_line(message, **fields) if json_out else f"error: {message}", flush=True)


def _wants_json(argv: list[str]) -> bool:
    """Whether argv asks for --json, read as the parser reads it (an abbreviation counts, a `--json`
    after `--` is a file's name): known before the other arguments are, so their errors follow it."""
    probe = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    probe.add_argument("--json", action="store_true")
    try:
        known, _ = probe.parse_known_args(argv)
    except argparse.ArgumentError:  # `--json=x`: the parser refuses it, in plain words
        return False
    return bool(known.json)


class _JsonErrorsParser(argparse.ArgumentParser):
    """The parser under --json: a usage error is an `error` event on stdout (exit 2, as argparse's),
    the usage and --help go to stderr, so stdout holds JSON lines only."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(error_line(message), flush=True)
        self.exit(2)

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        super().print_help(file or sys.stderr)


def _folder(text: str) -> Path:
    """--out's folder; an empty one is refused (Path("") is the current folder, and `--out "$DIR"`
    with DIR unset would fill it with the run's files)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; name the run's folder")
    return Path(text)


def _parser(*, json_errors: bool) -> argparse.ArgumentParser:
    kind = _JsonErrorsParser if json_errors else argparse.ArgumentParser
    parser = kind(prog="mpjob run", description=__doc__)
    # A str, not a Path: Path("") is ".", and `mpjob run ''` would name the current folder.
    parser.add_argument(
        "file", help="a MixedPrecisionJob manifest (`-` reads stdin; a task.command then runs in the current folder)"
    )
    parser.add_argument(
        "--out", type=_folder, metavar="DIR", help="run directory (default: runs/<name>); reused to resume"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_const", const="json", dest="mode", help="JSON lines for scripts")
    mode.add_argument("--plain", action="store_const", const="plain", dest="mode", help="plain lines")
    parser.add_argument("--fresh", action="store_true", help="discard what --out holds (a run's only) and start over")
    parser.add_argument(
        "--no-plot", action="store_true", help="draw no training.png at the end (report.json and series.json as always)"
    )
    parser.add_argument(
        "--workers-available",
        metavar="N[,STEP:N]...",
        help="spec.elastic: simulate the cluster's capacity over the steps (3,40:2,120:3: 3 workers fit at "
        "first, 2 from step 40, 3 from step 120); the run shrinks and grows as on a cluster (docs/elastic.md)",
    )
    return parser
