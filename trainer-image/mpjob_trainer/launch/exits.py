"""How each local rank ended, as the supervisor saw it, and the one ending that needs no fold.

Standard library only (NamedTuples: `dataclasses` would import `inspect`): this is all the
launcher needs on the path every healthy pod takes.
A pod of ONE local rank that ended by itself with a report of its own that agrees with its
exit code ends exactly as that rank did: the launcher writes the rank's report through as
it is and exits with the rank's code, without loading pydantic. Every other ending (several
ranks, no report, a report that contradicts the code, a signal death, a rank that could not
start) is folded by `launch.fold`, which builds a report (pydantic, imported then).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import NamedTuple

from mpjob_contract.codes import ENDING_PRECEDENCE, TRAINER_REASONS, Reason, reason_for_exit_code
from mpjob_contract.environment import MAX_REPORT_BYTES

#: The endings the contract decides by exit code (ENDING_PRECEDENCE's classes but InfraError,
#: which stands for every other code: a report that says InfraError agrees with any of them).
_DECIDED = frozenset(ENDING_PRECEDENCE) - {Reason.INFRA_ERROR}
#: The reasons a report of the trainer's may give (any other: the fold judges the report invalid).
_KNOWN = frozenset(reason.value for reason in TRAINER_REASONS)


class StartError(NamedTuple):
    """Why the launcher could not start a rank (its code and reason stand for the rank's ending)."""

    reason: Reason
    code: int
    message: str


class RankExit(NamedTuple):
    """One local rank's ending: `returncode` as Popen has it (negative: killed by that signal)."""

    local_rank: int
    rank: int
    returncode: int
    #: The rank's own termination report as it wrote it; None when it wrote none.
    report_text: str | None = None
    #: The launcher signalled it before it ended (passed a stop on, or stopped it as a sibling).
    stopped: bool = False
    #: When the launcher saw it end among the pod's ranks: 0 first.
    order: int = 0
    #: The last lines of its stderr (launch.tee), quoted when its report must be made for it.
    stderr_tail: str = ""
    start_error: StartError | None = None


def how(returncode: int) -> str:
    """'exited 42' or 'was killed by SIGKILL'."""
    if returncode >= 0:
        return f"exited {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def agrees(reason: str, returncode: int) -> bool:
    """Whether a rank's own report (its `reason`) tells the same story as its exit code."""
    if returncode < 0:
        return False
    outcome = reason_for_exit_code(returncode)
    if outcome is Reason.INFRA_ERROR:
        # Infrastructure reasons are many (InfraError, OOMKilled, ...); only the decided ones clash.
        return reason not in _DECIDED
    return reason == outcome


class Passthrough(NamedTuple):
    """The pod ends as its one rank did: its code, and its report's text as written."""

    code: int
    text: str
    reason: str
    message: str


def passthrough(exits: Sequence[RankExit]) -> Passthrough | None:
    """The single rank's own ending when nothing needs folding; None otherwise."""
    if len(exits) != 1:
        return None
    only = exits[0]
    text = only.report_text
    if only.start_error is not None or only.returncode < 0 or not text:
        return None
    if len(text.encode()) > MAX_REPORT_BYTES:
        return None
    import json  # after the ranks ended: not on the start path

    try:
        report = json.loads(text)
    except (ValueError, RecursionError):  # nested deeper than the parser recurses: the fold judges it
        return None
    reason = report.get("reason") if isinstance(report, dict) else None
    if not isinstance(reason, str) or reason not in _KNOWN:
        return None
    if not agrees(reason, only.returncode):
        return None
    message = report.get("message")
    return Passthrough(only.returncode, text, reason, message if isinstance(message, str) else "")
