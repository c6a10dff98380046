"""The Hugging Face Trainer's step and evaluation, as the session runs them itself (fp32 replay,
quality gate; adapters.replaying)."""

from __future__ import annotations

import itertools

from transformers import Trainer

from mpjob_trainer.adapters.accelerated import class_forward, token_average_factor
from mpjob_trainer.adapters.reload import hf_reader
from mpjob_trainer.adapters.replaying import FrameworkWeights, RecordedSteps, loss_of, weights_finite
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session


def register(run: Session, trainer: Trainer, recorded: RecordedSteps) -> None:
    """Give the session the Trainer's step (fp32 replay) and evaluation (quality gate). Not in an
    `auto` attempt: accelerate fixes the precision when the Trainer is built, before any batch."""
    model, optimizer = trainer.model, getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    assert model is not None and optimizer is not None
    clip, processes = trainer.args.max_grad_norm, token_average_factor(trainer)

    def step(index: int) -> None:
        batches = recorded.batches(index)
        weights_finite(model.parameters())
        optimizer.zero_grad(set_to_none=True)  # the faulting step's gradients may still be there
        with recorded.paused(), class_forward(model):
            for inputs in batches:
                with run.autocast():
                    loss = loss_of(trainer.model_wrapped(**inputs))
                run.backward(loss * processes if "num_items_in_batch" in inputs else loss / len(batches))
            run.step(optimizer, clip_norm=clip or None)

    if run.launch.precision != "auto":
        run.register_step(step, weights=FrameworkWeights(model.parameters, hf_reader(model, optimizer)))
    if run.spec.validation.every_steps:
        if trainer.eval_dataset is None:
            raise ConfigError("validation.everySteps is set but the Trainer has no eval_dataset")
        run.evaluate_with(lambda: evaluate(run, trainer))


def evaluate(run: Session, trainer: Trainer) -> float:
    """Mean loss over the first validation.batches batches of the Trainer's eval set, under the
    session's autocast (the gate runs it in the attempt's precision and in fp32)."""
    model = trainer.model
    assert model is not None
    model.eval()
    try:
        losses = []
        with class_forward(model):
            for inputs in itertools.islice(trainer.get_eval_dataloader(), run.spec.validation.batches):
                with run.autocast():
                    losses.append(float(loss_of(model(**inputs))))
    finally:
        model.train()
    return sum(losses) / max(1, len(losses))
