"""Trainer exit codes and the reasons the operator classifies them into."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ExitCode(IntEnum):
    """Process exit codes of the trainer. Anything not listed is an infrastructure failure."""

    SUCCESS = 0
    #: What the trainer and the launcher exit with for an unexpected error (a crash, a dead
    #: sibling): an infrastructure failure, retried in the same precision.
    INFRA_ERROR = 1
    #: This precision cannot go on (NaN/Inf storm, loss scale collapse, ...): try the next one.
    NUMERIC_FAULT = 42
    #: The job's configuration or the user's code is wrong: retrying cannot help.
    CONFIG_ERROR = 43
    #: SIGTERM honoured, a checkpoint written unless its window had numeric trouble (the report says
    #: which): resume in the same precision, from it or the last good one.
    PREEMPTED = 44
    #: The numeric fault replayed in fp32 went non-finite too: the data or the model is at
    #: fault, not the precision; no precision can help.
    NON_FINITE_IN_FP32 = 45
    #: The device ran out of memory (torch.OutOfMemoryError): retry with a smaller micro-batch.
    OUT_OF_DEVICE_MEMORY = 46
    #: precision.repromoteAfterSteps clean steps passed in a fallback precision and a
    #: checkpoint was written: go back up to the faster precision from it.
    REPROMOTE = 47


class Reason(StrEnum):
    """Why an attempt ended; CamelCase as Kubernetes condition reasons are."""

    SUCCEEDED = "Succeeded"
    NUMERIC_FAULT = "NumericFault"
    CONFIG_ERROR = "ConfigError"
    PREEMPTED = "Preempted"
    NON_FINITE_IN_FP32 = "NonFiniteInFp32"
    OUT_OF_DEVICE_MEMORY = "OutOfDeviceMemory"
    REPROMOTE = "Repromote"
    INFRA_ERROR = "InfraError"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    OOM_KILLED = "OOMKilled"
    IMAGE_PULL = "ImagePullError"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    SUSPENDED = "Suspended"
    DELETED = "PodDeleted"
    #: spec.elastic: the attempt ended so that the job goes on with fewer workers (its pods stayed
    #: unschedulable past elastic.waitSeconds, or it lost a node): the cluster's doing, uncharged.
    SCALED_DOWN = "ScaledDown"
    #: spec.elastic: the cluster holds more workers again; the attempt ended at a checkpoint so
    #: that the next one runs with more: uncharged.
    SCALED_UP = "ScaledUp"
    #: runPolicy.progressDeadlineSeconds: the attempt's step did not advance that long while its
    #: rank 0 was read (a hung collective, a stuck data loader or filesystem): ended by the operator.
    STALLED = "Stalled"


class FinishReason(StrEnum):
    """Why a job finished when no single attempt's ending says it (the Failed condition's reason;
    otherwise the last attempt's Reason is)."""

    #: runPolicy.maxAttempts used up.
    ATTEMPTS_EXHAUSTED = "AttemptsExhausted"
    #: The precision ladder has no rung left below the one that faulted.
    NO_PRECISION_LEFT = "NoPrecisionLeft"
    #: Attempts kept failing the same way before their first step: retrying cannot help.
    FAILED_BEFORE_FIRST_STEP = "FailedBeforeFirstStep"
    #: Two attempts in a row failed the same way at the same step (an exception the script
    #: raises there whatever the attempt): retrying cannot help.
    FAILED_AT_THE_SAME_STEP = "FailedAtTheSameStep"


#: What each of the trainer's own exit codes stands for; any other code is an infrastructure failure.
REASON_OF_EXIT_CODE: dict[int, Reason] = {
    ExitCode.SUCCESS: Reason.SUCCEEDED,
    ExitCode.NUMERIC_FAULT: Reason.NUMERIC_FAULT,
    ExitCode.CONFIG_ERROR: Reason.CONFIG_ERROR,
    ExitCode.PREEMPTED: Reason.PREEMPTED,
    ExitCode.NON_FINITE_IN_FP32: Reason.NON_FINITE_IN_FP32,
    ExitCode.OUT_OF_DEVICE_MEMORY: Reason.OUT_OF_DEVICE_MEMORY,
    ExitCode.REPROMOTE: Reason.REPROMOTE,
}


def reason_for_exit_code(code: int) -> Reason:
    """Map a trainer exit code to the reason it stands for."""
    return REASON_OF_EXIT_CODE.get(code, Reason.INFRA_ERROR)


