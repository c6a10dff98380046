"""The fp32 replay's verdicts (session.replay) and the words an attempt that ended after one
is told with: the report's Replay record, and the message that names the steps, samples and
ranks (steps counted from 1, as the log lines and the guard's messages count them)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from mpjob_contract.report import Replay
from mpjob_trainer.errors import NonFiniteInFp32, NumericFault

#: Samples and ranks named in a report at most (the report must stay under Kubernetes' 4 KiB).
MAX_NAMED_SAMPLES = 32
MAX_NAMED_RANKS = 16


@dataclass(frozen=True)
class Window:
    """The steps to replay (0-based optimizer step indexes) and where their weights come from."""

    first_fault: int
    steps: range
    from_checkpoint: bool


@dataclass(frozen=True)
class Offending:
    """The step fp32 found non-finite, the ranks whose share it was, and all their samples."""

    step: int
    ranks: list[int]
    samples: list[int]


def listed(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def verdict_of(verdict: str, win: Window, began: float, *, steps: int, offending: Offending | None = None) -> Replay:
    return Replay(
        verdict=verdict,
        first_step=win.first_fault,
        steps=steps,
        from_checkpoint=win.from_checkpoint,
        offending_step=offending.step if offending else None,
        samples=offending.samples[:MAX_NAMED_SAMPLES] if offending else [],
        ranks=offending.ranks[:MAX_NAMED_RANKS] if offending else [],
        seconds=round(time.monotonic() - began, 3),
    )


def inconclusive(first_fault: int) -> Replay:
    """No replay could be made: the precision is blamed, as before replays existed."""
    return Replay(verdict="inconclusive", first_step=first_fault)


def ending_for(fault: NumericFault, replay: Replay) -> Exception:
    """What ends the attempt after the replay: NonFiniteInFp32, or the fault, told what fp32 said."""
    message = describe(replay, f"{fault.rule}: {fault}")
    if replay.verdict == "data":
        return NonFiniteInFp32(message)
    return NumericFault(fault.rule, message.removeprefix(f"{fault.rule}: "))


def describe(replay: Replay, rule_message: str) -> str:
    """The human message of an attempt that ended after a replay. It counts steps from 1, as the
    log lines and the guard's messages do (the report's fields are 0-based indexes)."""
    if replay.verdict == "data" and replay.steps == 0:
        return (
            f"{rule_message}; the attempt is in fp32, so step {(replay.offending_step or 0) + 1} being non-finite "
            "is the data's or the model's fault, not the precision's"
        )
    if replay.verdict == "data":
        shown = f"; samples of that step there: [{', '.join(str(i) for i in replay.samples)}]" if replay.samples else ""
        origin = (
            "the last good state (checkpoint or first step)"
            if replay.from_checkpoint
            else "the weights before the fault"
        )
        whose = f"rank {replay.ranks[0]}" if len(replay.ranks) == 1 else f"ranks {listed(replay.ranks)}"
        return (
            f"{rule_message}; replayed in fp32 from {origin}, step {(replay.offending_step or 0) + 1} is "
            f"non-finite too: the data or the model is at fault, not the precision ({whose}{shown})"
        )
    if replay.verdict == "precision":
        return f"{rule_message}; fp32 replayed {replayed(replay)} finitely: the precision is at fault"
    return f"{rule_message}; no fp32 replay could tell (inconclusive)"


def replayed(replay: Replay) -> str:
    """The steps a replay went through, counted from 1: they end at the first faulting one (a
    window cut short at the attempt's start or with no checkpoint before it replays that one)."""
    first, last = replay.first_step - replay.steps + 2, replay.first_step + 1
    return f"step {last}" if replay.steps <= 1 else f"steps {first}-{last}"
