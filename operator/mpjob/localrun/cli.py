"""`mpjob run FILE [--out DIR]`: the job on this machine, no cluster."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from mpjob.validation import InvalidManifest, load_job
from mpjob_contract.codes import Reason
from mpjob_contract.skipping import Skipped, describe_ranges, describe_steps


def run_command(argv: list[str]) -> int:
    try:
        from mpjob.localrun.progress import make_view
        from mpjob.localrun.runner import LocalRun
    except ModuleNotFoundError as exc:  # the progress view and plot are an extra
        print(f"error: `mpjob run` needs the local extra ({exc.name} is missing): pip install 'mpjob[local]'")
        return 2
    parser = argparse.ArgumentParser(prog="mpjob run", description=__doc__)
    parser.add_argument("file", type=Path, help="a MixedPrecisionJob manifest")
    parser.add_argument("--out", type=Path, help="run directory (default: runs/<name>); reused to resume")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_const", const="json", dest="mode", help="JSON lines for scripts")
    mode.add_argument("--plain", action="store_const", const="plain", dest="mode", help="plain lines")
    parser.add_argument("--fresh", action="store_true", help="discard what --out holds and start over")
    args = parser.parse_args(argv)

    try:
        job = load_job(args.file)
    except InvalidManifest as exc:
        for problem in exc.problems:
            print(f"error: {problem}")
        return 2
    out: Path = args.out or Path("runs") / job.metadata.name
    if args.fresh and out.exists():
        shutil.rmtree(out)
    view = make_view(args.mode, job.spec.training.steps)
    run = LocalRun(job, out, view, base_dir=args.file.parent)
    try:
        status = run.run()
    finally:
        view.close()
    plot = run.plot()
    lines = [f"{job.metadata.name}: {status.phase} in {status.precision} at step {status.step}"]
    for a in status.attempts:
        lines.append(
            f"  attempt {a.index}: {a.precision} steps {a.start_step}-{a.end_step if a.end_step is not None else '?'}"
            f" {a.reason or 'running'}" + (f" ({a.message})" if a.message and a.reason != Reason.SUCCEEDED else "")
        )
    if status.skipped:
        lines.append(skipped_line(status.skipped))
    if status.last_checkpoint:
        ck = status.last_checkpoint
        lines.append(f"  last checkpoint: step {ck.step} ({ck.precision}) sha256 {ck.sha256[:16]}")
    lines.append(f"  report: {run.paths.report}")
    lines.append(f"  plot:   {plot}")
    view.info("\n".join(lines), report=str(run.paths.report), plot=str(plot), phase=status.phase)
    if status.phase == "Succeeded":
        return 0
    return 130 if status.phase == "Suspended" else 1


def skipped_line(skipped: Skipped) -> str:
    """'  skipped: 1 step(s), 1 sample(s): step 5 (data: 30)' for the summary (steps counted from 1)."""
    shown = ", ".join(
        f"step {describe_steps([s.step])} ({s.cause}: {describe_ranges(s.samples) or 'whole step'})"
        for s in skipped.steps
    )
    return f"  skipped: {skipped.count} step(s), {skipped.samples} sample(s): {shown}"
