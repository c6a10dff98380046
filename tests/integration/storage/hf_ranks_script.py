"""A Hugging Face Trainer job on every process of its attempt (`python hf_ranks_script.py`):
each rank saves its own RNG state beside rank 0's weights at every checkpoint, as the Trainer does
under DDP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import Trainer

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

    def forward(self, x: torch.Tensor, labels: torch.Tensor, **_: Any) -> dict[str, torch.Tensor]:
        return {"loss": ((self.linear(x).squeeze(-1) - labels) ** 2).mean()}


def main() -> None:
    with mpjob.start() as run:
        args = mpjob_hf.training_arguments(run, remove_unused_columns=False, dataloader_num_workers=0)
        mpjob_hf.train(run, Trainer(model=Net(), args=args, train_dataset=Data()))


if __name__ == "__main__":
    main()
