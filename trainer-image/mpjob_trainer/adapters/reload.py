"""Reading a framework's own checkpoint back into its live model and optimizer, for the fp32
replay of a fault that was applied to the weights (adapters.replaying.FrameworkWeights).

Only what the replay needs is read (weights and optimizer state: the replayed steps apply
updates as training did), with loaders that run no code: safetensors, and `torch.load` with
`weights_only`. The session hands them a checkpoint verified again (Checkpointer.back_to: one
damaged since its save is passed over for the one before it). A checkpoint that verifies and is
bad inside (a file cut short under a manifest recomputed over it: it passes its sha256 and its
loader fails) is the checkpoint's fault, never the precision's: CorruptCheckpoint, read before
the model or optimizer is touched, so back_to marks it unloadable and takes the one before it,
as on the SDK's path. A sound checkpoint the replay cannot read this way (no such file: weights
saved as `pytorch_model.bin`; a custom object `weights_only` refuses to unpickle) and running
out of memory stay the replay's failure (inconclusive: the precision is blamed), never a mark. A
data verdict then re-enters the framework from the same checkpoint through its own resume,
which restores everything else (schedules, RNG, loops)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mpjob_trainer.checkpoint.manifest import FRAMEWORK, CorruptCheckpoint

#: What the Hugging Face Trainer names its weights and optimizer state in a checkpoint.
HF_WEIGHTS, HF_OPTIMIZER = "model.safetensors", "optimizer.pt"
#: What the Lightning adapter names Lightning's checkpoint inside the mpjob checkpoint.
LIGHTNING_CHECKPOINT = "lightning.ckpt"


def hf_weights(model: nn.Module, folder: Path) -> None:
    """The weights of the Trainer's checkpoint `folder` into `model`, read as the replay reads them
    (CorruptCheckpoint when the file does not load, before `model` is touched)."""
    from safetensors.torch import load_file  # the Trainer's own dependency

    device = _device(model)
    _weights_into(model, folder, _read(folder, HF_WEIGHTS, lambda path: load_file(path, device=str(device))))


def _weights_into(model: nn.Module, folder: Path, weights: dict[str, torch.Tensor]) -> None:
    unexpected = model.load_state_dict(weights, strict=False).unexpected_keys
    if unexpected:  # missing keys are tied weights the file holds once
        raise ValueError(f"{folder / HF_WEIGHTS} holds weights the model has not: {unexpected[:5]}")


def hf_reader(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Path], None]:
    """The replay's reading of a Trainer checkpoint folder into `model` and `optimizer` (see above)."""

    def read(folder: Path) -> None:
        from safetensors.torch import load_file

        device = _device(model)
        weights = _read(folder, HF_WEIGHTS, lambda path: load_file(path, device=str(device)))
        state = _read(folder, HF_OPTIMIZER, lambda path: _torch_load(path, device))
        _weights_into(model, folder, weights)
        optimizer.load_state_dict(state)

    return read


def lightning_weights(module: nn.Module, folder: Path, load: Callable[[Path], Any]) -> None:
    """The weights of the Lightning checkpoint in `folder` into `module`, the file read by `load`
    (as fit reads it: the strategy's) by the replay's rule: CorruptCheckpoint when it does not load,
    or holds no `state_dict` of weights, before `module` is touched."""
    saved = _read(folder, LIGHTNING_CHECKPOINT, load)
    weights = saved.get("state_dict") if isinstance(saved, dict) else None
    if not isinstance(weights, dict):
        raise CorruptCheckpoint(f"{folder.parent.name}: {FRAMEWORK}/{LIGHTNING_CHECKPOINT} holds no state_dict")
    module.load_state_dict(weights)


def lightning_reader(module: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Path], None]:
    """The replay's reading of the Lightning checkpoint in `folder` into `module` and `optimizer`."""

    def read(folder: Path) -> None:
        saved = _read(folder, LIGHTNING_CHECKPOINT, lambda path: _torch_load(path, _device(module)))
        module.load_state_dict(saved["state_dict"])
        optimizer.load_state_dict(saved["optimizer_states"][0])

    return read


def _torch_load(path: Path, device: torch.device) -> Any:
    return torch.load(path, map_location=device, weights_only=True)


def _read(folder: Path, name: str, load: Callable[[Path], Any]) -> Any:
    """`load` of the file `name` of the framework checkpoint `folder`: CorruptCheckpoint when its
    loader fails on it (the model and optimizer untouched); no such file, a custom object and out
    of memory raise as they are (a checkpoint of another form, the replay's own failure)."""
    try:
        return load(folder / name)
    except (FileNotFoundError, pickle.UnpicklingError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as exc:
        raise CorruptCheckpoint(f"{folder.parent.name}: cannot load {FRAMEWORK}/{name} ({exc!r})") from exc


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device
