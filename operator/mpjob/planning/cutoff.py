"""Ending a running attempt at once, on the operator's own word, without waiting for its pods to
end by themselves: a change of size (spec.elastic), a node lost while other ranks run (they
would block in their next collective until its timeout), a stall (runPolicy.progressDeadlineSeconds).
Its Job is deleted, so its pods get SIGTERM (a rank not blocked checkpoints first), and the next
attempt's Job is created only once they are gone (`reconcile._follow` waits while an earlier
attempt's pod is alive): two attempts never write checkpoints at once. What the trainer of a
suspended or resized attempt reports once its pods have stopped completes its ending (`heard`).

An attempt ended because a rank is lost, hung or crashed is also cut (`Plan.cut`): its pods
still alive get CUT_GRACE_SECONDS, not their own grace period (60 s), before SIGKILL. Their
SIGTERM cannot buy a checkpoint: under DDP or FSDP every rank agrees on the stop and writes its
part, and the lost, hung or crashed rank never will, so the others would sit blocked in a
collective (in C++, where no Python handler runs; NCCL's own timeout is minutes) for the whole
grace period, holding their GPUs from the next attempt. A resize that is not a loss, a
suspension, a queue's preemption and a deadline keep the full grace: their ranks are whole and
checkpoint on SIGTERM.

A kubelet keeps the grace period a pod's first deletion gave it (a shorter one asked for later
shows in the API, but the container's stop under way runs out the first), so the pods are cut
before their Job is deleted, whose garbage collection would delete them with their own. After a
crash the Job controller deletes the other pods itself, with their own grace, once it has failed
the Job: the cut races it, decided from the pods as soon as they show the failure (`crashed`),
and the pods keep 60 s where the Job controller is first. (A crashed attempt's Job is kept for
its logs: only its pods are cut.)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from mpjob.planning import elastic, history, late, shortage
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.agreed import with_peers
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.endings import JobView, PodView, outcome_of, pods_of, valid_reports
from mpjob.planning.plan import Plan, When
from mpjob.planning.reported import record_report
from mpjob.planning.status import ConditionReason
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec
from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import TerminationReport

#: Seconds between SIGTERM and SIGKILL for the ranks of an attempt that was cut (the module doc);
#: `mpjob run` gives its stalled workers the same.
CUT_GRACE_SECONDS = 10


def resize(
    plan: Plan, spec: MixedPrecisionJobSpec, change: elastic.Resize, when: When, *, job: int, cut: bool = False
) -> None:
    """End the attempt for a size change and record the next one, whose Job is created once the
    ended attempt's pods (its Job `job`) are gone (they get SIGTERM: a trainer checkpoints first;
    `cut`: a rank was lost, so the others cannot and are cut, as the module doc says)."""
    current = plan.status.attempts[-1]
    plan.delete.append(job)
    if cut:
        plan.cut.append(job)
    plan.status.grow_after_step = None
    outcome = AttemptOutcome(None, message=change.why, resize=change)
    lc.conclude(plan, spec, attempt=current, outcome=outcome, when=when)
    plan.create.clear()


def to_cut(job: JobView) -> list[PodView]:
    """The pods of a cut attempt still to cut: alive, and not yet deleted with CUT_GRACE_SECONDS
    or less (a reconcile that comes again before they are gone asks nothing twice)."""
    return [p for p in job.pods if p.alive and p.uid and (p.grace is None or p.grace > CUT_GRACE_SECONDS)]


def cut_event(pods: list[PodView]) -> lc.Event:
    """The Event that says which pods were cut, and why: the operator deleted them."""
    names = ", ".join(p.name for p in pods)
    why = "a rank of their attempt was lost, hung or crashed: no checkpoint can be agreed without it"
    return lc.Event("Normal", ConditionReason.RANKS_CUT, f"{names} deleted with a {CUT_GRACE_SECONDS}-s grace: {why}")


def orphans_event(pods: Sequence[PodView]) -> lc.Event:
    """The Event that says which pods a deleted Job left behind the operator deleted, and why."""
    names = ", ".join(p.name for p in pods)
    why = "their Job was deleted leaving them (--cascade=orphan); they stop as its deletion would have stopped them"
    return lc.Event("Warning", ConditionReason.ORPHANS_STOPPED, f"{names} deleted: {why}")


def crashed(job: JobView) -> bool:
    """Whether a pod of the attempt failed by itself while another still runs: it exited with
    neither success nor a stop the ranks agree on (SIGTERM's checkpoint, a re-promotion's), so
    the others wait for it in their next collective, and their SIGTERM, which the Job controller
    sends, cannot buy a checkpoint either (the module doc). Read from the pods, before the Job
    controller fails the Job (backoffLimit 0) and deletes the others with their own grace."""
    agreed = (ExitCode.SUCCESS, ExitCode.PREEMPTED, ExitCode.REPROMOTE)
    failed = any(not p.alive and p.exit_code is not None and p.exit_code not in agreed for p in job.pods)
    return failed and any(p.alive for p in job.pods) and not job.suspended  # suspended: its queue stops it


def lost_pod(job: JobView) -> PodView | None:
    """A pod of the attempt that its node took with it (gone, unreachable, or evicted from it by
    the taint manager), if any."""
    return next((p for p in job.pods if p.platform_reason in shortage.NODE_LOST), None)


def end_lost(plan: Plan, spec: MixedPrecisionJobSpec, job: JobView, lost: PodView, when: When) -> None:
    """End at once an attempt that lost a node while other ranks run: they would block in their
    next collective until its timeout (minutes) before they fail. An elastic job shrinks to the
    workers left, when a size keeps its global batch; any other goes on in a new attempt."""
    shrink = shortage.node_lost(spec, plan.status.attempts[-1], job.pods)
    if shrink is not None and shrink.verdict is elastic.Verdict.SHRINK:
        resize(plan, spec, shrink, when, job=job.index, cut=True)
        return
    why = f"pod {lost.name} was lost with its node ({lost.platform_reason}): its peers are stopped, not waited for"
    outcome = AttemptOutcome(None, platform_reason=lost.platform_reason, message=why, resize=shrink)
    end_now(plan, spec, job, outcome, when)  # `shrink`, a wait: the message says why it did not shrink


def stalled(
    spec: MixedPrecisionJobSpec, job: JobView, attempt: AttemptStatus, now: datetime, unseen_for: float | None = None
) -> str | None:
    """Why the running `attempt` is stalled (runPolicy.progressDeadlineSeconds), or None. Its step
    has stood still since its progressTime, as the reads of rank 0 saw (`observe.moved`; kept in
    the status, so an operator that restarts goes on counting), but a stall counts only from
    when its last pod's trainer started (while a rank waits for a peer the cluster has not
    started yet, a pod still pending, the attempt is not hung), and, while this operator has
    taken no reading of its own (`unseen_for` seconds it has been reading: it restarted, and the
    step may have moved while no operator looked), at most from when it began to read. None:
    it has taken one, which either moved the progressTime or showed the step where it was."""
    starts = [st.moment(p.started_at) for p in job.pods if p.alive]
    since = st.moment(attempt.progress_time)
    if since is None or len(starts) < pods_of(job, elastic.workers_of(spec, attempt)) or None in starts:
        return None
    still = (now - max([since, *(s for s in starts if s is not None)])).total_seconds()
    if unseen_for is not None:
        still = min(still, unseen_for)
    return stall(spec.run_policy.progress_deadline_seconds, still, "rank 0's metrics")


def stall(deadline: int | None, still: float | None, source: str) -> str | None:
    """Why an attempt whose step has stood still for `still` seconds, as `source` showed, is
    stalled under runPolicy.progressDeadlineSeconds=`deadline` (None: it is not)."""
    if deadline is None or still is None or still < deadline:
        return None
    return f"its step has not moved for {still:.0f}s as {source} showed (progressDeadlineSeconds={deadline})"


def end_now(plan: Plan, spec: MixedPrecisionJobSpec, job: JobView, outcome: AttemptOutcome, when: When) -> None:
    """End the running attempt, whose ranks are lost or hung, as `outcome` says without waiting
    for its pods to stop. They are deleted and cut (the module doc), and the next attempt's Job
    is created once they are gone."""
    plan.delete.append(job.index)
    plan.cut.append(job.index)
    lc.conclude(plan, spec, attempt=plan.status.attempts[-1], outcome=outcome, when=when)
    plan.create.clear()


#: Endings whose ranks are cut when `sweep` carries out their Job's deletion: a rank hung or lost.
CUT_REASONS = frozenset({Reason.STALLED.value, Reason.NODE_LOST.value})


def sweep(plan: Plan, jobs: dict[int, JobView]) -> None:
    """Carry out an ending the status records but whose Job still runs: an operator that stopped
    between writing an ending of its own word (a resize, a stall, a node lost, a suspension, a
    failure by policy) and deleting the Job would otherwise leave those pods running for good,
    and the next attempt waiting for them. The Job goes now, its pods cut when a rank was hung or
    lost (a shrink for a lost node too). A Job that finished, or that the newest running attempt
    runs in, is not touched.

    So does an ended attempt's Job that waits suspended in its queue, pods or none (its attempt
    ended on the operator's word while it waited: a queued shrink, runPolicy.suspend): left
    there, the queue could admit it while the next attempt runs, and two trainers would write
    checkpoints at once. A Job its queue suspended while its attempt runs is the running one's
    (it waits for readmission), and one the queue preempted for good has failed
    (`endings.preempted_by_queue`): neither is swept."""
    status = plan.status
    newest = status.attempts[-1] if status.attempts else None
    running = history.job_index(status, newest.index) if newest and newest.finish_time is None else None
    ended = {history.job_index(status, a.index): a for a in status.attempts if a.finish_time is not None}
    for index, job in sorted(jobs.items()):
        attempt = ended.get(index)
        if index == running or index in plan.delete or attempt is None or job.finished:
            continue
        alive = any(p.alive for p in job.pods)
        if alive or job.suspended:
            plan.delete.append(index)
        if alive and (attempt.reason in CUT_REASONS or elastic.lost_a_node(attempt)) and not job.suspended:
            plan.cut.append(index)


#: Endings recorded while the attempt's ranks still ran: their SIGTERM may buy a checkpoint, and
#: their report lists changes in place, that the ending, written at once, cannot know of
#: (`heard`). Whole ranks (a suspension, a resize, the job's activeDeadlineSeconds) checkpoint;
#: stalled ones may, where they can still act on SIGTERM in their CUT_GRACE_SECONDS; the peers of
#: a lost node cannot, but a rank that ends in that grace (its collective failed on the lost
#: peer) reports the changes in place the ranks made, as an elastic shrink's peers do.
HEARD_LATE = frozenset(
    {Reason.SUSPENDED, Reason.DEADLINE_EXCEEDED, Reason.STALLED, Reason.NODE_LOST, *elastic.RESIZE_REASONS}
)


def heard(
    plan: Plan, spec: MixedPrecisionJobSpec, jobs: dict[int, JobView], stopped: dict[int, JobView], when: When
) -> None:
    """What the trainer of an attempt ended while its ranks ran (HEARD_LATE) reported once its
    pods stopped, read from its Job that is gone (`stopped`, its pods as last seen): the step it
    stopped at ends the attempt, the checkpoint it wrote on SIGTERM is the job's last one, and the
    next attempt, whose Job waits for those pods, plans to resume from it. A job that has
    finished (at its deadline) records them too: the report is progress seen, and a user who
    raises the deadline, or reads the status for the newest checkpoint, is told of it.
    Only while no later attempt has a Job, so nothing newer is overwritten; an attempt whose pods
    reported nothing keeps the ending as recorded. A checkpoint kept in those pods went with them
    (`Checkpoint.outlives_pods`): the report's step ends the attempt, but its checkpoint is not
    the job's last one (a suspended or finished job would name one no attempt can reach): what the
    status held stays (none after a suspension or the deadline, `resumepoint.went_with_pods`; a
    resume says it starts over: `resumepoint.resume_point`), and the next attempt, planned from
    step 0, stays so. The changes in place it lists that no read caught are recorded first, and the
    ending moves to the last attempt they began (`late`)."""
    status = plan.status
    for index, job in sorted(stopped.items()):
        chain = [a for a in status.attempts if history.job_index(status, a.index) == index]
        if not chain or chain[-1].finish_time is None or chain[-1].reason not in HEARD_LATE:
            continue
        attempt, later = chain[-1], [a for a in status.attempts if a.index > chain[-1].index]
        report = _told(job)
        if report is None or any(history.job_index(status, a.index) in jobs for a in later):
            continue
        attempt = late.recorded(plan, spec, attempt, report.precision_changes, when)
        later = [a for a in status.attempts if a.index > attempt.index]
        kept = status.last_checkpoint
        end_step = record_report(status, attempt.index, report)
        if attempt.reason in HEARD_LATE:  # else a late change ended the job: its fault's step stands
            attempt.end_step = end_step
        if not spec.checkpoint.outlives_pods:  # what it names went with the pods: never resumed from
            status.last_checkpoint = kept
            continue
        ckpt = status.last_checkpoint
        for following in (a for a in later if not a.start_step_reported):
            following.start_step = ckpt.step if ckpt is not None else following.start_step


def _told(job: JobView) -> TerminationReport | None:
    """What the stopped pods of `job` reported of their ranks: the report of the pod that explains
    the ending, else, when that one left none (a pod its node took: NodeLost outranks its peers'
    stops), the first valid report of its peers, with what the others agree on (`with_peers`).
    The ranks make their changes in place together, so each report lists them all; taken from the
    lost pod alone, nothing was heard, and the next attempt resumed in the precision that faulted."""
    if (said := outcome_of(job).report) is not None:
        return said
    reports = valid_reports(job.pods)  # read again only when the explaining pod left none
    return with_peers(reports[0], reports) if reports else None
