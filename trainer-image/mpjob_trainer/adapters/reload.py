"""Reading a framework's own checkpoint back into its live model and optimizer, for the fp32
replay of a fault that was applied to the weights (adapters.replaying.FrameworkWeights).

Only what the replay needs is read (weights and optimizer state: the replayed steps apply
updates as training did), with loaders that run no code: safetensors, and `torch.load` with
`weights_only`. The session hands them a checkpoint verified again (Checkpointer.back_to: one
damaged since its save is passed over for the one before it); a file of a sound one that is
missing or will not load (another format) makes the replay inconclusive, as before such replays
existed. A data verdict then re-enters the framework from the same
checkpoint through its own resume, which restores everything else (schedules, RNG, loops)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

#: What the Hugging Face Trainer names its weights and optimizer state in a checkpoint.
HF_WEIGHTS, HF_OPTIMIZER = "model.safetensors", "optimizer.pt"
#: What the Lightning adapter names Lightning's checkpoint inside the mpjob checkpoint.
LIGHTNING_CHECKPOINT = "lightning.ckpt"


def hf_weights(model: nn.Module, folder: Path) -> None:
    """The weights of the Trainer's checkpoint `folder` into `model`."""
    from safetensors.torch import load_file  # the Trainer's own dependency

    weights = load_file(folder / HF_WEIGHTS, device=str(_device(model)))
    unexpected = model.load_state_dict(weights, strict=False).unexpected_keys
    if unexpected:  # missing keys are tied weights the file holds once
        raise ValueError(f"{folder / HF_WEIGHTS} holds weights the model has not: {unexpected[:5]}")


def hf_reader(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Path], None]:
    def read(folder: Path) -> None:
        hf_weights(model, folder)
        optimizer.load_state_dict(torch.load(folder / HF_OPTIMIZER, map_location=_device(model), weights_only=True))

    return read


def lightning_reader(module: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Path], None]:
    def read(folder: Path) -> None:
        saved = torch.load(folder / LIGHTNING_CHECKPOINT, map_location=_device(module), weights_only=True)
        module.load_state_dict(saved["state_dict"])
        optimizer.load_state_dict(saved["optimizer_states"][0])

    return read


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device
