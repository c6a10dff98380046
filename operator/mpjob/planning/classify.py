"""How an attempt ended, and what that means: the failure policy as data.

Each rule maps a Reason to an Action. The reason comes from the pod or Job first (the
platform saw it: eviction, node loss, image pull, deadline, OOM) and from the trainer's
exit code otherwise (mpjob_contract.codes), save what the trainer decided (`CLUSTER_ENDINGS`).
Read the table top to bottom; that is the policy, in the code and in the README alike.

A second, smaller table says what the API server's refusal of an attempt's children means:
fail the job with the server's message, or retry with a per-job backoff.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from mpjob.planning.charging import Disruption, charged, evidence_of
from mpjob_contract.codes import Reason, ending_rank, reason_for_exit_code
from mpjob_contract.faults import FaultAction, built_in, fault_of
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.report import TerminationReport

if TYPE_CHECKING:  # elastic builds on the planner, which builds on this table
    from mpjob.planning.elastic import Resize


class Action(StrEnum):
    SUCCEED = "Succeed"
    #: Next precision of the ladder, resumed from the report's last good checkpoint.
    NEXT_PRECISION = "NextPrecision"
    #: Same precision, resumed from the newest valid checkpoint.
    SAME_PRECISION = "SamePrecision"
    #: Same precision with a smaller micro-batch (more accumulation: the same samples per
    #: optimizer step), resumed from the newest valid checkpoint.
    SMALLER_MICRO_BATCH = "SmallerMicroBatch"
    #: Back up to the faster precision the job fell back from, resumed from the checkpoint the
    #: trainer wrote before stopping.
    REPROMOTE = "Repromote"
    #: Stop the job with the trainer's (or the platform's) message.
    FAIL = "Fail"


@dataclass(frozen=True)
class Rule:
    reason: Reason
    action: Action
    why: str


FAILURE_POLICY: tuple[Rule, ...] = (
    Rule(Reason.SUCCEEDED, Action.SUCCEED, "the trainer finished every step"),
    Rule(Reason.NUMERIC_FAULT, Action.NEXT_PRECISION, "this precision cannot go on (exit 42)"),
    Rule(Reason.CONFIG_ERROR, Action.FAIL, "configuration or user code is wrong (exit 43): retrying cannot help"),
    Rule(
        Reason.NON_FINITE_IN_FP32,
        Action.FAIL,
        "replayed in fp32 the fault stays (exit 45): the data or the model is at fault, not the precision",
    ),
    Rule(
        Reason.PREEMPTED,
        Action.SAME_PRECISION,
        "SIGTERM honoured with a checkpoint (exit 44); uncharged only when the cluster shows why",
    ),
    Rule(
        Reason.REPROMOTE,
        Action.REPROMOTE,
        "precision.repromoteAfterSteps clean steps after a fallback, checkpoint written (exit 47)",
    ),
    Rule(
        Reason.OUT_OF_DEVICE_MEMORY,
        Action.SMALLER_MICRO_BATCH,
        "the GPU ran out of memory (exit 46): the same samples per step in smaller micro-batches",
    ),
    Rule(Reason.EVICTED, Action.SAME_PRECISION, "the pod was evicted or preempted by the platform"),
    Rule(Reason.DELETED, Action.SAME_PRECISION, "the pod was deleted or killed by a signal"),
    Rule(Reason.NODE_LOST, Action.SAME_PRECISION, "the node went away"),
    Rule(Reason.INFRA_ERROR, Action.SAME_PRECISION, "an infrastructure failure: try again"),
    Rule(
        Reason.STALLED,
        Action.SAME_PRECISION,
        "no step for runPolicy.progressDeadlineSeconds (a hung collective, data loader or filesystem): try again",
    ),
    Rule(Reason.OOM_KILLED, Action.FAIL, "host memory ran out (the kernel killed the container): raise its limit"),
    Rule(
        Reason.IMAGE_PULL,
        Action.FAIL,
        "the kubelet cannot parse the trainer image's name (InvalidImageName); an image it cannot pull is "
        "tried again until runPolicy.podCreationTimeoutSeconds",
    ),
    Rule(Reason.DEADLINE_EXCEEDED, Action.FAIL, "runPolicy.activeDeadlineSeconds passed"),
    Rule(Reason.SUSPENDED, Action.SAME_PRECISION, "suspended by the user; resumes in the same precision"),
    Rule(Reason.SCALED_DOWN, Action.SAME_PRECISION, "spec.elastic: go on with fewer workers from the last checkpoint"),
    Rule(Reason.SCALED_UP, Action.SAME_PRECISION, "spec.elastic: go on with more workers from the new checkpoint"),
)

_BY_REASON = {rule.reason: rule for rule in FAILURE_POLICY}

#: Pod/container/Job reasons as Kubernetes writes them -> our reasons.
PLATFORM_REASONS: dict[str, Reason] = {
    "Evicted": Reason.EVICTED,
    "Preempting": Reason.EVICTED,
    "DisruptionTarget": Reason.EVICTED,
    "TerminationByKubelet": Reason.EVICTED,
    "PreemptionByScheduler": Reason.EVICTED,
    "EvictionByEvictionAPI": Reason.EVICTED,
    "NodeLost": Reason.NODE_LOST,
    "NodeUnreachable": Reason.NODE_LOST,
    "DeletionByTaintManager": Reason.NODE_LOST,
    "DeletionByPodGC": Reason.NODE_LOST,
    "OOMKilled": Reason.OOM_KILLED,
    "ErrImagePull": Reason.IMAGE_PULL,
    "ImagePullBackOff": Reason.IMAGE_PULL,
    "InvalidImageName": Reason.IMAGE_PULL,
    "DeadlineExceeded": Reason.DEADLINE_EXCEEDED,
    "Stalled": Reason.STALLED,  # the operator's own verdict (runPolicy.progressDeadlineSeconds)
    "PodDeleted": Reason.DELETED,
}

#: Exit codes of a process killed by SIGTERM/SIGKILL (128 + signal) or by a negative
#: returncode as Python reports it.
SIGNAL_EXIT_CODES = {137, 143, -9, -15}


@dataclass(frozen=True)
class AttemptOutcome:
    """What was observed when an attempt's pods ended."""

    exit_code: int | None
    report: TerminationReport | None = None
    platform_reason: str | None = None
    message: str = ""
    #: What, other than the trainer, showed the attempt was stopped (its queue, the user);
    #: a platform reason adds its own (`mpjob.planning.charging`).
    disruption: Disruption | None = None
    #: The termination message was a report that failed the model: what was wrong with it.
    invalid_report: str | None = None
    #: spec.elastic: the size the job goes on with (mpjob.planning.elastic), when the attempt
    #: was ended (or lost a node) because the cluster's capacity changed.
    resize: Resize | None = None

    @property
    def end_step(self) -> int | None:
        return self.report.step if self.report else None


