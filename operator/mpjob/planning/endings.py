"""How an attempt ended, read from what the cluster shows of it: its Job and its pods.

Pure: `PodView`/`JobView` are the few fields the controller's cache keeps of each (or what
`mpjob run` makes of its worker processes). The termination message is the trainer's word
and is validated here (mpjob_contract.report); evidence of a disruption comes only from pod
and Job status (`mpjob.planning.charging`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mpjob.planning.agreed import with_peers
from mpjob.planning.charging import Disruption
from mpjob.planning.classify import AttemptOutcome
from mpjob_contract import codes
from mpjob_contract.codes import ExitCode, Reason, reason_for_exit_code
from mpjob_contract.environment import readable
from mpjob_contract.report import InvalidReport, TerminationReport


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    index: int
    phase: str
    alive: bool  # has a running (or not yet terminated) container
    exit_code: int | None = None
    termination_message: str | None = None
    platform_reason: str | None = None  # pod.status.reason / DisruptionTarget / container reason
    deleting: bool = False
    #: The trainer container's start and finish (RFC 3339, as the pod's status says), for cost.
    started_at: str | None = None
    finished_at: str | None = None
    #: Since when the scheduler finds no node for the pod (its PodScheduled condition False,
    #: reason Unschedulable; RFC 3339), for spec.elastic; None once it is scheduled.
    unschedulable_since: str | None = None
    #: The scheduler's words on why no node takes the pod (that condition's message), if any.
    unschedulable_message: str | None = None
    #: The kubelet's words on why it cannot create the trainer container (its waiting reason
    #: CreateContainerConfigError: a Secret or ConfigMap, or a key of one, that is not there).
    config_error: str | None = None
    #: The kubelet's words while it cannot pull the trainer image: it tries again (its waiting
    #: reason ErrImagePull or ImagePullBackOff: the pod waits, as for config_error) or never (a
    #: name it cannot parse, InvalidImageName: the pod is not alive).
    image_error: str | None = None
    #: The node the pod is bound to (spec.nodeName), if any.
    node: str | None = None
    #: Its Ready condition is False while its containers are ready: a kubelet keeps the two
    #: alike, so this is the node lifecycle controller's mark on the pods of a node that stopped
    #: answering (mpjob.controller.lostnodes).
    marked_unready: bool = False
    #: The pod's UID (a delete of it carries it as a precondition); "" where not known.
    uid: str = ""
    #: The grace period it is being deleted with (metadata.deletionGracePeriodSeconds), if any.
    grace: int | None = None
    #: The GPUs it requests (nvidia.com/gpu), as its Job's pod template asked when the Job was
    #: made from the spec of then; 0 where not known (`mpjob run`'s workers).
    gpus: int = 0


@dataclass(frozen=True)
class JobView:
    index: int
    finished: str | None = None  # "Complete" | "Failed" | None
    reason: str | None = None  # the Failed condition's reason (BackoffLimitExceeded, DeadlineExceeded)
    pods: tuple[PodView, ...] = ()
    suspended: bool = False
    #: The Job controller's latest FailedCreate message (a pod it could not create), if any.
    create_error: str | None = None
    #: While the Job waits suspended: why its queue has not admitted it, in the queue's words
    #: (Kueue's Workload condition), when the operator could read it.
    queue_message: str | None = None
    #: While the Job waits suspended: its queue said the quota is insufficient (Kueue's Workload
    #: QuotaReserved=False), so an elastic job may go on with fewer workers.
    quota_short: bool = False
    #: Since when the Job waits suspended (its Suspended condition's time, else its creation's).
    suspended_since: str | None = None
    #: The Job's UID: whether the status records it as its attempt's own (`cost.own_jobs`); ""
    #: where not known.
    uid: str = ""
    #: The spec generation the Job was made from (None: not known, a Job of an older operator).
    generation: int | None = None
    #: Its metadata.creationTimestamp (`history.made_late`), if known.
    created: str | None = None
    #: The workers (pods) it was made with, its spec.completions (None: not known): the attempt's
    #: own count, whatever an edit of the spec since says (`pods_of`).
    workers: int | None = None


def pods_of(job: JobView, fallback: int) -> int:
    """The pods the attempt of `job` runs with: its Job's own count, else `fallback` (the
    spec's, elastic.workers_of): an edit of processesPerWorker since it began divides its world
    otherwise, and its pods would be counted as created, started or done while some were not."""
    return job.workers or fallback


#: The ending of an attempt stopped at runPolicy.activeDeadlineSeconds (its Job's own deadline,
#: what is left of the job's: `status.deadline_left`).
DEADLINE_EXCEEDED = AttemptOutcome(
    exit_code=None,
    platform_reason=Reason.DEADLINE_EXCEEDED,
    message="the attempt ran past runPolicy.activeDeadlineSeconds",
)


@dataclass(frozen=True)
class Said:
    """A pod's termination message, read: its report, or what made it an invalid one."""

    report: TerminationReport | None = None
    invalid: str | None = None


