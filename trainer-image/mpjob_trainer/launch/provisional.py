"""The pod's termination message while its ranks are being stopped.

The kubelet reads the termination log when the container ends, and the launcher folds its
ranks' endings only once every rank has ended. A pod deleted with a grace shorter than the
ranks take to stop (the operator's cut gives 10 s: planning/cutoff.py; `--grace-seconds` is 20)
is SIGKILLed first, and would leave nothing. So from the moment it begins stopping its ranks
(a SIGTERM or SIGINT passed on, or a rank that failed by itself) until the fold replaces it,
the launcher keeps a provisional message there, rewritten as ranks end.

It says only what is known, so that it stays true if it stands (the launcher killed, its ranks
then killed with it: PR_SET_PDEATHSIG):
- once a rank has ended: the fold of the endings so far (launch.fold), with how many ranks were
  still stopping then. A rank still stopping is left out, not counted as a crash: it was given
  a grace it did not get to use, so a decided ending (a configuration error, a numeric fault),
  the step and the last good checkpoint reported so far reach the operator, and a stop stays
  a stop (`Preempted` ranks below a sibling pod's crash: planning/endings.py);
- before any has: one plain line, no report. A report must name a reason and a step: Preempted
  would claim a checkpoint, InfraError a crash, and step 0 would set the job's step back
  (planning/reported.py); the operator reads a plain message as a pod without a report
  (planning/endings.py: PodDeleted when it was deleted), quoting the line.

Standard library only until a rank has ended (the fold imports pydantic).
"""

from __future__ import annotations

from collections.abc import Sequence

from mpjob_trainer.launch.exits import RankExit

#: What the launcher adds to a provisional fold's message.
PROVISIONAL = "written while its ranks stopped"


def provisional_message(ended: Sequence[RankExit], ranks: int, why: str) -> str:
    """The pod's message while its `ranks` ranks stop (`why`: what began it): `ended` has the
    endings of those that have ended."""
    if not ended:
        return (
            f"mpjob-launch: {why}: stopping {ranks} local rank(s), none of which had ended; "
            "no step or checkpoint reported by then (this stands if the pod was killed before they ended)"
        )
    from mpjob_trainer.launch.fold import fold_exits  # pydantic: a report is built

    report = fold_exits(ended).report
    still = f"{ranks - len(ended)} of {ranks} rank(s) still stopping then"
    return report.model_copy(update={"message": f"{report.message} ({why}; {PROVISIONAL}: {still})"}).to_message()
