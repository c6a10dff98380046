"""A Hugging Face Trainer job whose model normalises its loss over the step's items
(`num_items_in_batch`, as every causal LM does): `python hf_items_script.py OUT`. After training,
each rank runs the last step again as the session's fp32 replay does (`run.run_step`) and writes
the gradients its optimizer stepped with, in training and in that replay, to OUT/rank<R>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback

from mpjob_trainer import session as mpjob
from mpjob_trainer.adapters import hf as mpjob_hf


class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(4, generator=g), "labels": torch.randn((), generator=g)}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor, **loss_kwargs: Any) -> dict[str, torch.Tensor]:
        squared = (self.linear(x).squeeze(-1) - labels) ** 2
        items = loss_kwargs.get("num_items_in_batch")
        return {"loss": squared.sum() / items if items is not None else squared.mean()}


class Gradients(TrainerCallback):
    """Each optimizer step's gradients, as the optimizer steps with them."""

    def __init__(self) -> None:
        self.seen: list[list[float]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        inner = getattr(kw["optimizer"], "optimizer", kw["optimizer"])
        params = [p for group in inner.param_groups for p in group["params"]]
        grads = lambda *_: self.seen.append(torch.cat([p.grad.flatten() for p in params]).tolist())  # noqa: E731
        inner.register_step_pre_hook(grads)


def main() -> None:
    out = Path(sys.argv[1])
    with mpjob.start() as run:
        args = mpjob_hf.training_arguments(run, remove_unused_columns=False, dataloader_num_workers=0)
        gradients = Gradients()
        trainer = Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[gradients])
        mpjob_hf.train(run, trainer)
        trained = gradients.seen[-1]
        run.run_step(run.total_steps - 1)
        replayed = gradients.seen[-1]
        (out / f"rank{run.world.rank}.json").write_text(json.dumps({"trained": trained, "replayed": replayed}))


if __name__ == "__main__":
    main()
