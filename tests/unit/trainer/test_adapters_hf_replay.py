"""The Hugging Face adapter's fp32 replay and quality gate compute the loss the way the Trainer
computes it in training: through the Trainer's own `compute_loss`, so a `compute_loss_func`, the
label smoother (`label_smoothing_factor`) and a subclass's `compute_loss` override all hold, with
the Trainer's scaling for gradient accumulation. A replayed step steps with the gradients training
stepped with; a replay of the model's own loss would step with others (or find no loss at all,
the labels being the Trainer's to take), and could not tell bad data from a precision's fault.
The gate gates the loss training optimizes, a per-batch mean as the Trainer's evaluation has it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback

from tests.unit.trainer.conftest import in_process_launch, parse, spec

pytestmark = pytest.mark.unit

VOCAB, TOKENS = 64, 8


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token rows; the last two labels of each row are masked (-100), as padding is."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(i))
        labels = ids.clone()
        labels[-2:] = -100
        return {"input_ids": ids, "labels": labels}


def tiny_gpt2() -> GPT2LMHeadModel:
    """A one-block GPT-2 from its config, random weights, no dropout (the steps are deterministic)."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=TOKENS, n_embd=16, n_layer=1, n_head=2)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    return GPT2LMHeadModel(config)


def z_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """A `compute_loss_func`: next-token cross entropy plus a z-loss on the logits, over the step's items."""
    logits, targets = outputs.logits[:, :-1].float(), labels[:, 1:]
    kept = targets != -100
    token_loss = torch.nn.functional.cross_entropy(logits[kept], targets[kept], reduction="sum")
    return (token_loss + 0.1 * torch.logsumexp(logits[kept], -1).pow(2).sum()) / num_items_in_batch


class Penalised(Trainer):
    """A Trainer whose `compute_loss` adds an L2 penalty on the weights to the model's loss."""

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch=num_items_in_batch)
        loss = loss + 0.1 * sum(p.pow(2).sum() for p in model.parameters())
        return (loss, outputs) if return_outputs else loss


class Gradients(TrainerCallback):
    """Each optimizer step's gradients, as the optimizer steps with them."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        inner = getattr(kw["optimizer"], "optimizer", kw["optimizer"])
        params = [p for group in inner.param_groups for p in group["params"]]
        inner.register_step_pre_hook(lambda *_: self.seen.append(torch.cat([p.grad.flatten() for p in params])))


#: How each Trainer computes its loss: its class and what it is built with besides the model and arguments.
LOSSES: dict[str, tuple[type[Trainer], dict[str, Any], dict[str, Any]]] = {
    "compute_loss_func": (Trainer, {"compute_loss_func": z_loss}, {}),
    "label_smoothing_factor": (Trainer, {}, {"label_smoothing_factor": 0.2}),
    "compute_loss override": (Penalised, {}, {}),
}


@pytest.mark.parametrize("how", sorted(LOSSES))
def test_the_hf_replay_steps_with_the_gradients_of_the_trainers_own_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    trainer_class, built_with, arguments = LOSSES[how]
    training = {"steps": 3, "batchSize": 4, "gradAccumulation": 2, "learningRate": 1e-12, "gradClipNorm": 0}
    job = spec(task={"command": ["python", "train.py"]}, training=training)  # the weights stay where they were
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        args = mpjob_hf.training_arguments(run, dataloader_num_workers=0, **arguments)
        gradients = Gradients()
        trainer = trainer_class(
            model=tiny_gpt2(), args=args, train_dataset=Tokens(), callbacks=[gradients], **built_with
        )
        mpjob_hf.train(run, trainer)
        trained = gradients.seen[-1]
        run.run_step(run.total_steps - 1)  # the last step again, as the fp32 replay runs it
        replayed = gradients.seen[-1]
    finally:
        run.close()
    assert len(gradients.seen) == run.total_steps + 1
    torch.testing.assert_close(replayed, trained, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("how", sorted(LOSSES))
def test_the_hf_quality_gate_measures_the_trainers_own_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """The gate's eval loss at the last step is the one the Trainer's own evaluation computes
    at the same weights (every eval batch full: its sample mean is the gate's batch mean)."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    trainer_class, built_with, arguments = LOSSES[how]
    training = {"steps": 4, "batchSize": 4, "learningRate": 1e-3}
    validation = {"everySteps": 4, "batches": 4}
    job = spec(task={"command": ["python", "train.py"]}, training=training, validation=validation)
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        args = mpjob_hf.training_arguments(run, dataloader_num_workers=0, per_device_eval_batch_size=4, **arguments)
        eval_set = torch.utils.data.Subset(Tokens(), range(16))
        trainer = trainer_class(
            model=tiny_gpt2(), args=args, train_dataset=Tokens(), eval_dataset=eval_set, **built_with
        )
        mpjob_hf.train(run, trainer)
        trainers = trainer.evaluate()["eval_loss"]
    finally:
        run.close()
    gated = [e for e in parse(capsys.readouterr().out) if e["event"] == "eval"]
    assert [e["step"] for e in gated] == [4]
    assert gated[0]["loss"] == pytest.approx(trainers, rel=1e-5)
