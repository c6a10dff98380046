"""Which attempts use up runPolicy.maxAttempts: the charging policy as data.

An attempt is uncharged only when something other than the trainer shows that it was stopped
from outside: the cluster (the pod's DisruptionTarget condition, which the scheduler's
preemption, the Eviction API, the taint manager and the kubelet write; the attempt Job
suspended by its queue; the node gone) or the user (runPolicy.suspend; Ctrl-C on `mpjob run`).
What the trainer says of itself (exit 44, a report saying Preempted) is the tenant's word: it
is charged like any other ending, so a script that always exits 44 ends Failed after
maxAttempts instead of running forever. Uncharged attempts are still bounded by
runPolicy.activeDeadlineSeconds, and status.attempts stays bounded however many there are
(`mpjob.planning.history`).

Evidence is read only from what the tenant cannot write: pod and Job status written by the
control plane and the kubelet, never the termination message or the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mpjob_contract.codes import Reason


class Disruption(StrEnum):
    """Evidence, from outside the trainer, that an attempt was stopped."""

    #: The pod's DisruptionTarget condition (PreemptionByScheduler, EvictionByEvictionAPI,
    #: DeletionByTaintManager, TerminationByKubelet) or the kubelet's Evicted status.
    POD_DISRUPTED = "PodDisrupted"
    #: The attempt's Job was suspended by its queue while it ran (Kueue preempted it).
    QUEUE_PREEMPTED = "QueuePreempted"
    #: The pod's node went away (NodeLost, DeletionByPodGC).
    NODE_LOST = "NodeLost"
    #: spec.elastic: the cluster holds fewer workers (unschedulable pods, a node gone) or more
    #: (nodes or quota back) than the attempt runs with; the operator resized the job.
    CAPACITY_CHANGED = "CapacityChanged"
    #: The user stopped the job: runPolicy.suspend, or Ctrl-C / a killed `mpjob run`.
    USER_SUSPEND = "UserSuspend"


@dataclass(frozen=True)
class ChargeRule:
    evidence: Disruption | None
    charged: bool
    why: str


#: Read top to bottom: the first rule whose evidence was seen decides; no evidence at all is
#: the last rule.
CHARGING_POLICY: tuple[ChargeRule, ...] = (
    ChargeRule(Disruption.POD_DISRUPTED, False, "the cluster preempted or evicted the pod (DisruptionTarget)"),
    ChargeRule(Disruption.QUEUE_PREEMPTED, False, "its queue suspended the attempt's Job (Kueue preemption)"),
    ChargeRule(Disruption.NODE_LOST, False, "the pod's node went away"),
    ChargeRule(Disruption.CAPACITY_CHANGED, False, "spec.elastic: the cluster's capacity changed, the job resized"),
    ChargeRule(Disruption.USER_SUSPEND, False, "the user suspended the job"),
    ChargeRule(None, True, "no disruption seen: the trainer's own ending, exit 44 and Preempted reports included"),
)
_BY_EVIDENCE = {rule.evidence: rule for rule in CHARGING_POLICY}

#: The reasons that only the platform (pod status, Job status) gives, and the evidence each is.
#: A trainer's report naming one of these reasons is no evidence: see `evidence_of`.
PLATFORM_EVIDENCE: dict[Reason, Disruption] = {
    Reason.EVICTED: Disruption.POD_DISRUPTED,
    Reason.NODE_LOST: Disruption.NODE_LOST,
}


def evidence_of(platform: Reason | None) -> Disruption | None:
    """The evidence a reason read from the pod's or Job's status (never from a report) is."""
    return PLATFORM_EVIDENCE.get(platform) if platform is not None else None


def rule_for(evidence: Disruption | None) -> ChargeRule:
    return _BY_EVIDENCE[evidence]


def charged(evidence: Disruption | None) -> bool:
    """Whether an attempt that ended with `evidence` (None: none seen) uses one of maxAttempts."""
    return rule_for(evidence).charged