@dataclass(frozen=True)
class Classification:
    reason: Reason
    action: Action
    message: str
    #: The evidence of a disruption the attempt ended with (None: only the trainer's word).
    disruption: Disruption | None = None

    @property
    def charged(self) -> bool:
        """Whether the attempt uses one of runPolicy.maxAttempts (mpjob.planning.charging)."""
        return charged(self.disruption)


def classify(outcome: AttemptOutcome) -> Classification:
    """Turn an observed ending into a reason, the policy's action for it and the evidence of
    a disruption (only a platform reason or the outcome's own is evidence, never a report)."""
    platform = PLATFORM_REASONS.get(outcome.platform_reason) if outcome.platform_reason else None
    disruption = outcome.disruption or evidence_of(platform)
    if platform is None and outcome.invalid_report is not None:
        return Classification(Reason.INFRA_ERROR, Action.SAME_PRECISION, outcome.invalid_report, disruption)
    reason = platform
    said = outcome.report.reason if outcome.report is not None else None
    if reason in CLUSTER_ENDINGS and said is not None and ending_rank(said) < ending_rank(Reason.INFRA_ERROR):
        reason = Reason(said)  # the trainer decided: as the pod that explains the attempt was picked
    if reason is None and outcome.report is not None and outcome.report.reason != Reason.SUCCEEDED:
        reason = Reason(outcome.report.reason)
    if reason is None:
        if outcome.exit_code is None:
            reason = Reason.INFRA_ERROR
        elif outcome.exit_code in SIGNAL_EXIT_CODES:
            reason = Reason.DELETED
        else:
            reason = reason_for_exit_code(outcome.exit_code)
    rule = _BY_REASON[reason]
    message = (outcome.report.message if outcome.report and outcome.report.message else outcome.message) or rule.why
    return resized(Classification(reason, rule.action, message, disruption), outcome.resize)


#: What the cluster says of a pod (an eviction, its node lost, the OOM killer), which its trainer's
#: own decision (a report's reason ranked before a crash: a numeric fault, ...) outranks, as
#: `codes.ending_rank` has it; the operator's own endings (a deadline, a stall) stand.
CLUSTER_ENDINGS = frozenset({Reason.EVICTED, Reason.NODE_LOST, Reason.OOM_KILLED})


