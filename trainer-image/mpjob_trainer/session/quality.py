"""QualityGate: a silent accuracy regression in low precision, caught at the same weights (M5).

Every `validation.everySteps` steps the session evaluates the current weights twice on the
task's evaluation set: in the attempt's precision (autocast as in training) and in fp32
(the EVAL mode of session.modes: autocast off), both without gradients. The relative delta
|low - fp32| / |fp32| compares the precision with fp32 on exactly the same model, so it
isolates what the precision does to the loss from what training does to the weights. A
delta above `validation.maxLossDelta` at two evaluations in a row ends the precision as a numeric fault
(rule `QualityDrift`): the ladder's next precision takes over from the last good checkpoint.
A single excursion is recorded, not acted on. Under DDP every rank evaluates its own share
and the ranks agree on the largest delta. In fp32 attempts the fp32 pass is the only one
(the delta is 0).

Cost: two eval passes (one in fp32 attempts) of `validation.batches` batches per interval;
`mpjob_trainer_eval_seconds_total` counts it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mpjob_contract.api import Validation
from mpjob_contract.faults import GuardRule
from mpjob_contract.spec import DRIFT_IN_A_ROW as IN_A_ROW
from mpjob_trainer.distributed import World, all_reduce_max
from mpjob_trainer.errors import NumericFault
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.modes import AttemptPrecision, Mode
from mpjob_trainer.session.steps import require_callables

#: The user's evaluation: the mean eval loss of the current weights, computed under
#: run.autocast() (the session runs it in the attempt's precision and in fp32).
EvalFunction = Callable[[], "torch.Tensor | float"]


@dataclass(frozen=True)
class Evaluation:
    step: int
    loss: float
    loss_fp32: float
    delta: float
    seconds: float


def relative_delta(loss: float, reference: float) -> float:
    """|loss - reference| / |reference| (inf when either is non-finite)."""
    if not (math.isfinite(loss) and math.isfinite(reference)):
        return math.inf
    return abs(loss - reference) / max(abs(reference), 1e-12)


class QualityGate:
    def __init__(self, evaluate: EvalFunction, spec: Validation, world: World, device: torch.device) -> None:
        require_callables("evaluate_with", evaluate=evaluate)  # a ConfigError at the call, not at an eval step
        self.evaluate = evaluate
        self.spec = spec
        self.world = world
        self.device = device
        self._attempt = 0
        #: (step, above maxLossDelta?) of the attempt `_attempt`'s evaluations, in step order (`judge`).
        self._judged: list[tuple[int, bool]] = []

    @property
    def over(self) -> int:
        """Evaluations in a row above maxLossDelta, up to the last judged."""
        return next((n for n, (_, over) in enumerate(reversed(self._judged)) if not over), len(self._judged))

    def due(self, step: int) -> bool:
        return self.spec.every_steps > 0 and step % self.spec.every_steps == 0

    def check(
        self, step: int, *, precision: AttemptPrecision, metrics: TrainerMetrics, log: EventLog, attempt: int = 0
    ) -> NumericFault | None:
        """The gate at `step`: evaluate in the attempt's precision and in fp32, record, judge.
        `attempt`: which attempt begun in these processes it judges (Cadence.begun); a new one
        (a fallback in place) counts its evaluations in a row from none, as a restarted one does."""
        if attempt != self._attempt:
            self._attempt, self._judged = attempt, []
        evaluation = self.measure(step, precision)
        metrics.evaluated(evaluation.loss, evaluation.loss_fp32, evaluation.delta, evaluation.seconds)
        log(
            "eval",
            step=step,
            loss=evaluation.loss,
            lossFp32=evaluation.loss_fp32,
            delta=evaluation.delta,
            seconds=round(evaluation.seconds, 4),
        )
        return self.judge(evaluation)

    def measure(self, step: int, precision: AttemptPrecision) -> Evaluation:
        """Evaluate in the attempt's precision and, when that is a low one, in its EVAL mode (fp32)."""
        began = time.perf_counter()
        with torch.no_grad():
            loss = float(self.evaluate())
            if precision.precision == "fp32":
                reference = loss
            else:
                with precision.entered(Mode.EVAL):
                    reference = float(self.evaluate())
        mine = relative_delta(loss, reference)
        agreed = all_reduce_max(torch.tensor(min(mine, 1e300), dtype=torch.float64, device=self.device), self.world)
        return Evaluation(step, loss, reference, float(agreed.item()), time.perf_counter() - began)

    def judge(self, evaluation: Evaluation) -> NumericFault | None:
        """Count an evaluation; the second in a row above maxLossDelta is a QualityDrift fault.

        In a row by step: a rollback in the attempt (session.skipping) catches up through steps
        evaluated before, and their evaluations then are gone with the state they judged, so the
        streak is the one a straight run has at this step, not one more for each re-run."""
        limit = self.spec.max_loss_delta
        judged = [seen for seen in self._judged if seen[0] < evaluation.step]
        self._judged = [*judged, (evaluation.step, evaluation.delta > limit)]
        if self.over < IN_A_ROW:
            return None
        return NumericFault(
            GuardRule.QUALITY_DRIFT,
            f"eval loss {evaluation.loss:.6g} vs {evaluation.loss_fp32:.6g} in fp32 at the same weights: "
            f"relative delta {evaluation.delta:.3g} > validation.maxLossDelta={limit:g} at {IN_A_ROW} "
            f"evaluations in a row (step {evaluation.step})",
        )
