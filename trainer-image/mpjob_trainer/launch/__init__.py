"""`mpjob-launch [flags] -- CMD ...`: the entrypoint of every trainer pod.

Starts N local ranks of CMD (an argv list, never a shell) with the environment torchrun
would give them (RANK = worker index x N + local rank, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...) and a private termination
report path each; passes SIGTERM/SIGINT on; stops the siblings of a rank that fails by
itself (SIGTERM, then SIGKILL after the grace period); and folds every rank's ending into
ONE exit code and ONE termination report for the pod (precedence: `fold.PRECEDENCE`).

Why not torchrun: its elastic agent exits with its own code instead of the rank's (42, 43
and 44 would all read as "failed"), restarts workers itself (mpjob decides retries per
attempt, in a precision it chooses), and leaves no termination report. docs/launcher.md
has the whole story.

Parts: `plan` (flags and env -> LaunchPlan, each rank's env), `supervise` (processes and
signals), `fold` (pure: endings -> the pod's code and report). Standard library and
mpjob_contract only: no torch, so the launcher starts in a fraction of a second.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path

from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import DEFAULT_TERMINATION_LOG, TERMINATION_LOG_ENV, TerminationReport
from mpjob_trainer.launch.fold import PodEnding, RankEnding, fold_endings
from mpjob_trainer.launch.plan import LaunchConfigError, LaunchPlan, parse_plan
from mpjob_trainer.launch.supervise import Supervisor, say

__all__ = ["LaunchConfigError", "LaunchPlan", "PodEnding", "RankEnding", "fold_endings", "main", "parse_plan"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one pod's local ranks; the folded exit code (the report is written on the way out)."""
    env = dict(os.environ)
    report_path = env.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG
    try:
        plan = parse_plan(sys.argv[1:] if argv is None else argv, env)
    except LaunchConfigError as exc:
        say(f"error: {exc}")
        report = TerminationReport(reason=Reason.CONFIG_ERROR, message=f"mpjob-launch: {exc}")
        return _finish(PodEnding(int(ExitCode.CONFIG_ERROR), report), report_path)
    try:
        with tempfile.TemporaryDirectory(prefix="mpjob-launch-") as folder:
            endings = Supervisor(plan, env, Path(folder)).run()
    except Exception as exc:  # the launcher's own failure: still one code and one report
        traceback.print_exc()
        report = TerminationReport(reason=Reason.INFRA_ERROR, message=f"mpjob-launch: {type(exc).__name__}: {exc}")
        return _finish(PodEnding(int(ExitCode.INFRA_ERROR), report), report_path)
    return _finish(fold_endings(endings), report_path)


def _finish(ending: PodEnding, report_path: str) -> int:
    try:
        ending.report.write(report_path)
    except OSError as exc:
        say(f"cannot write the termination report to {report_path}: {exc.strerror or exc}")
    say(f"exit {ending.code} ({ending.report.reason}): {ending.report.message}")
    return ending.code
