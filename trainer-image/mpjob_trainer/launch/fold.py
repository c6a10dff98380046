"""One pod, one ending: fold the local ranks' exit codes and reports into one of each.

Pure: no processes, no files. The first class that any local rank ended in explains the pod,
in the contract's order (mpjob_contract.codes.ENDING_PRECEDENCE, which the operator uses
across pods too), highest first:

| class             | a rank ended with                  | pod exits |
|-------------------|------------------------------------|-----------|
| ConfigError       | 43                                 | 43        |
| NonFiniteInFp32   | 45                                 | 45        |
| NumericFault      | 42                                 | 42        |
| OutOfDeviceMemory | 46                                 | 46        |
| InfraError        | any other code, a signal death, or | 1         |
|                   | an invalid termination report; 42, |           |
|                   | 44-47 with no report of its own    |           |
|                   | that says so (the script's exit)   |           |
| Repromote         | 47                                 | 47        |
| Preempted         | 44, or a SIGTERM passed on that    | 44        |
|                   | killed it before it trained        |           |
| Succeeded         | 0                                  | 0         |

A sibling the launcher stopped because another rank crashed exits 44 (it honoured SIGTERM
and checkpointed); the crash, not the stop, explains the pod, hence InfraError > Preempted.
Among ranks of the winning class: one that ended by itself before one the launcher stopped;
for infrastructure failures, then one killed by a signal from outside (the OOM killer, a kill:
its peers' collectives fail because it is gone), then the one that ended first (the cause: a
sibling whose collective lost its peer fails a moment later); then the lowest rank (the other classes
are collective decisions or stops, and rank 0 writes the checkpoints): the contract's
`explains_first`, by which the operator picks the pod too.

Each rank's report is read through the contract's model (`TerminationReport.parse_message`),
as the operator reads the pod's: a rank whose report fails it ended in an infrastructure
failure, and the pod's report says which field was invalid; nothing of it is passed on.

The pod's report is the winner's own, or one made for it when it left none or was killed by
a signal (reason from its exit code, progress fields from the lowest rank's report, and the
last lines of its stderr, as Kubernetes' FallbackToLogsOnError quotes a container's log);
`step` is the largest any rank reported; `lastGoodCheckpoint` the newest any rank reported
(rank 0 writes a DDP job's checkpoints: the others name the one they resumed from);
`killedFromOutside` whether the winner was killed by a signal the launcher did not send.

Reports are parsed in one place, `parsed_report`; importing this module brings pydantic, so
the launcher imports it only when a report must be built (launch.exits has the rest).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from mpjob_contract.codes import (
    ENDING_PRECEDENCE,
    WITNESSED,
    ExitCode,
    Reason,
    exit_code_for,
    explains_first,
    reason_for_exit_code,
    reason_for_process_exit,
)
from mpjob_contract.report import InvalidReport, TerminationReport, newest_checkpoint
from mpjob_trainer.launch.exits import RankExit, agrees, how

#: Highest first: (the class a rank's ending falls in, the pod's exit code for it).
PRECEDENCE: tuple[tuple[Reason, ExitCode], ...] = tuple((r, exit_code_for(r)) for r in ENDING_PRECEDENCE)
#: The pod's exit code for each class.
_CODE = dict(PRECEDENCE)


@dataclass(frozen=True)
class RankEnding:
    """How one local rank ended: `returncode` as Popen has it (negative: killed by that signal)."""

    local_rank: int
    rank: int
    returncode: int
    report: TerminationReport | None = None
    #: The launcher signalled it before it ended (passed a stop on, or stopped it as a sibling).
    stopped: bool = False
    #: When the launcher saw it end among the pod's ranks: 0 first.
    order: int = 0
    #: The last lines of its stderr, quoted when the pod's report is made for it.
    stderr_tail: str = ""
    #: The rank wrote a report that fails the model: what was invalid (its report is then None).
    invalid_report: str | None = None

    @property
    def reported_then_stopped(self) -> bool:
        """The launcher passed a SIGTERM on to a rank that had already ended its session: its
        report is written last of all (the session then gives SIGTERM back to the default, so
        the signal can only kill it after that), and it is the rank's account of its end."""
        return self.stopped and self.returncode == -signal.SIGTERM and self.report is not None

    @property
    def failed_then_killed(self) -> bool:
        """A signal killed a rank whose session had already ended in a failure of its own: its
        report, written last in the session's close, says InfraError (the script raised or exited
        itself), and the process died after it, in the interpreter's teardown (an abort from a
        native thread left running, a kill). The report tells the failure; the signal only how
        the process went after it, and named in its place it made two attempts that failed alike
        read as different failures (runPolicy's same-step rule)."""
        return self.returncode < 0 and self.report is not None and self.report.reason == Reason.INFRA_ERROR

    @property
    def stopped_before_training(self) -> bool:
        """The launcher passed a SIGTERM on and it killed the rank without a report: SIGTERM
        ends a rank by default until its session catches it, and again while it waits for its
        peers (mpjob_trainer.distributed), so it had trained nothing and ends as a stop does."""
        return self.stopped and self.returncode == -signal.SIGTERM and self.report is None

    @property
    def outcome(self) -> Reason:
        """The class this ending falls in (a signal death or an invalid report is an
        infrastructure failure, unless the rank was stopped after it reported)."""
        if self.invalid_report is not None:
            return Reason.INFRA_ERROR
        if self.reported_then_stopped:
            assert self.report is not None
            return self.report.reason
        if self.stopped_before_training:
            return Reason.PREEMPTED
        if self.returncode < 0:
            return Reason.INFRA_ERROR
        return reason_for_process_exit(self.returncode, self.report.reason if self.report else None)

    @property
    def how(self) -> str:
        """'exited 42' or 'was killed by SIGKILL'."""
        return how(self.returncode)

    @property
    def own_report(self) -> TerminationReport | None:
        """The rank's report when it tells the same story as its exit code; None otherwise."""
        told = self.reported_then_stopped or self.failed_then_killed
        if self.report is None or not (told or agrees(self.report.reason, self.returncode)):
            return None
        return self.report


