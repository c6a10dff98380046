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
    #: SIGTERM honoured and a checkpoint written: resume in the same precision.
    PREEMPTED = 44


class Reason(StrEnum):
    """Why an attempt ended; CamelCase as Kubernetes condition reasons are."""

    SUCCEEDED = "Succeeded"
    NUMERIC_FAULT = "NumericFault"
    CONFIG_ERROR = "ConfigError"
    PREEMPTED = "Preempted"
    INFRA_ERROR = "InfraError"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    OOM_KILLED = "OOMKilled"
    IMAGE_PULL = "ImagePullError"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    SUSPENDED = "Suspended"
    DELETED = "PodDeleted"


def reason_for_exit_code(code: int) -> Reason:
    """Map a trainer exit code to the reason it stands for."""
    match code:
        case ExitCode.SUCCESS:
            return Reason.SUCCEEDED
        case ExitCode.NUMERIC_FAULT:
            return Reason.NUMERIC_FAULT
        case ExitCode.CONFIG_ERROR:
            return Reason.CONFIG_ERROR
        case ExitCode.PREEMPTED:
            return Reason.PREEMPTED
        case _:
            return Reason.INFRA_ERROR
