"""`mpjob run FILE [--out DIR]`: the job on this machine, no cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from mpjob.localrun.paths import UnusableOut, prepare
from mpjob.summary import summary_lines
from mpjob.validation import InvalidManifest, load_job


def run_command(argv: list[str]) -> int:
    try:
        from mpjob.localrun.elastic import BadSchedule, WorkersSchedule
        from mpjob.localrun.progress import make_view
        from mpjob.localrun.runner import LocalRun
    except ModuleNotFoundError as exc:  # the progress view and plot are an extra
        print(f"error: `mpjob run` needs the local extra ({exc.name} is missing): pip install 'mpjob[local]'")
        return 2
    args = _parser().parse_args(argv)

    try:
        job = load_job(args.file)
    except InvalidManifest as exc:
        for problem in exc.problems:
            print(f"error: {problem}")
        return 2
    schedule = None
    if args.workers_available is not None:
        try:
            schedule = WorkersSchedule.parse(args.workers_available)
            schedule.check(job.spec)
        except BadSchedule as exc:
            print(f"error: --workers-available {exc}")
            return 2
    out: Path = args.out or Path("runs") / job.metadata.name
    try:
        prepare(out, fresh=args.fresh, job=job.metadata.name)
        view = make_view(args.mode, job.spec.training.steps)
        run = LocalRun(job, out, view, base_dir=Path(args.file).parent, schedule=schedule)
        try:
            status = run.run()
        finally:
            view.close()
    except UnusableOut as exc:
        print(f"error: --out {exc}")
        return 2
    lines = summary_lines(job.metadata.name, status)
    lines.append(f"  report: {run.paths.report}")
    shown = {"report": str(run.paths.report)}
    if not args.no_plot:
        shown["plot"] = str(run.plot())
        lines.append(f"  plot:   {shown['plot']}")
    view.info("\n".join(lines), **shown, phase=status.phase)
    if status.phase == "Succeeded":
        return 0
    return 130 if status.phase == "Suspended" else 1


def _folder(text: str) -> Path:
    """--out's folder; an empty one is refused (Path("") is the current folder, and `--out "$DIR"`
    with DIR unset would fill it with the run's files)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; name the run's folder")
    return Path(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpjob run", description=__doc__)
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