def read_report(message: str | None) -> Said:
    """The pod's termination message through the report model (never trusted unvalidated)."""
    try:
        return Said(report=TerminationReport.parse_message(message))
    except InvalidReport as exc:
        return Said(invalid=str(exc))


def outcome_of(job: JobView) -> AttemptOutcome:
    """The attempt's ending as the pods tell it: the most telling pod explains it. A pod whose
    report is invalid ranks as a crash (an infrastructure failure, with what was invalid)."""

    if job.finished == "Failed" and job.reason == "DeadlineExceeded":  # the Job controller stopped the pods
        return past_deadline(_told(job))
    return _told(job)


def past_deadline(told: AttemptOutcome) -> AttemptOutcome:
    """The ending of an attempt stopped at runPolicy.activeDeadlineSeconds whose trainers told
    `told` (`stopped_by`)."""
    return stopped_by(DEADLINE_EXCEEDED, told)


def stopped_by(ending: AttemptOutcome, told: AttemptOutcome) -> AttemptOutcome:
    """`ending` (the operator's own: a deadline, a stall) of an attempt whose trainers told `told`
    once stopped: with their report (the step they stopped at, the checkpoint they wrote on
    SIGTERM: progress seen), less its message (`ending`, not the SIGTERM, ended it)."""
    report = told.report
    return replace(ending, report=report.model_copy(update={"message": ""}) if report else None)


def _told(job: JobView) -> AttemptOutcome:
    """The attempt's ending as its pods tell it (`outcome_of`)."""
    ended = [p for p in job.pods if not p.alive]
    if not ended:
        if job.finished == "Complete":
            return AttemptOutcome(exit_code=0)
        return AttemptOutcome(
            exit_code=None, platform_reason=Reason.DELETED, message="the attempt's pods disappeared before reporting"
        )
    reads = [(p, read_report(p.termination_message)) for p in ended]  # each pod's report parsed once
    pod, read = min(reads, key=lambda told: _explains_first(*told))
    if read.report is not None:
        read = Said(report=with_peers(read.report, [r.report for _, r in reads if r.report is not None]))
    message = "" if read.report or read.invalid else readable(pod.termination_message or "")[-512:]  # a log tail
    message = message or pod.image_error or ""
    platform = pod.platform_reason
    if platform is None and read.report is None and read.invalid is None and pod.deleting:
        platform = Reason.DELETED
    return AttemptOutcome(
        exit_code=pod.exit_code,
        report=read.report,
        platform_reason=platform,
        message=message,
        invalid_report=read.invalid,
    )


def valid_reports(pods: tuple[PodView, ...] | list[PodView]) -> list[TerminationReport]:
    """The valid reports of `pods` (an invalid one names nothing that is trusted)."""
    return [r for p in pods if (r := read_report(p.termination_message).report) is not None]


def _explains_first(pod: PodView, read: Said) -> tuple[int, bool, bool, int, int]:
    """Sort key, smallest explains the attempt: the contract's `explains_first`, as the launcher
    folds a pod's ranks, with whether its report (`read`) says its rank was killed from outside (the
    cause of the crashes of the other pods' ranks, whose collectives lost it)."""
    killed = bool(read.report and read.report.killed_from_outside)
    ranked = _stands_for(pod, read)
    return codes.explains_first(ranked, platform=bool(pod.platform_reason), killed=killed, index=pod.index)


