"""adapters.reload holds a framework's checkpoint to the SDK restore's rules before anything is
touched: checkpoints written by real Lightning (Trainer.save_checkpoint after a fitted step) and
real transformers (a tiny GPT-2, its output weights tied, saved as the Trainer saves them). A
checkpoint lacking a field is CorruptCheckpoint naming the file and the field (passed over for
the one before it); weights of another shape or dtype and another kind of optimizer are a
ConfigError naming them. Each leaves the model's weights as they were."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from mpjob_trainer.adapters.reload import (
    HF_OPTIMIZER,
    LIGHTNING_CHECKPOINT,
    hf_reader,
    hf_weights,
    lightning_finished,
    lightning_reader,
)
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.errors import ConfigError

pytestmark = pytest.mark.unit
LIGHTNING_FILE = r"step-000000010: framework/lightning\.ckpt"


class Tiny(L.LightningModule):
    def __init__(self, width: int = 4, optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW) -> None:
        super().__init__()
        self.layer, self.kind = torch.nn.Linear(width, 1), optimizer

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.kind(self.parameters(), lr=0.1)


def _lightning(tmp_path: Path, module: Tiny, *, weights_only: bool = False) -> Path:
    """The framework folder of a checkpoint of step 10 holding Lightning's checkpoint of `module`
    after one fitted step (its optimizer's state in it, unless `weights_only`)."""
    width, dtype = module.layer.in_features, module.layer.weight.dtype
    data = torch.utils.data.TensorDataset(torch.randn(8, width, dtype=dtype), torch.randn(8, dtype=dtype))
    settings: dict[str, Any] = {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, accelerator="cpu", **settings)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    folder = tmp_path / "step-000000010" / "framework"
    trainer.save_checkpoint(folder / LIGHTNING_CHECKPOINT, weights_only=weights_only)
    return folder


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in module.state_dict().items()}


def _untouched(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> bool:
    now = module.state_dict()
    return now.keys() == before.keys() and all(torch.equal(before[key], now[key]) for key in before)


def _read_lightning(folder: Path, module: Tiny, optimizer: torch.optim.Optimizer) -> None:
    lightning_reader(module, optimizer)(folder)


def test_a_sound_lightning_checkpoint_loads_its_weights_and_optimizer_state(tmp_path: Path) -> None:
    written = Tiny()
    folder = _lightning(tmp_path, written)
    module = Tiny()
    optimizer = module.configure_optimizers()
    _read_lightning(folder, module, optimizer)
    assert _untouched(module, _weights(written))
    assert [state["step"].item() for state in optimizer.state.values()] == [1.0, 1.0]


def test_a_lightning_checkpoint_without_optimizer_states_is_the_checkpoints_fault(tmp_path: Path) -> None:
    """Before: a KeyError ('optimizer_states') after the weights were loaded, the replay inconclusive."""
    folder = _lightning(tmp_path, Tiny(), weights_only=True)
    module = Tiny()
    before = _weights(module)
    with pytest.raises(CorruptCheckpoint, match=f"{LIGHTNING_FILE}: holds nothing under 'optimizer_states'"):
        _read_lightning(folder, module, module.configure_optimizers())
    assert _untouched(module, before)
    lightning_finished(
        module, [], folder, lambda path: torch.load(path, weights_only=True)
    )  # weights alone: it has them
    assert not _untouched(module, before)


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        (Tiny(width=6), r"its state_dict has 'layer\.weight' of shape \(1, 6\) where this run's model has \(1, 4\)"),
        (Tiny().double(), r"its state_dict\.layer\.weight is torch\.float64 where this run's is torch\.float32"),
        (Tiny(optimizer=torch.optim.SGD), r"its 'optimizer_states\[0\]' param group 0 lacks betas, eps"),
    ],
    ids=["shape", "dtype", "optimizer"],
)
def test_a_lightning_checkpoint_of_another_configuration_is_refused_before_the_model_is_touched(
    tmp_path: Path, written: Tiny, problem: str
) -> None:
    """Before: weights of another shape raised torch's error once the others had loaded; another
    dtype was cast silently; SGD's state loaded into AdamW, whose first step failed (KeyError)."""
    folder = _lightning(tmp_path, written)
    module = Tiny()
    optimizer = module.configure_optimizers()
    before = _weights(module)
    with pytest.raises(ConfigError, match=f"{LIGHTNING_FILE}: {problem}"):
        _read_lightning(folder, module, optimizer)
    assert _untouched(module, before) and not optimizer.state  # nothing loaded
    if written.kind is torch.optim.AdamW:  # the weights alone: the same rule
        with pytest.raises(ConfigError, match=f"{LIGHTNING_FILE}: {problem}"):
            lightning_finished(module, [], folder, lambda path: torch.load(path, weights_only=True))
        assert _untouched(module, before)


