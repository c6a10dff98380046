"""Why a run stops early; each maps to one trainer exit code."""

from __future__ import annotations

from mpjob_contract.faults import GuardRule


class ConfigError(Exception):
    """The job's configuration or the user's code is wrong; retrying cannot help (exit 43)."""


class NumericFault(Exception):
    """This precision cannot go on (exit 42)."""

    def __init__(self, rule: GuardRule, message: str) -> None:
        super().__init__(message)
        self.rule = rule


class Preempted(Exception):
    """SIGTERM was honoured and a checkpoint written, unless the window saw numeric trouble (exit 44)."""


class NonFiniteInFp32(Exception):
    """A numeric fault replayed in fp32 stayed non-finite: the data or the model is at fault,
    not the precision, and no other precision can help (exit 45)."""


class Repromote(Exception):
    """precision.repromoteAfterSteps clean steps after a fallback, a checkpoint written: the next
    attempt goes back up to the faster precision from it (exit 47)."""
