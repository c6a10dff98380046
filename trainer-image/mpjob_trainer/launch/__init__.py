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

Parts: `signals` (the inbox, installed first), `plan` (flags and env -> LaunchPlan, each
rank's env), `supervise` (processes and signals), `script` (python's script not there: no
rank started), `tee` (each rank's stderr and its tail), `exits` (how ranks ended; a lone
rank's own ending passed through), `fold` (pure: endings -> the pod's code and report),
`provisional` (the pod's report while its ranks stop, which a pod killed before they end
leaves), `reports` (where the ranks write theirs). The start path is the standard library
and the contract's light modules only: pydantic is imported when a report must be built
(`fold`), torch never.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.environment import DEFAULT_TERMINATION_LOG, TERMINATION_LOG_ENV
from mpjob_trainer.launch.exits import Passthrough, RankExit, passthrough
from mpjob_trainer.launch.plan import LaunchConfigError, LaunchPlan, parse_plan
from mpjob_trainer.launch.provisional import provisional_message
from mpjob_trainer.launch.reports import private_folder
from mpjob_trainer.launch.signals import Inbox, say, signal_inbox
from mpjob_trainer.launch.supervise import Supervisor

if TYPE_CHECKING:
    from mpjob_trainer.launch.fold import PodEnding, RankEnding, fold_endings

__all__ = ["LaunchConfigError", "LaunchPlan", "PodEnding", "RankEnding", "fold_endings", "main", "parse_plan"]


def __getattr__(name: str) -> Any:
    """The fold's names, imported on first use: they bring pydantic, which the start path avoids."""
    if name in ("PodEnding", "RankEnding", "fold_endings"):
        from mpjob_trainer.launch import fold

        return getattr(fold, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one pod's local ranks; the folded exit code (the report is written on the way out)."""
    with signal_inbox() as inbox:  # first: a stop during start-up must not be lost
        return _launch(sys.argv[1:] if argv is None else argv, inbox)


def _launch(argv: Sequence[str], inbox: Inbox) -> int:
    env = dict(os.environ)
    report_path = env.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG
    try:
        plan = parse_plan(argv, env)
    except LaunchConfigError as exc:
        say(f"error: {exc}")
        return _made(Reason.CONFIG_ERROR, ExitCode.CONFIG_ERROR, f"mpjob-launch: {exc}", report_path)
    try:
        with private_folder() as folder:
            exits = Supervisor(plan, env, folder, inbox, on_stopping=_provisional(report_path)).run()
    except Exception as exc:  # the launcher's own failure: still one code and one report
        import traceback

        traceback.print_exc()
        message = f"mpjob-launch: {type(exc).__name__}: {exc}"
        return _made(Reason.INFRA_ERROR, ExitCode.INFRA_ERROR, message, report_path)
    direct = passthrough(exits)
    if direct is not None:
        return _pass(direct, report_path)
    return _folded(exits, report_path)


def _provisional(report_path: str) -> Callable[[Sequence[RankExit], int, str], None]:
    """What the pod's report says while its ranks stop, until the fold replaces it."""

    def write(ended: Sequence[RankExit], ranks: int, why: str) -> None:
        _write(report_path, provisional_message(ended, ranks, why))

    return write


def _pass(ending: Passthrough, report_path: str) -> int:
    """A lone rank's own ending: its report as written, its code."""
    _write(report_path, ending.text)
    say(f"exit {ending.code} ({ending.reason}): {ending.message}")
    return ending.code


def _folded(exits: Sequence[RankExit], report_path: str) -> int:
    from mpjob_trainer.launch.fold import fold_exits  # pydantic: only when a report is built

    ending = fold_exits(exits)
    _write(report_path, ending.report.to_message())
    say(f"exit {ending.code} ({ending.report.reason}): {ending.report.message}")
    return ending.code


def _made(reason: Reason, code: ExitCode, message: str, report_path: str) -> int:
    """The launcher's own ending (a bad flag, its own failure): one code and one report."""
    from mpjob_contract.report import TerminationReport

    _write(report_path, TerminationReport(reason=reason, message=message).to_message())
    say(f"exit {int(code)} ({reason}): {message}")
    return int(code)


def _write(report_path: str, text: str) -> None:
    try:
        os.makedirs(os.path.dirname(report_path) or ".", exist_ok=True)
        with open(report_path, "w") as file:
            file.write(text)
    except OSError as exc:
        say(f"cannot write the termination report to {report_path}: {exc.strerror or exc}")