def _gpt(embd: int = 8) -> GPT2LMHeadModel:
    torch.manual_seed(embd)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=embd, vocab_size=16, n_positions=8, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _hf(tmp_path: Path, model: GPT2LMHeadModel, optimizer: Callable[..., torch.optim.Optimizer]) -> Path:
    """A Trainer checkpoint's files of `model` after one step of `optimizer`, as the Trainer writes them."""
    stepping = optimizer(model.parameters(), lr=0.1)
    ids = torch.randint(0, 16, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    stepping.step()
    folder = tmp_path / "step-000000010" / "framework"
    model.save_pretrained(folder, safe_serialization=True)  # the tied lm_head is written once
    torch.save(stepping.state_dict(), folder / HF_OPTIMIZER)
    return folder


def test_a_sound_trainer_checkpoint_loads_with_its_tied_weights(tmp_path: Path) -> None:
    written = _gpt()
    folder = _hf(tmp_path, written, torch.optim.AdamW)
    model = _gpt(embd=8)
    torch.nn.init.zeros_(model.transformer.wte.weight)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    hf_reader(model, optimizer)(folder)
    assert _untouched(model, _weights(written)) and model.lm_head.weight is model.transformer.wte.weight
    assert len(optimizer.state) == len(list(model.parameters()))


@pytest.mark.parametrize(
    ("written", "kind", "problem"),
    [
        (
            _gpt(embd=12),
            torch.optim.AdamW,
            r"model\.safetensors: its model has 'transformer\.wte\.weight' of shape \(16, 12\) "
            r"where this run's model has \(16, 8\)",
        ),
        (
            _gpt().double(),
            torch.optim.AdamW,
            r"model\.safetensors: its model\.transformer\.wte\.weight is torch\.float64 "
            r"where this run's is torch\.float32",
        ),
        (_gpt(), torch.optim.SGD, r"optimizer\.pt: its 'optimizer' param group 0 lacks betas, eps"),
    ],
    ids=["shape", "dtype", "optimizer"],
)
def test_a_trainer_checkpoint_of_another_configuration_is_refused_before_the_model_is_touched(
    tmp_path: Path, written: GPT2LMHeadModel, kind: Callable[..., torch.optim.Optimizer], problem: str
) -> None:
    """Before: the embeddings of another width raised torch's error once the others had loaded;
    float64 weights were cast silently; SGD's state loaded into AdamW, whose first step failed."""
    folder = _hf(tmp_path, written, kind)
    model = _gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = _weights(model)
    with pytest.raises(ConfigError, match=f"step-000000010: framework/{problem}"):
        hf_reader(model, optimizer)(folder)
    assert _untouched(model, before) and not optimizer.state
    if kind is torch.optim.AdamW:
        with pytest.raises(ConfigError, match=f"step-000000010: framework/{problem}"):
            hf_weights(model, folder)
        assert _untouched(model, before)


class TwoOptimizers(Tiny):
    """A module stepping two optimizers by hand, as Lightning's manual optimization does: its
    checkpoint's optimizer_states holds two states."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        loss = super().training_step(batch, index)
        self.manual_backward(loss)
        for optimizer in self.optimizers():
            optimizer.step()
            optimizer.zero_grad()
        return loss

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:  # type: ignore[override]
        return [torch.optim.AdamW([self.layer.weight], lr=0.1), torch.optim.AdamW([self.layer.bias], lr=0.1)]


def test_a_lightning_checkpoint_of_two_optimizers_is_another_configuration(tmp_path: Path) -> None:
    folder = _lightning(tmp_path, TwoOptimizers())
    module = Tiny()
    optimizer = module.configure_optimizers()
    before = _weights(module)
    problem = "its optimizer_states holds 2 optimizer states where this run has 1 optimizer: it was written by"
    with pytest.raises(ConfigError, match=f"{LIGHTNING_FILE}: {problem} another configuration; start afresh"):
        _read_lightning(folder, module, optimizer)
    assert _untouched(module, before) and not optimizer.state


def test_a_lightning_checkpoint_of_no_optimizer_state_is_the_checkpoints_fault(tmp_path: Path) -> None:
    """Its optimizer_states emptied after a real save: the file says it was fitted with nothing to step."""
    folder = _lightning(tmp_path, Tiny())
    saved = torch.load(folder / LIGHTNING_CHECKPOINT, weights_only=True)
    assert len(saved["optimizer_states"]) == 1  # as written: the one AdamW
    saved["optimizer_states"] = []
    torch.save(saved, folder / LIGHTNING_CHECKPOINT)
    module = Tiny()
    optimizer = module.configure_optimizers()
    before = _weights(module)
    problem = "its optimizer_states holds 0 optimizer states where this run has 1 optimizer$"
    with pytest.raises(CorruptCheckpoint, match=f"{LIGHTNING_FILE}: {problem}"):
        _read_lightning(folder, module, optimizer)
    assert _untouched(module, before) and not optimizer.state
