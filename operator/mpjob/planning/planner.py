"""The attempt planner: what comes after an attempt, given the spec and the history.

Pure functions over the API models. The operator and `mpjob run` both call `first_attempt`
and `after_attempt`; neither re-implements the ladder or the attempt budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpjob.planning.classify import Action, Classification
from mpjob_contract.api import MixedPrecisionJobSpec, Precision, precision_ladder, resolve_auto
from mpjob_contract.codes import Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT, inside_checkpoint_dir


@dataclass(frozen=True)
class StartAttempt:
    index: int
    precision: str
    #: Checkpoint directory to resume from; None lets the trainer take the newest valid one.
    resume_from: str | None
    #: The step the attempt is expected to resume at (for status; the trainer decides).
    start_step: int
    fallback_from: str | None = None


@dataclass(frozen=True)
class Finish:
    succeeded: bool
    reason: str
    message: str


Decision = StartAttempt | Finish


def compute_capability(spec: MixedPrecisionJobSpec) -> tuple[int, int] | None:
    """The capability `auto` resolves against: None for a CPU job (gpusPerWorker 0)."""
    if spec.resources.gpus_per_worker == 0:
        return None
    major, minor = spec.resources.min_compute_capability.split(".")
    return (int(major), int(minor))


def ladder(spec: MixedPrecisionJobSpec, capability: tuple[int, int] | str | None = "spec") -> list[Precision]:
    """The precisions attempts may walk through, first to last."""
    cap = compute_capability(spec) if capability == "spec" else capability
    return precision_ladder(spec.precision, resolve_auto(spec.precision.mode, cap))  # type: ignore[arg-type]


def first_attempt(spec: MixedPrecisionJobSpec, capability: tuple[int, int] | str | None = "spec") -> StartAttempt:
    return StartAttempt(index=0, precision=ladder(spec, capability)[0], resume_from=None, start_step=0)


def after_attempt(
    spec: MixedPrecisionJobSpec,
    index: int,
    precision: str,
    result: Classification,
    last_good_step: int,
    last_good_path: str | None,
    capability: tuple[int, int] | str | None = "spec",
    *,
    checkpoint_dir: str = CHECKPOINT_MOUNT,
    uncharged: int = 0,
) -> Decision:
    """Decide what follows attempt `index` (0-based) that ran in `precision` and ended as `result`.

    `last_good_step`/`last_good_path` name the newest verified checkpoint known so far (from
    the termination report or the status); the next attempt resumes from it when it lies in
    `checkpoint_dir` (a report is the trainer's word, not proof), else from the newest valid one.
    """
    if result.action is Action.SUCCEED:
        return Finish(True, Reason.SUCCEEDED.value, result.message)
    if result.action is Action.FAIL:
        return Finish(False, result.reason.value, result.message)
    attempts_used = index + 1 - uncharged  # earlier attempts that used none of the budget
    if attempts_used >= spec.run_policy.max_attempts:
        return Finish(
            False,
            "AttemptsExhausted",
            f"{attempts_used} attempt(s) used (runPolicy.maxAttempts={spec.run_policy.max_attempts}); "
            f"the last ended {result.reason.value}: {result.message}",
        )
    if result.action is Action.SAME_PRECISION:
        return StartAttempt(index + 1, precision, None, last_good_step)
    steps = ladder(spec, capability)
    position = steps.index(precision) if precision in steps else len(steps) - 1
    if position + 1 >= len(steps):
        return Finish(
            False,
            "NoPrecisionLeft",
            f"{precision} ended {result.reason.value} and no precision is left in the fallback "
            f"ladder {steps}: {result.message}",
        )
    resume_from = last_good_path if last_good_path and inside_checkpoint_dir(last_good_path, checkpoint_dir) else None
    return StartAttempt(index + 1, steps[position + 1], resume_from, last_good_step, fallback_from=precision)