#: The endings only the session can claim, from what it saw: the guard's verdict, a replay's,
#: a SIGTERM it honoured with a checkpoint, a device out of memory, a re-promotion it decided.
#: It writes the reason into the process's report before it exits with the code, so one of
#: these codes without that report is the script's own exit (a `sys.exit(42)`, before, after or
#: without the session): a script failure, not a fault to fall back from or a stop to resume
#: after. ConfigError (43) is not among them: a script's own exit 43 says what the code means.
WITNESSED: frozenset[Reason] = frozenset(
    {Reason.NUMERIC_FAULT, Reason.PREEMPTED, Reason.NON_FINITE_IN_FP32, Reason.OUT_OF_DEVICE_MEMORY, Reason.REPROMOTE}
)


def reason_for_process_exit(code: int, reported: str | None) -> Reason:
    """What a trainer process's exit code stands for, given the reason its own termination
    report gives (None: it wrote none): a WITNESSED code stands for its reason only when the
    report says so, and for a script failure (InfraError) otherwise."""
    reason = reason_for_exit_code(code)
    return Reason.INFRA_ERROR if reason in WITNESSED and reported != reason else reason


#: How trainer endings rank when several processes of one attempt ended differently: the
#: first class any of them ended in explains the attempt. The launcher folds a pod's local
#: ranks with it and the operator picks the pod that explains an attempt with it, so a pod
#: and a job tell the same story. A user's error outranks everything (the user must act);
#: a fault that fp32 replayed too outranks a plain numeric fault (no precision helps); a
#: numeric fault is a collective decision of all ranks; running out of device memory
#: explains the crashes of siblings whose collectives lost it; a crash explains the
#: siblings the launcher then stopped (which exit 44); a re-promotion is a planned stop after
#: a durable checkpoint that all ranks decide together, like a preemption the trainer chose.
ENDING_PRECEDENCE: tuple[Reason, ...] = (
    Reason.CONFIG_ERROR,
    Reason.NON_FINITE_IN_FP32,
    Reason.NUMERIC_FAULT,
    Reason.OUT_OF_DEVICE_MEMORY,
    Reason.INFRA_ERROR,
    Reason.REPROMOTE,
    Reason.PREEMPTED,
    Reason.SUCCEEDED,
)
#: The endings a trainer's report may give: each other reason (an eviction, a lost node, the
#: kernel's OOM killer, a deadline, a suspension, a resize) is the platform's or the operator's to
#: say, from what the cluster shows, never from a file the tenant's processes can write.
TRAINER_REASONS: frozenset[Reason] = frozenset(ENDING_PRECEDENCE)


#: Each class's place in ENDING_PRECEDENCE (0 = highest).
_PLACE: dict[str, int] = {reason.value: place for place, reason in enumerate(ENDING_PRECEDENCE)}
#: A container's exit code when a signal the platform sent ended it (128 + SIGTERM, + SIGKILL):
#: a stop from outside, ranked with the stops the trainer honoured.
KILLED_EXIT_CODES = (143, 137)


def ending_rank(reason: str | None, *, platform: bool = False) -> int:
    """Where one ending ranks among those of a pod's ranks or an attempt's pods, 0 explains most:
    ENDING_PRECEDENCE, with an ending the cluster explains (`platform`: an eviction, a lost
    node, the kernel's OOM killer) after what the trainer decided and before a crash (a crash
    of a pod whose peer was evicted is the eviction's doing). A reason outside the precedence
    ranks as a crash; None (nothing to explain) as a success. The launcher folds ranks with it
    and the operator picks the pod that explains an attempt with it."""
    crash = _PLACE[Reason.INFRA_ERROR]
    place = _PLACE.get(reason, crash) if reason is not None else _PLACE[Reason.SUCCEEDED]
    if place < crash:
        return place
    return crash if platform else place + 1


def explains_first(
    reason: str | None,
    *,
    platform: bool = False,
    stopped: bool = False,
    killed: bool = False,
    order: int = 0,
    index: int = 0,
) -> tuple[int, bool, bool, int, int]:
    """Sort key over the endings of a pod's ranks or an attempt's pods, smallest explains: the
    class (`ending_rank`); one that ended by itself before one stopped; for crashes, one `killed`
    by a signal from outside (the OOM killer, a kill: its peers' collectives fail because it is
    gone), then the one that ended first (`order`: a peer whose collective lost it fails a moment
    later); then the lowest `index` (the other classes are collective decisions or stops, and
    rank 0 writes the checkpoints). The launcher folds ranks with it and the operator picks the
    pod that explains an attempt with it (a pod's report says whether its rank was `killed`)."""
    place = ending_rank(reason, platform=platform)
    crash = place == ending_rank(Reason.INFRA_ERROR)
    return (place, stopped, not (crash and killed), order if crash else 0, index)


def exit_code_for(reason: Reason) -> ExitCode:
    """The exit code that stands for one of the trainer's own endings (INFRA_ERROR otherwise)."""
    codes = {r: ExitCode(c) for c, r in REASON_OF_EXIT_CODE.items()}
    return codes.get(reason, ExitCode.INFRA_ERROR)
