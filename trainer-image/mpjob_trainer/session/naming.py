"""StepSamples: which samples (dataset indices) an optimizer step trained on, on every rank, from
the loop's `samples(i)` (register_step): what a replay's data verdict names (session.replay: the
offending ranks' samples of the step) and what the data rung quarantines (session.skipping).

A rank knows only its own share, so naming a step's samples gathers them from every rank: a
collective, called by every rank alike. A verdict that named them already is taken as it is (the
same on every rank), which costs no collective."""

from __future__ import annotations

import torch

from mpjob_contract.skipping import SkipCause
from mpjob_trainer.distributed import World
from mpjob_trainer.quarantine import ScreenFunction
from mpjob_trainer.session.agreement import RankTable, flatten, gathered
from mpjob_trainer.session.steps import SamplesFunction
from mpjob_trainer.session.verdict import Offending


class StepSamples:
    def __init__(self, samples: SamplesFunction | None, world: World) -> None:
        #: The loop's lookup (None: it names no samples; a step is then quarantined whole).
        self.samples = samples
        self.world = world

    def mine(self, index: int) -> list[int]:
        """This rank's samples of step `index` (0-based; none when the loop names none)."""
        return list(self.samples(index)) if self.samples is not None else []

    def offending(self, index: int, ranks: list[int]) -> Offending:
        """Step `index` of `ranks`, with their samples gathered from them (a collective)."""
        return Offending(index, ranks, flatten(gathered(self.mine(index), self.world), ranks))

    def offending_where(self, index: int, loss: int, trouble: int, device: torch.device) -> Offending:
        """Step `index` of the ranks whose first non-finite loss (`loss`, each rank its own) was there, else of those
        whose trouble began there (`trouble`: a gradient, all-reduced, every rank saw), with their samples
        (collectives): as a replay names them."""
        table = RankTable.agree({"loss": loss == index, "grad": trouble == index}, self.world, device)
        return self.offending(index, table.ranks("loss") or table.ranks("grad"))

    def to_quarantine(
        self, index: int, cause: SkipCause, screen: ScreenFunction | None, named: Offending | None
    ) -> list[int]:
        """The samples of step `index` to quarantine: for bad data those of the ranks the verdict
        `named` (all ranks' when it named none), narrowed by the loop's `screen`; for a spike all
        ranks'. A collective unless the verdict named them (then the same on every rank)."""
        offending = named if cause == "data" else None
        if offending is not None and offending.step == index and offending.samples:
            every = sorted(set(offending.samples))
        else:
            every = sorted({int(i) for part in gathered(self.mine(index), self.world) for i in part})
        if cause == "data" and screen is not None and every:
            return screen(every) or every
        return every