def resized(result: Classification, resize: Resize | None) -> Classification:
    """An ending the job resizes after (spec.elastic) is ScaledDown or ScaledUp, uncharged: only
    an ending that goes on in the same precision anyway (a disruption, a stop from outside); a
    numeric fault or a user's error keeps its own reason and action. One that no smaller size can
    take keeps its reason, and its message says why it was not shrunk."""
    if resize is None or result.action is not Action.SAME_PRECISION:
        return result
    if resize.short is not None:
        return replace(result, message=f"{result.message}; not shrunk: {resize.short}")
    if resize.reason is None:
        return result
    return Classification(resize.reason, Action.SAME_PRECISION, resize.why, Disruption.CAPACITY_CHANGED)


#: The operator's action for each policy action it carries out (Skip and RollBack are the
#: trainer's: an attempt that ended anyway keeps the table's action).
OPERATOR_ACTIONS: dict[FaultAction, Action] = {
    FaultAction.FALL_BACK: Action.NEXT_PRECISION,
    FaultAction.RETRY: Action.SAME_PRECISION,
    FaultAction.SMALLER_MICRO_BATCH: Action.SMALLER_MICRO_BATCH,
    FaultAction.FAIL: Action.FAIL,
}


def under_policy(result: Classification, policy: FaultPolicy, report: TerminationReport | None) -> Classification:
    """`result` as the job's spec.faultPolicy has it: its rule on the fault the attempt ended with
    decides (faults.decide: the guard rule's own before NumericFault's), and the message names
    that rule; no rule, or one that says what the built-in policy does, the table above."""
    fault = fault_of(result.reason, report.rule if report else None)
    if fault is None:
        return result
    decision = policy.decide(fault)
    action = OPERATOR_ACTIONS.get(decision.action)
    if decision.rule is None or action is None or decision.action is built_in(fault):
        return result
    return replace(result, action=action, message=f"{decision.names()}: {result.message}")


# ---------------------------------------------------------------- the API server refused a child


class ApiAction(StrEnum):
    #: The job fails with the API server's message: the same request fails the same way again.
    FAIL = "Fail"
    #: Try again later, backing off per job: the server is busy, restarting or out of date.
    RETRY = "Retry"


class ApiReason(StrEnum):
    """Why the API server refused a child: a refused attempt's (and its job's) reason, and the
    operator's refusal metric's label."""

    INVALID_POD_TEMPLATE = "InvalidPodTemplate"
    FORBIDDEN = "Forbidden"
    NAMESPACE_NOT_FOUND = "NamespaceNotFound"
    CONFLICT = "Conflict"
    TOO_MANY_REQUESTS = "TooManyRequests"
    NAME_CONFLICT = "NameConflict"
    UNAVAILABLE = "Unavailable"


@dataclass(frozen=True)
class ApiRule:
    status: int
    action: ApiAction
    reason: ApiReason
    why: str


#: What an HTTP status from the API server means when the operator creates or updates an
#: attempt's children (Job, Service). A status not listed is retried (as 5xx are).
API_ERROR_POLICY: tuple[ApiRule, ...] = (
    ApiRule(
        400,
        ApiAction.FAIL,
        ApiReason.INVALID_POD_TEMPLATE,
        "the server cannot decode the child (a malformed template field)",
    ),
    ApiRule(403, ApiAction.FAIL, ApiReason.FORBIDDEN, "RBAC, an admission webhook or policy, or a closing namespace"),
    ApiRule(404, ApiAction.FAIL, ApiReason.NAMESPACE_NOT_FOUND, "the namespace does not exist"),
    ApiRule(409, ApiAction.RETRY, ApiReason.CONFLICT, "another writer changed the object first"),
    ApiRule(
        422, ApiAction.FAIL, ApiReason.INVALID_POD_TEMPLATE, "the child fails validation: a template field is invalid"
    ),
    ApiRule(429, ApiAction.RETRY, ApiReason.TOO_MANY_REQUESTS, "API priority and fairness asks clients to slow down"),
)
_API_RULES = {rule.status: rule for rule in API_ERROR_POLICY}
#: 5xx, timeouts and lost connections (no status at all): the server will likely answer later.
#: An object of the child's name exists that this job did not create: it is never adopted nor deleted.
NAME_CONFLICT = ApiRule(
    409, ApiAction.FAIL, ApiReason.NAME_CONFLICT, "an object of that name exists that mpjob did not create"
)
UNAVAILABLE = ApiRule(
    0, ApiAction.RETRY, ApiReason.UNAVAILABLE, "the API server failed, timed out or could not be reached"
)


def classify_api_error(status: int | None) -> ApiRule:
    """The policy's rule for an API error while creating an attempt's children (`status`
    None: no answer at all, a timeout or a lost connection)."""
    return _API_RULES.get(status or 0, UNAVAILABLE)


def backoff_seconds(failures: int, *, base: float, cap: float) -> float:
    """The wait before retry number `failures` (1, 2, ...) of one job: `base` doubled per failure
    in a row, at most `cap`."""
    if failures < 1:
        return 0.0
    return min(cap, base * 2 ** min(failures - 1, 62))
