"""The Hugging Face Trainer's step and evaluation, as the session runs them itself (fp32 replay,
quality gate; adapters.replaying).

A replayed step must compute the loss training computed, and the Trainer computes it in
`compute_loss`: it takes the labels for a `compute_loss_func` or its label smoother
(`label_smoothing_factor`), hands the model `num_items_in_batch`, multiplies by the processes
that average tokens, and a subclass may override all of it. So the adapter does not compute a
loss of its own: `TrainerLoss` keeps each training micro-batch's `compute_loss` call
(its inputs as the Trainer passed them, before `compute_loss` takes the labels out), and the
step makes the Trainer's own `compute_loss` call again, under the session's autocast, then
scales for gradient accumulation as `Trainer.training_step` does (`scaled_for_accumulation`).
The quality gate measures that loss too (`TrainerLoss.evaluated`): a model may compute none
itself (a `compute_loss_func` does, from its outputs and the labels), or not the one trained on.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from transformers import Trainer
from transformers.trainer_pt_utils import find_batch_size

from mpjob_trainer.adapters.accelerated import class_forward
from mpjob_trainer.adapters.reload import hf_reader
from mpjob_trainer.adapters.replaying import FrameworkWeights, RecordedSteps, weights_finite
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session


@dataclass(frozen=True)
class LossCall:
    """One training micro-batch's `compute_loss(model, inputs, *args, **kwargs)` call, as made."""

    inputs: dict[str, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def scaled_for_accumulation(trainer: Trainer, num_items_in_batch: Any) -> bool:
    """Whether `compute_loss` returned a loss already normalised over the whole step, as
    `Trainer.training_step` decides it (else it divides the loss by the step's micro-batches)."""
    if trainer.loss_is_scaled_for_ga is not None:
        return trainer.loss_is_scaled_for_ga
    given_items = trainer.model_accepts_loss_kwargs and num_items_in_batch is not None
    return bool(given_items or trainer.compute_loss_func is not None)


def loss_samples(trainer: Trainer, inputs: dict[str, Any], num_items_in_batch: Any) -> int | None:
    """The samples that weigh a micro-batch's loss in the job's (mpjob_trainer.job_loss): its
    batch's, unless the Trainer normalised the loss over every rank's items (a model given
    `num_items_in_batch` under `average_tokens_across_devices`; `compute_loss` then multiplies it
    by the processes): that loss is its rank's share of the job's already, and ranks weigh alike."""
    args = trainer.args
    across = args.average_tokens_across_devices and (trainer.model_accepts_loss_kwargs or trainer.compute_loss_func)
    return None if across and num_items_in_batch is not None else find_batch_size(inputs) or None


def loss_in(result: Any) -> Any:
    """The loss of a `compute_loss` result (a tuple of the loss and the outputs when it was called
    with `return_outputs=True`)."""
    return result[0] if isinstance(result, tuple) else result


class TrainerLoss:
    """The Trainer's `compute_loss` (a subclass's override included): each training call is
    recorded under the Trainer's global step, and the session's step makes it again. The
    Trainer calls the instance attribute this sets; its evaluation's calls (a model in eval
    mode) are no step's, nor are the quality gate's (`evaluated`: not through the attribute)."""

    def __init__(self, trainer: Trainer, recorded: RecordedSteps) -> None:
        self.trainer, self.recorded = trainer, recorded
        self.compute_loss = trainer.compute_loss
        trainer.compute_loss = self.recording  # type: ignore[method-assign]

    def recording(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """`Trainer.compute_loss`, recorded (a copy of `inputs`: it pops the labels from them)."""
        if model.training:
            self.recorded.add(self.trainer.state.global_step, LossCall(dict(inputs), args, dict(kwargs)))
        return self.compute_loss(model, inputs, *args, **kwargs)

    def again(self, call: LossCall, micro_batches: int) -> Any:
        """The loss `call` computed, for backward as `Trainer.training_step` scales it; through the
        Trainer's wrapper (DDP's gradient sync as in training)."""
        loss = loss_in(self.compute_loss(self.trainer.model_wrapped, dict(call.inputs), *call.args, **call.kwargs))
        items = call.kwargs.get("num_items_in_batch")  # the Trainer passes it by keyword
        return loss if scaled_for_accumulation(self.trainer, items) else loss / micro_batches

    def evaluated(self, inputs: dict[str, Any]) -> float:
        """The Trainer's `compute_loss` of evaluation batch `inputs` (model in eval mode), never
        recorded. Normalised over the batch's own items, counted as the Trainer's evaluation counts
        them (`num_items_in_batch`; a `compute_loss_func` may divide by it): a per-batch mean."""
        model = self.trainer.model
        assert model is not None
        _, items = self.trainer.get_batch_samples(iter([inputs]), 1, self.trainer.args.device)
        loss = loss_in(self.compute_loss(model, dict(inputs), num_items_in_batch=items))
        return float(loss.mean())  # several GPUs in one process (DataParallel): a loss each


def register(run: Session, trainer: Trainer, trainer_loss: TrainerLoss) -> None:
    """Give the session the Trainer's step (fp32 replay) and evaluation (quality gate). Not in an
    `auto` attempt: accelerate fixes the precision when the Trainer is built, before any batch."""
    model, optimizer = trainer.model, getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    assert model is not None and optimizer is not None
    clip, recorded = trainer.args.max_grad_norm, trainer_loss.recorded

    def step(index: int) -> None:
        calls = recorded.batches(index)
        weights_finite(model)
        optimizer.zero_grad(set_to_none=True)  # the faulting step's gradients may still be there
        with recorded.paused(), class_forward(model):
            for call in calls:
                with run.autocast():
                    loss = trainer_loss.again(call, len(calls))
                items = call.kwargs.get("num_items_in_batch")
                run.backward(loss, samples=loss_samples(trainer, call.inputs, items))  # as training weighs it
            run.step(optimizer, clip_norm=clip or None)

    if run.launch.precision != "auto":
        run.register_step(step, weights=FrameworkWeights(model, hf_reader(model, optimizer), run.checkpoints.store))
    if run.spec.validation.every_steps:
        if trainer.eval_dataset is None:
            raise ConfigError("validation.everySteps is set but the Trainer has no eval_dataset")
        if isinstance(trainer.eval_dataset, dict):
            raise ConfigError(
                f"validation.everySteps is set but the Trainer's eval_dataset is a dict of eval sets "
                f"({', '.join(map(str, trainer.eval_dataset))}): the quality gate evaluates one; give the Trainer one"
            )
        run.evaluate_with(lambda: evaluate(run, trainer_loss))


def evaluate(run: Session, trainer_loss: TrainerLoss) -> float:
    """Mean loss over the first validation.batches batches of the Trainer's eval set, as training
    computes it (`TrainerLoss.evaluated`), under the session's autocast (the gate runs it in the
    attempt's precision and in fp32)."""
    trainer = trainer_loss.trainer
    model = trainer.model
    assert model is not None
    model.eval()
    try:
        losses = []
        with class_forward(model):
            for inputs in itertools.islice(trainer.get_eval_dataloader(), run.spec.validation.batches):
                with run.autocast():
                    losses.append(trainer_loss.evaluated(inputs))
    finally:
        model.train()
    return sum(losses) / max(1, len(losses))
