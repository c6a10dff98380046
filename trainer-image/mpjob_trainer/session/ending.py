"""How an attempt's process ends: ONE exit code and ONE termination report, on every rank.

The operator (and `mpjob run`) decide what happens next from the exit code and the report
alone (mpjob_contract.codes / .report), so the mapping from "why did the loop stop" to both
lives here, as a table, for the builtin trainer and every user script alike. The launcher
folds the local ranks' reports into the pod's; each rank writes its own.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import mpjob_contract
from mpjob_contract.codes import WITNESSED, ExitCode, Reason, reason_for_exit_code
from mpjob_contract.faults import GuardRule
from mpjob_contract.report import CheckpointRef, Counters, InPlaceChange, Measurement, Replay, TerminationReport
from mpjob_contract.skipping import Skipped
from mpjob_trainer.errors import ConfigError, NonFiniteInFp32, NumericFault, Preempted, Repromote
from mpjob_trainer.events import EventLog


@dataclass
class Standing:
    """Where the attempt stood when it ended: what the report says besides the reason."""

    step: int = 0
    start_step: int | None = None  # None: the attempt ended before it decided where to start
    precision: str = ""
    last_good: CheckpointRef | None = None
    #: The loop stopped early after `step`, on its own decision (session.early_stop).
    stopped_early: bool = False
    #: spec.training.steps (0: not known where the standing is made).
    total: int = 0
    counters: Counters = field(default_factory=Counters)
    replay: Replay | None = None
    measurement: Measurement | None = None
    loss_scales: list[tuple[int, float]] = field(default_factory=list)
    skipped: Skipped | None = None
    precision_changes: list[InPlaceChange] = field(default_factory=list)
    ended_at: float | None = None
    recovery_seconds: float | None = None


@dataclass(frozen=True)
class Ending:
    code: int
    reason: Reason
    message: str
    #: A numeric fault's guard rule (what spec.faultPolicy rules on).
    rule: GuardRule | None = None


#: The exceptions that end an attempt on purpose, with their code, reason and message.
ENDINGS: tuple[tuple[type[Exception], ExitCode, Reason, Callable[[Exception], str]], ...] = (
    (ConfigError, ExitCode.CONFIG_ERROR, Reason.CONFIG_ERROR, str),
    (NumericFault, ExitCode.NUMERIC_FAULT, Reason.NUMERIC_FAULT, lambda e: f"{e.rule}: {e}"),  # type: ignore[attr-defined]
    (Preempted, ExitCode.PREEMPTED, Reason.PREEMPTED, str),
    (NonFiniteInFp32, ExitCode.NON_FINITE_IN_FP32, Reason.NON_FINITE_IN_FP32, str),
    (Repromote, ExitCode.REPROMOTE, Reason.REPROMOTE, str),
    (
        torch.OutOfMemoryError,
        ExitCode.OUT_OF_DEVICE_MEMORY,
        Reason.OUT_OF_DEVICE_MEMORY,
        lambda e: f"out of GPU memory: {str(e).splitlines()[0] if str(e) else 'torch.OutOfMemoryError'}",
    ),
)


def classify(exc: BaseException | None, standing: Standing) -> Ending:
    """The exit code, reason and message for the way the run stopped (None: it finished)."""
    if exc is None:
        return Ending(ExitCode.SUCCESS, Reason.SUCCEEDED, trained(standing))
    for kind, code, reason, message in ENDINGS:
        if isinstance(exc, kind):
            return Ending(code, reason, message(exc), exc.rule if isinstance(exc, NumericFault) else None)
    if _compile_failure(exc):
        first = str(exc).splitlines()[0] if str(exc) else ""
        said = (
            f"training.compile: torch.compile failed ({type(exc).__name__}: {first}); "
            "set training.compile to auto (eager where compiling fails) or never"
        )
        return Ending(ExitCode.CONFIG_ERROR, Reason.CONFIG_ERROR, said)
    if isinstance(exc, SystemExit):  # the script called sys.exit() inside the session
        return _script_exit(exc, standing)
    return Ending(ExitCode.INFRA_ERROR, Reason.INFRA_ERROR, raised(exc))


def trained(standing: Standing) -> str:
    """'trained 300 steps in bf16': a finished run's message, which says why it ended short of
    spec.training.steps: its own stop, or a loop that left without telling one (what of it the
    checkpoints keep: the steps after the last are not, docs/sdk.md)."""
    said = f"trained {standing.step} steps in {standing.precision}"
    if standing.stopped_early:
        return f"{said}, stopped early there (the training's own stop)"
    if standing.step >= standing.total:
        return said
    last = standing.last_good
    kept = f"its last checkpoint is step {last.step}'s" if last is not None else "no checkpoint holds its steps"
    return f"{said}, short of spec.training.steps={standing.total}: the loop left without run.stop_early(step), {kept}"


#: The most of an exception's own text an attempt's message keeps (its place is said after it).
MAX_ERROR_CHARS = 1000
#: The most of the place it was raised the message keeps (a deep path's end: the file's name).
MAX_PLACE_CHARS = 200
#: Where code that is not the user's lives: the trainer, the contract, torch, the standard
#: library and installed packages.
_NOT_THEIRS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in (
        Path(__file__).parents[1],  # mpjob_trainer
        Path(mpjob_contract.__file__).parent,
        Path(torch.__file__).parent,
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    )
)


def raised(exc: BaseException) -> str:
    """'KeyError: 'labels' (raised at train.py:12 in loss_of)': the exception, its text bounded,
    and the innermost frame of the user's own code it passed through (none: the exception alone)."""
    text = str(exc)
    text = text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " [...]"
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    place = user_frame(exc)
    return f"{said} (raised at {place})" if place else said


