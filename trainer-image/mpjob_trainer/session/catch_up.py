"""Catching up after a rollback in place (session.skipping; a fallback in place, session.inplace):
the steps from the restored state up to where the loop stands are run again through the loop's
registered step, and each is closed as the loop's own `end_step` closes it, its interval work
included: at a log step its step line and metrics (the series of `mpjob run` and the metrics
endpoint show the steps run again, as a restarted attempt's loop shows them), the guard's checks,
the quality gate, a checkpoint, SIGTERM. What ends one of them ends the catching up there."""

from __future__ import annotations

from collections.abc import Callable

from mpjob_trainer.quarantine import Quarantine
from mpjob_trainer.session.replay import Fp32Replay
from mpjob_trainer.session.steps import Number

#: The session's closing of step `step` (1-based; its loss, None: the losses backward() was given;
#: the samples it trained on, all ranks', None: not told): what ends it, if anything (session.closing).
CloseStep = Callable[[int, Number | None, int | None], Exception | None]


def catch_up(
    replay: Fp32Replay, close: CloseStep, quarantine: Quarantine, *, start: int, step: int, samples: int | None
) -> Exception | None:
    """Run steps start..step-1 (0-based) again through `replay`'s registered step (a quarantined
    one trains on nothing, and counts as the loop's own end_step counts it) and close each but the
    last, which the loop's end_step closes, each on `samples` (a step's, as the loop tells them):
    None, or what ended one (a fault the guard saw; Preempted; Repromote, when not made in place)."""
    for index in range(start, step):
        if not quarantine.skips_step(index):
            replay.step(index)
        if index + 1 < step and (ending := close(index + 1, None, samples)) is not None:
            return ending
    return None
