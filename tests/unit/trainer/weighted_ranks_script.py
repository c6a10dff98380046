"""Two ranks of unequal batches under a framework adapter, for the job's-loss weighting test.

    python weighted_ranks_script.py {hf|hf-items|lightning}

A one-parameter model that predicts 0 and never moves (learning rate 0): rank r's loss is its
targets' mean square, the same at every step. Rank 0 trains on 6 samples a step, all of target
1 (loss 1); rank 1 on 2, of target 3 (loss 9). The job's loss weighs them by their samples:
(6 x 1 + 2 x 9) / 8 = 3; ranks weighed alike would show (1 + 9) / 2 = 5. Each rank reads its
own samples (no distributed sampler), as a script whose ranks hold unequal shards does.
`hf-items`: the model takes `num_items_in_batch` (as every causal LM does): the Trainer sums
the squares over every rank's items (8) and multiplies by the processes, rank 0's loss is
2 x 6 / 8 = 1.5 and rank 1's 2 x 18 / 8 = 4.5, each its share of the job's already: weighed
alike they make 3, weighed by samples 2.25.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn

from mpjob_trainer import session as mpjob

#: Rank r's (samples per step, target).
SHARDS = {0: (6, 1.0), 1: (2, 3.0)}


class Zero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        prediction = x * self.w
        out = {"prediction": prediction}
        if labels is not None:
            out["loss"] = ((prediction - labels) ** 2).mean()
        return out


class ZeroOverItems(Zero):
    """Its loss is the squares' sum over `num_items_in_batch` (the Trainer's count of the step's items)."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        out = super().forward(x, labels)
        if labels is not None and kwargs.get("num_items_in_batch") is not None:
            out["loss"] = ((out["prediction"] - labels) ** 2).sum() / kwargs["num_items_in_batch"]
        return out


def shard(steps: int) -> list[dict[str, torch.Tensor]]:
    """This rank's samples: `steps` steps of its batch."""
    size, target = SHARDS[int(os.environ["RANK"])]
    return [{"x": torch.ones(1), "labels": torch.full((1,), target)} for _ in range(size * steps)]


def hf(run: Any, items: bool = False) -> None:
    from transformers import Trainer

    from mpjob_trainer.adapters import hf as mpjob_hf

    size, _ = SHARDS[run.world.rank]
    args = mpjob_hf.training_arguments(run, learning_rate=0.0)

    class OwnShard(Trainer):
        def get_train_dataloader(self) -> Any:
            """This rank's own batches (the spec's micro-batch is the job's): unequal between the ranks."""
            return torch.utils.data.DataLoader(self.train_dataset, batch_size=size)  # type: ignore[arg-type]

    model = ZeroOverItems() if items else Zero()
    trainer = OwnShard(model=model, args=args, train_dataset=shard(run.total_steps))  # type: ignore[arg-type]
    mpjob_hf.train(run, trainer)


def lightning(run: Any) -> None:
    import lightning as L

    from mpjob_trainer.adapters import lightning as mpjob_lightning

    size, _ = SHARDS[run.world.rank]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Zero()

        def training_step(self, b: dict[str, torch.Tensor], i: int) -> torch.Tensor:
            return self.net(b["x"], b["labels"])["loss"]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(shard(run.total_steps), batch_size=size)  # type: ignore[arg-type]

    settings = mpjob_lightning.trainer_settings(
        run, logger=False, enable_model_summary=False, use_distributed_sampler=False
    )
    mpjob_lightning.fit(run, L.Trainer(**settings), Module())


def main() -> None:
    with mpjob.start() as run:
        if sys.argv[1] == "lightning":
            lightning(run)
        else:
            hf(run, items=sys.argv[1] == "hf-items")


if __name__ == "__main__":
    main()
