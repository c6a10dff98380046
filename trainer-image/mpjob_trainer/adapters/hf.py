"""Hugging Face `transformers.Trainer` as a mpjob attempt (extra `mpjob-trainer[hf]`).

    from transformers import Trainer
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    with mpjob.start() as run:
        args = mpjob_hf.training_arguments(run, output_dir="out", warmup_steps=10)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        mpjob_hf.train(run, trainer)

`training_arguments` turns the attempt into TrainingArguments (adapters.hf_arguments: fp16/bf16 from its precision,
fp8 as bf16 around the float8 linears (adapters.mixed), max_steps, seed, the attempt's micro-batch and accumulation,
the spec's learning rate, weight decay, warm-up and clip norm; no saving of its own unless the script asks). The
Trainer's own saves (`save_strategy`, `load_best_model_at_end`) are the script's output, in its `output_dir`, which
must not be mpjob's checkpoint folder (adapters.own_saves); never resumed from. A Trainer whose micro-batch or
accumulation is neither the job's nor the attempt's is refused, as are its own micro-batch search
(`auto_find_batch_size`: the operator splits the micro-batch after an out-of-memory) and `ignore_data_skip`
(a resume trains on from its step's data); its own fp16/bf16
give way to the attempt's precision (adapters.accelerated), and its own learning rate, weight decay, warm-up
or clip norm train: both are told on stderr.
`train` gives the Trainer the attempt's GradScaler (the spec's loss-scale settings; on a CPU, where accelerate
runs no fp16 AMP and would train fp32 silently, it turns torch's CPU fp16 autocast on), keeps
spec.precision.keepFp32 modules in fp32, adds MpjobCallback and resumes through
`Trainer.train(resume_from_checkpoint=...)` from the attempt's checkpoint. The callback closes each optimizer
step in the session (guard, progress, checkpoint decision, SIGTERM) once the Trainer has logged, evaluated and
saved it (adapters.hf_tracking); a checkpoint is the Trainer's own `checkpoint-N` folder (weights, optimizer,
scheduler, scaler, RNG, trainer state: the best metric and best checkpoint of the Trainer's own saves, step N's
evaluation included, and the callbacks' states, an EarlyStoppingCallback's patience: all carried into the next
attempt), whole whatever the script's saving arguments say (`MPJOBS_SAVE`), adopted by mpjob's store. A retry
that finds the last step checkpointed, or the step the Trainer stopped early after (recorded: session.early_stop),
trains nothing: it leaves the Trainer as its train() would, that trainer state and the best model under
load_best_model_at_end.

The session runs the Trainer's step itself for the fp32 replay and the quality gate (adapters.hf_step): the
Trainer's `compute_loss` keeps the last steps' calls as the Trainer made them; the step makes them again (the
Trainer's own loss: its compute_loss_func, label smoother or a subclass's override) through the Trainer's wrapper
(`model_wrapped`: DDP's gradient sync as in training) under the session's autocast, with the class's own forward
(accelerate's autocast forward would override fp32), scales for accumulation as the Trainer does, and steps the
Trainer's optimizer; the gate evaluates the Trainer's eval set.

Bad data (guard.onBadData skip) and loss spikes (guard.spike): the session rolls its own state back and
RolledBack leaves `Trainer.train`; `train` calls it again from that checkpoint (transformers supports a second
`train()`: accelerate keeps what it prepared, the model's autocast forward included, and the optimizer,
scheduler, scaler and RNG are loaded from the checkpoint as in a new process). A quarantined step trains on
nothing (adapters.quarantined): the Trainer draws its batches as ever (its fast-forward on resume stays a
function of the global step), runs no forward, and the update it then makes from zero gradients is taken back.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import Trainer
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import SaveStrategy, TrainOutput
from transformers.utils import logging as hf_logging

from mpjob_trainer.adapters.accelerated import follow_attempt_precision, use_attempt_scaler
from mpjob_trainer.adapters.hf_arguments import (
    attempt_arguments,
    check,
    follow_attempt_shape,
    tell_unlike_spec,
    training_arguments,
)
from mpjob_trainer.adapters.hf_callback import MpjobCallback, steps_losses
from mpjob_trainer.adapters.hf_tracking import RESUMING, after_evaluation, load_best, read_last
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session
from mpjob_trainer.session.framework import FrameworkRun
from mpjob_trainer.session.outcomes import RolledBack

__all__ = ["MpjobCallback", "attempt_arguments", "resume_view", "steps_losses", "train", "training_arguments"]


#: What mpjob's checkpoint is, whatever the script's TrainingArguments say of the Trainer's own saves:
#: whole (the optimizer, scheduler and RNG an exact resume reads, also under save_only_model), not
#: pushed, rotated nor taken for the best model (the Trainer names a best checkpoint found in the
#: folder it saves into).
MPJOBS_SAVE = {
    "save_only_model": False,
    "save_strategy": SaveStrategy.NO,
    "push_to_hub": False,
    "save_total_limit": None,
}


def _writer(trainer: Trainer) -> Any:
    def write(staging: Path) -> Path:
        """The Trainer's own checkpoint (what `resume_from_checkpoint` reads), into `staging`."""
        with (
            _arguments(trainer.args, output_dir=str(staging), **MPJOBS_SAVE),
            _bars_off(bool(trainer.args.disable_tqdm)),
        ):
            trainer._save_checkpoint(trainer.model, trial=None)  # type: ignore[arg-type]
        return staging / f"checkpoint-{trainer.state.global_step}"

    return write