def _stands_for(pod: PodView, read: Said) -> Reason | None:
    """The ending a pod stands for, to rank it (`codes.ending_rank`): its valid report's reason
    (`read`), else its exit code's; a pod killed from outside (a signal's exit code, or being
    deleted) as a stop; a pod whose report is invalid as a crash; None for one with nothing to explain."""
    if read.invalid is not None and pod.platform_reason is None:
        return Reason.INFRA_ERROR
    said = read.report.reason if read.report is not None else None
    if said is None and pod.exit_code is not None and pod.platform_reason is None:
        said = reason_for_exit_code(pod.exit_code)
    if said is not None and codes.ending_rank(said) < codes.ending_rank(Reason.INFRA_ERROR):
        return Reason(said)  # the trainer decided: that outranks whatever the platform says
    if pod.platform_reason:
        return None  # ranked by `platform`
    if pod.exit_code in (ExitCode.PREEMPTED, ExitCode.REPROMOTE):
        return reason_for_exit_code(pod.exit_code)
    if pod.exit_code not in (None, 0, *codes.KILLED_EXIT_CODES):
        return Reason.INFRA_ERROR
    if pod.exit_code in codes.KILLED_EXIT_CODES or pod.deleting:
        return Reason.PREEMPTED
    return None


def ended_by_pods(job: JobView, workers: int) -> str | None:
    """How an attempt ended, read from its pods before the Job controller writes it down: each
    pod stopped, by itself (a deadline or a suspension deletes pods and goes through the Job's
    own condition) or with the cluster's reason on it (an eviction's DisruptionTarget: read
    now, while the pod still shows it, for the evicted pod may be gone by the time the Job
    fails), and one failed (backoffLimit 0: the Job fails with it) or every index succeeded.
    None while that is not known, and while the Job is suspended (its queue's business)."""
    if not job.pods or job.suspended or any(p.alive for p in job.pods):
        return None
    if any(p.deleting for p in job.pods) and not any(p.platform_reason for p in job.pods):
        return None
    if any(p.exit_code not in (None, 0) or p.platform_reason or p.phase == "Failed" for p in job.pods):
        return "Failed"
    if {p.index for p in job.pods if p.exit_code == 0} >= set(range(workers)):
        return "Complete"
    return None


def preempted_by_queue(job: JobView) -> AttemptOutcome | None:
    """The ending of an attempt whose Job its queue suspended while it ran (Kueue preempting
    it), else None. The Job controller stopped the pods (a pod stopped so counts as failed, and
    backoffLimit 0 fails the Job) and the trainer checkpointed on SIGTERM. The attempt ends
    Preempted whatever its pods still show (they may be gone already), so the next attempt
    resumes in the same precision and uses none of runPolicy.maxAttempts: the suspended Job is
    the evidence (Disruption.QUEUE_PREEMPTED), whatever the trainer said. The operator never
    suspends a Job that runs (runPolicy.suspend deletes it), so a suspended Job that failed was
    suspended by its queue. A pod's invalid report is left out (the checkpoint it names is
    not trusted). The first Preempted report tells it, with what the ranks agree on as the most
    any pod told it (`with_peers`): rank 0 writes a DDP job's checkpoint on SIGTERM, and another
    pod's report names the one it resumed from. With no Preempted report (each pod ended another
    way as it was stopped: a collective failed, a rank was cut), the first report, said as the
    queue's preemption, carries what the pods told it the same way: its newest checkpoint is the
    attempt's own, and the next attempt resumes from it."""
    if not (job.suspended and job.finished == "Failed" and job.reason != "DeadlineExceeded"):
        return None
    reports = valid_reports(job.pods)
    message = "preempted by its queue (its Job was suspended): resumes in the same precision once admitted again"
    report = next((r for r in reports if r.reason == Reason.PREEMPTED), None)
    if report is None and reports:  # every pod ended another way as it was stopped: the queue's ending
        report = reports[0].model_copy(update={"reason": Reason.PREEMPTED, "message": message})
    return AttemptOutcome(
        exit_code=int(codes.ExitCode.PREEMPTED),
        report=with_peers(report, reports) if report is not None else None,
        message=message,
        disruption=Disruption.QUEUE_PREEMPTED,
    )
