"""What the ranks of an attempt agree on, as the most any of its pods told it.

Each pod's own report says alike what its ranks agree on (the checkpoint a sharded job's ranks
write together, the changes in place they make together, the quarantine, an `auto` attempt's
measurement, the step they reached), but the pod that explains the attempt may carry its
launcher's report for a rank killed from outside, which says none of it, or its ranks may name
the checkpoint they resumed from where rank 0's pod names the one it wrote. Pure: reports in,
a report out (`endings` reads the pods).
"""

from __future__ import annotations

from mpjob_contract.report import InPlaceChange, TerminationReport, newest_checkpoint

#: What a report says of the attempt's progress, alike for all its ranks (`with_progress`).
PROGRESS = ("step", "start_step", "precision", "counters", "loss_scales", "ended_at", "recovery_seconds")


def with_peers(report: TerminationReport, peers: list[TerminationReport]) -> TerminationReport:
    """`report`, the one that explains the attempt, with what its ranks agree on as the most any
    of `peers` (its pods' valid reports) told it: its progress, the newest checkpoint, every
    change in place, the quarantine and the measurement."""
    said = with_every_change(with_newest_checkpoint(with_progress(report, peers), peers), peers)
    return with_agreed_record(said, peers)


def with_progress(report: TerminationReport, peers: list[TerminationReport]) -> TerminationReport:
    """`report` with the progress of the first of `peers` that says where the attempt began, when
    it says none (the launcher's for a pod whose one rank was killed: step 0, no start step), as
    the launcher's fold takes a killed rank's from its lowest rank's report. Taken as it was, the
    attempt ended at step 0 where no live reading had seen it, and two such ended the job
    'failed the same way before their first step'."""
    donor = next((r for r in peers if r.start_step is not None), None)
    if report.start_step is not None or donor is None:
        return report
    return report.model_copy(update={name: getattr(donor, name) for name in PROGRESS})


def with_newest_checkpoint(report: TerminationReport, peers: list[TerminationReport]) -> TerminationReport:
    """`report` naming the newest last good checkpoint it or its `peers` (the attempt's pods'
    reports) name (`newest_checkpoint`): the pod that explains the attempt may be one whose ranks
    name the checkpoint they resumed from (its peer stopped by the peer watch after it ended), and
    that one taken as the last good one resumed the next attempt from an older checkpoint."""
    newest = newest_checkpoint([report, *peers])
    if newest is report.last_good_checkpoint:
        return report
    return report.model_copy(update={"last_good_checkpoint": newest})


def with_every_change(report: TerminationReport, peers: list[TerminationReport]) -> TerminationReport:
    """`report` listing the changes in place that reach the newest attempt any of `peers` reported:
    the ranks change together, so each pod's own report lists them all, but the pod that explains
    the attempt may carry its launcher's report for a rank killed from outside, which lists none;
    taken as it was, an operator that read none of them ended the attempt the processes had left,
    and the next one restarted in the precision that faulted."""
    reach = max((r.precision_changes for r in peers), key=_newest_attempt, default=[])
    if _newest_attempt(reach) <= _newest_attempt(report.precision_changes):
        return report
    return report.model_copy(update={"precision_changes": reach})


def with_agreed_record(report: TerminationReport, peers: list[TerminationReport]) -> TerminationReport:
    """`report` with what the ranks agree on as the most any of `peers` reported it: the quarantine
    (the largest) and an `auto` attempt's measurement. Each pod's own report says them alike, but
    the pod that explains the attempt may carry its launcher's report for a rank killed from
    outside, which says neither; taken as it was, an operator that read neither left the skipped
    steps out of status.skipped and the attempt named `auto`, measured by no one."""
    skipped = max((r.skipped for r in [report, *peers] if r.skipped), key=lambda s: s.count, default=None)
    measurement = report.measurement or next((r.measurement for r in peers if r.measurement), None)
    if (skipped, measurement) == (report.skipped, report.measurement):
        return report
    return report.model_copy(update={"skipped": skipped, "measurement": measurement})


def _newest_attempt(changes: list[InPlaceChange]) -> int:
    """The attempt the last of `changes` began (0: none)."""
    return changes[-1].attempt if changes else 0