@contextmanager
def _arguments(args: Any, **values: Any) -> Iterator[None]:
    """In the block, the TrainingArguments `args` hold `values`; their own again after it."""
    own = {name: getattr(args, name) for name in values}
    for name, value in values.items():
        setattr(args, name, value)
    try:
        yield
    finally:
        for name, value in own.items():
            setattr(args, name, value)


@contextmanager
def _bars_off(off: bool) -> Iterator[None]:
    """No progress bars from transformers while `off` (the Trainer's `disable_tqdm`, which its
    `save_pretrained` does not read: it would print 'Writing model shards' at every checkpoint)."""
    if not off:
        yield
        return
    hook = hf_logging.set_tqdm_hook(None)

    def silent(factory: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        kwargs = {**kwargs, "disable": True}
        return hook(factory, args, kwargs) if hook is not None else factory(*args, **kwargs)

    hf_logging.set_tqdm_hook(silent)
    try:
        yield
    finally:
        hf_logging.set_tqdm_hook(hook)


@contextmanager
def resume_view(checkpoint: Path | None, precision: str, rank: int) -> Iterator[str | None]:
    """The checkpoint the Trainer resumes from, while it trains. After a fallback out of fp16 its
    GradScaler state must not come along (the scale starts afresh, as in every mpjob attempt), and
    transformers would load scaler.pt into a Trainer that has no scaler: it then reads a view of
    the checkpoint without that file (links: the adopted checkpoint is never changed), this rank's
    own (ranks on other pods may share a pid), removed when the Trainer is done with it."""
    if checkpoint is None or precision == "fp16" or not (checkpoint / "scaler.pt").exists():
        yield None if checkpoint is None else str(checkpoint)
        return
    view = checkpoint.parents[1] / f".tmp-resume-{rank}-{secrets.token_hex(6)}"  # a killed one's: clean_stale
    view.mkdir()
    try:
        for entry in checkpoint.iterdir():
            if entry.name != "scaler.pt":
                (view / entry.name).symlink_to(entry.resolve())
        yield str(view)
    finally:
        shutil.rmtree(view, ignore_errors=True)


def train(run: Session, trainer: Trainer, **train_kwargs: Any) -> Any:
    """Train the attempt with `trainer` from its checkpoint; returns Trainer.train's output. After
    a rollback of the data rung (RolledBack) the Trainer trains again from that checkpoint."""
    if "resume_from_checkpoint" in train_kwargs:
        raise ConfigError("train(resume_from_checkpoint=...): the attempt names the checkpoint to resume from")
    check(run, trainer.args)
    owned = attempt_arguments(run)
    follow_attempt_precision(trainer, run.precision, fp16=owned["fp16"], bf16=owned["bf16"])
    follow_attempt_shape(run, trainer)
    tell_unlike_spec(run, trainer.args)
    model = trainer.model
    if model is None:
        raise ConfigError("the Trainer has no model (model_init is not supported: build the model first)")
    bridge = FrameworkRun(run)
    bridge.checkpoint_with(_writer(trainer), model)
    use_attempt_scaler(bridge, trainer.accelerator)
    run.keep_fp32(model)
    for noisy in (PrinterCallback, ProgressCallback):  # the session's step lines are the progress
        trainer.remove_callback(noisy)
    callback = MpjobCallback(bridge, trainer)
    trainer.add_callback(callback)
    steps_losses(trainer, callback)
    after_evaluation(trainer, callback.close_step)
    point = bridge.resume()
    if point.done:  # Trainer.train at max_steps would still train one step past it
        bridge.read_last(point, read_last(trainer))  # trained, as after train()
        load_best(trainer)
        return TrainOutput(point.step, 0.0, {})  # what it returns for a run that trains no step
    checkpoint = point.framework_checkpoint
    while True:
        try:
            with (
                resume_view(checkpoint, run.precision, run.world.rank) as resume_from,
                _arguments(trainer.args, **(RESUMING if resume_from else {})),
            ):
                return trainer.train(resume_from_checkpoint=resume_from, **train_kwargs)
        except RolledBack as back:
            checkpoint = bridge.reentry(back)  # Trainer.train again: accelerate wraps nothing twice
