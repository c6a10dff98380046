"""adapters.reload: what the fp32 replay makes of a framework checkpoint it cannot read. A file
that is there and that its loader fails on (cut short: it passed its sha256 under a manifest
recomputed over it) is CorruptCheckpoint, the checkpoint's fault, read before the model is
touched; a sound checkpoint of another form (no such file, a custom object `weights_only`
refuses) raises as it is: the replay is inconclusive, the checkpoint never marked."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mpjob_trainer.adapters.reload import HF_OPTIMIZER, HF_WEIGHTS, LIGHTNING_CHECKPOINT, hf_reader, lightning_reader
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint

pytestmark = pytest.mark.unit


class Custom:
    """An object of the user's that `weights_only` will not unpickle."""


def _model() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters())


def _cut(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _lightning(folder: Path, extra: object = None) -> Path:
    model, optimizer = _model()
    folder.mkdir(parents=True)
    saved = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "extra": extra}
    torch.save(saved, folder / LIGHTNING_CHECKPOINT)
    return folder / LIGHTNING_CHECKPOINT


def _hf(folder: Path) -> None:
    model, optimizer = _model()
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / HF_WEIGHTS))
    torch.save(optimizer.state_dict(), folder / HF_OPTIMIZER)


def test_a_lightning_file_cut_short_is_the_checkpoints_fault_and_the_model_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "step-000000010" / "framework"
    _cut(_lightning(folder))
    model, optimizer = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CorruptCheckpoint, match=r"step-000000010: cannot load framework/lightning\.ckpt"):
        lightning_reader(model, optimizer)(folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("cut", [HF_WEIGHTS, HF_OPTIMIZER])
def test_a_trainer_file_cut_short_is_the_checkpoints_fault(tmp_path: Path, cut: str) -> None:
    folder = tmp_path / "step-000000010" / "framework"
    _hf(folder)
    _cut(folder / cut)
    with pytest.raises(CorruptCheckpoint, match=f"cannot load framework/{cut}"):
        hf_reader(*_model())(folder)


def test_sound_checkpoints_of_another_form_are_not_the_checkpoints_fault(tmp_path: Path) -> None:
    custom = tmp_path / "custom" / "framework"
    _lightning(custom, extra=Custom())
    with pytest.raises(pickle.UnpicklingError):
        lightning_reader(*_model())(custom)
    bin_weights = tmp_path / "bin" / "framework"
    _hf(bin_weights)
    (bin_weights / HF_WEIGHTS).rename(bin_weights / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError):
        hf_reader(*_model())(bin_weights)
    loaded, optimizer = _model()
    _hf(tmp_path / "sound" / "framework")
    hf_reader(loaded, optimizer)(tmp_path / "sound" / "framework")  # a sound one loads