def parsed_report(text: str | None) -> TerminationReport | None:
    """A rank's termination report from its text; None when absent or not a report at all
    (InvalidReport: a report that fails the contract's model, naming the fields)."""
    return TerminationReport.parse_message(text)


def rank_ending(ended: RankExit) -> RankEnding:
    """What the fold knows of a rank: its exit, its report parsed (or the launcher's, when it
    could not be started)."""
    invalid: str | None = None
    if ended.start_error is not None:
        error = ended.start_error
        report: TerminationReport | None = TerminationReport(reason=error.reason, message=error.message)
    else:
        try:
            report = parsed_report(ended.report_text)
        except InvalidReport as exc:
            report, invalid = None, str(exc)
    return RankEnding(
        ended.local_rank,
        ended.rank,
        ended.returncode,
        report,
        ended.stopped,
        ended.order,
        ended.stderr_tail,
        invalid_report=invalid,
    )


def fold_exits(exits: Sequence[RankExit]) -> PodEnding:
    """fold_endings over the supervisor's records of how the ranks ended."""
    return fold_endings([rank_ending(e) for e in exits])


@dataclass(frozen=True)
class PodEnding:
    """What the pod exits with and the one report it leaves."""

    code: int
    report: TerminationReport


def fold_endings(endings: Sequence[RankEnding]) -> PodEnding:
    """The pod's exit code and report: the highest class by PRECEDENCE (ties: see the module doc)."""
    if not endings:
        raise ValueError("no local ranks to fold")
    by_rank = sorted(endings, key=lambda e: e.rank)
    winner = min(by_rank, key=_precedence)
    reason, code = winner.outcome, _CODE[winner.outcome]
    reports = [e.report for e in by_rank if e.report is not None]
    own = winner.own_report
    report = own or _synthesized(winner, reason, reports[0] if reports else None)
    checkpoint = newest_checkpoint([report, *reports])
    message = report.message
    if len(endings) > 1 and reason is not Reason.SUCCEEDED:  # who failed, and how each rank ended
        named = f"rank {winner.rank}: {message}" if own else message
        message = f"{named} [{', '.join(f'rank {e.rank} {e.how}' for e in by_rank)}]"
    folded = report.model_copy(
        update={
            "step": max([report.step, *(r.step for r in reports)]),
            "last_good_checkpoint": checkpoint,
            "message": message,
            "killed_from_outside": True if _killed(winner) else None,
        }
    )
    return PodEnding(int(code), folded)


def _precedence(ending: RankEnding) -> tuple[int, bool, bool, int, int]:
    """Sort key, smallest explains the pod (the contract's `explains_first`). A signal the launcher
    did not send (the kernel's OOM killer, a kill) is the cause its peers' failing collectives
    follow; the order of ending cannot say so when both had ended by the time the launcher reaped
    them."""
    return explains_first(
        ending.outcome, stopped=ending.stopped, killed=_killed(ending), order=ending.order, index=ending.rank
    )


def _killed(ending: RankEnding) -> bool:
    """Whether the rank was killed by a signal the launcher did not send."""
    return ending.outcome is Reason.INFRA_ERROR and ending.returncode < 0 and not ending.stopped


def _synthesized(ending: RankEnding, reason: Reason, donor: TerminationReport | None) -> TerminationReport:
    """A report for a rank that left none we can use; progress fields from the lowest rank's report."""
    if ending.invalid_report is not None:
        why = f" with an {ending.invalid_report}"
    elif ending.report is not None:
        why = f" (its report said {ending.report.reason})"
    elif ending.stopped_before_training:
        why = " before it trained (nothing to checkpoint)"
    else:
        why = "" if ending.returncode == 0 else " without a termination report"
    coded = reason_for_exit_code(ending.returncode)
    if coded in WITNESSED and reason is Reason.INFRA_ERROR and ending.invalid_report is None:
        why += f" ({ending.returncode} means {coded} only with the session's report saying so: the script's own exit)"
    base = donor or TerminationReport(reason=reason)
    said = f"; its stderr ended:\n{ending.stderr_tail}" if ending.stderr_tail else ""
    return base.model_copy(
        update={
            "reason": reason,
            "last_good_checkpoint": None,
            "message": f"local rank {ending.local_rank} (rank {ending.rank}) {ending.how}{why}{said}",
        }
    )