def user_frame(exc: BaseException) -> str | None:
    """'train.py:12 in loss_of': the innermost frame of `exc`'s traceback in the user's code (not
    the trainer's, torch's, the standard library's or an installed package's), the path relative to
    the working folder when below it, at most MAX_PLACE_CHARS (its end kept)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename)
        if frame.filename.startswith("<") or str(path.resolve()).startswith(_NOT_THEIRS):
            continue
        shown = os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)
        place = f"{shown}:{frame.lineno} in {frame.name}"
        return place if len(place) <= MAX_PLACE_CHARS else "..." + place[-(MAX_PLACE_CHARS - 3) :]
    return None


def _script_exit(exc: SystemExit, standing: Standing) -> Ending:
    """The script's own sys.exit(code): its code by the code's meaning, except the codes of what
    only the session decides (codes.WITNESSED: 42, 44-47), which the script cannot have seen
    decided: exit 1, a script failure, retried (and ended after the same failure twice)."""
    if exc.code is None or isinstance(exc.code, int):
        status = exc.code or 0
        said = f"the script exited with code {status}"
    else:  # sys.exit("a message"): Python's exit 1, the message printed; the report keeps it
        status, said = int(ExitCode.INFRA_ERROR), f"the script exited: {exc.code}"
    reason = reason_for_exit_code(status)
    if status == ExitCode.SUCCESS:
        return classify(None, standing)
    if reason in WITNESSED:
        said += f" (sys.exit({status})): {status} means {reason} only when the session decides it"
        said += "; read as the script's failure"
        return Ending(ExitCode.INFRA_ERROR, Reason.INFRA_ERROR, said)
    return Ending(status, reason, said)


def _compile_failure(exc: BaseException) -> bool:
    """Did torch.compile fail (training.compile: always)? Same image, same failure: not retried.
    (Only a process that compiled has torch._dynamo loaded; the others never import it here.)"""
    dynamo_exc = sys.modules.get("torch._dynamo.exc")
    return dynamo_exc is not None and isinstance(exc, dynamo_exc.TorchDynamoException)


def after_close(call: str, *, step: int) -> ConfigError:
    """`call` came after the session closed at `step`: its report is written, and nothing after it
    may train or write a checkpoint the report does not name."""
    return ConfigError(
        f"{call} after the session closed at step {step} (close(), or the end of its `with` block): "
        "its report is written; close the session after the loop's last step"
    )


def announce(exc: BaseException | None, step: int, loss: float | None, applied: int, *, log: EventLog) -> None:
    """The run's `done` line, or a numeric fault's `fault` line, before its ending is judged."""
    if classify(exc, Standing()).code == ExitCode.SUCCESS:
        log("done", step=step, loss=loss, appliedSteps=applied)
    elif isinstance(exc, NumericFault):
        log("fault", step=step, rule=exc.rule, message=str(exc), all_ranks=True)


def conclude(exc: BaseException | None, standing: Standing, log: EventLog) -> int:
    """Say why the run ended (stderr, event line) and write the report; returns the exit code."""
    ending = classify(exc, standing)
    if isinstance(exc, ConfigError):
        log("error", kind="ConfigError", message=ending.message, all_ranks=True)
    elif ending.reason == Reason.INFRA_ERROR and exc is not None:
        if not isinstance(exc, SystemExit):
            traceback.print_exception(exc)
        log("error", kind=type(exc).__name__, message=str(exc), all_ranks=True)
    report = TerminationReport(
        reason=ending.reason,
        step=standing.step,
        start_step=standing.start_step,
        precision=standing.precision,
        last_good_checkpoint=standing.last_good,
        counters=standing.counters,
        replay=standing.replay,
        measurement=standing.measurement,
        loss_scales=standing.loss_scales,
        skipped=standing.skipped,
        precision_changes=standing.precision_changes,
        ended_at=standing.ended_at,
        recovery_seconds=standing.recovery_seconds,
        rule=ending.rule,
        message=ending.message,
    )
    try:
        report.write()
    except OSError as exc_write:  # no /dev/termination-log outside a container; under the launcher a
        # code of codes.WITNESSED without its report reads as a script failure (retried in its precision)
        print(f"mpjob: cannot write the termination report: {exc_write}", file=sys.stderr)
    return int(ending.code)
