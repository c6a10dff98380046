"""UpdateWatch: steps that trained nothing, told before a checkpoint counts them as progress.

A step whose loop ran `run.backward()` and applied no optimizer update trained nothing. One now
and then is routine (GradScaler skips an overflowing step; the guard counts those). Every step of
a checkpoint interval so is not, and the checkpoint at its end would claim steps no update was
seen in. Two causes, told apart by whether the loop asked for an update:
- none asked (neither `run.step()` nor a step of an optimizer handed to `resume()` was called):
  the loop never calls `run.step()`, or a GradScaler of its own skips every step (in fp16 the
  attempt's GradScaler scales the loss it already scaled, so its own check finds inf every time
  and never calls `optimizer.step()`): the script's fault, a ConfigError (`idle_fault`);
- asked, and GradScaler skipped each one: overflows. Mid-run the guard's rule ends the precision
  (guard.maxConsecutiveOverflows) and no checkpoint of an interval in overflow is kept; a run that
  ends before that rule trips, with not one of its steps applied, ends in the same fault (the
  next precision resumes) rather than Succeeded.
Host-only bookkeeping, read from flags the step already keeps: no sync.
"""

from __future__ import annotations

from mpjob_contract.faults import GuardRule
from mpjob_trainer.errors import ConfigError, NumericFault


class UpdateWatch:
    """The run of steps in a row that ran backward and applied no update (in this attempt: one begun
    in place watches anew, session.inplace)."""

    def __init__(self) -> None:
        self.closed = 0  # steps this process closed
        self.idle = 0  # of the last ones, how many in a row ran backward and applied no update
        self.asked = False  # did any of those ask for an update (GradScaler skipped it)?

    def close(self, *, backward: bool, asked: bool, applied: bool, judged: bool) -> None:
        """A step closed: it ran `backward`, `asked` an optimizer for an update, one was `applied`;
        `judged`: the loop's own steps (not a quarantined one, not a framework's)."""
        self.closed += 1
        if applied or not backward or not judged:
            self.idle, self.asked = 0, False
        else:
            self.idle += 1
            self.asked = self.asked or asked

    def idle_fault(self, step: int, interval: int, *, last: bool) -> ConfigError | NumericFault | None:
        """At checkpoint step `step`, closing an `interval` of that many steps (`last`: the run's
        last step): what ends it when none of its steps (or of this process's, when fewer) applied
        an update."""
        if self.idle == 0 or self.idle < min(interval, self.closed):
            return None
        first = step - self.idle + 1
        if not self.asked:
            return ConfigError(
                f"steps {first} to {step} each ran run.backward() and no optimizer stepped: nothing was trained in "
                "a whole checkpoint interval, and its checkpoint is not written. The loop never calls "
                "run.step(optimizer), or a GradScaler of its own skips every step (scaler.step(optimizer) finds "
                "inf in gradients the attempt's GradScaler scaled once more when run.backward(scaler.scale(loss))). "
                "Remove your own torch.amp.GradScaler and call run.backward(loss) and "
                "run.step(optimizer, clip_norm=...) each step (docs/sdk.md)"
            )
        if last and self.idle == self.closed:
            return NumericFault(
                GuardRule.MAX_CONSECUTIVE_OVERFLOWS,
                f"{self.idle} consecutive overflow-skipped steps, every step the attempt trained: the first at step "
                f"{first}, detected at step {step}, the last, before guard.maxConsecutiveOverflows was reached: "
                "no update was applied, and the run does not end on weights none of its steps trained",
            )
        return None
