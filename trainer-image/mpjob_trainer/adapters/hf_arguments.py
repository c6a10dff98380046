"""The attempt as the Hugging Face Trainer's `TrainingArguments`, and a script's own checked.

`training_arguments(run, **kwargs)` builds them: the attempt's precision, steps and seed (the script
may not pass them); the spec's micro-batch and accumulation
(adapters.spec_settings: a script's own must be the job's or the attempt's, the attempt's trains;
`auto_find_batch_size`, the Trainer's own micro-batch, is refused, as is `ignore_data_skip`: the
data at a step must not depend on where an attempt resumed);
the spec's learning rate, weight decay, warm-up and clip norm as defaults the script may override,
and no saves of the Trainer's own unless the script asks for them (`save_strategy`, with
`load_best_model_at_end`...): those are its output, written to its `output_dir`, which must not be
mpjob's checkpoint folder (adapters.own_saves); mpjob's checkpoints are the only ones resumed from.
`train` checks a Trainer built from the script's own `TrainingArguments` by the same rules and
tells the script on stderr where its learning rate, weight decay, warm-up or clip norm are not
the spec's (transformers' defaults, learning_rate 5e-5, unless the script set them): they train.
It says so once a run, in its first attempt's rank 0 (a retry or fallback would repeat it), and
not for what the script gave `training_arguments`: the documented override.
"""

from __future__ import annotations

import sys
import weakref
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import SaveStrategy

from mpjob_trainer import speed
from mpjob_trainer.adapters.mixed import framework_precision
from mpjob_trainer.adapters.own_saves import outside_store
from mpjob_trainer.adapters.spec_settings import attempt_shape, spec_name
from mpjob_trainer.data import data_workers
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session

#: The Trainer's micro-batch and accumulation -> the spec.training fields that are the job's.
SHAPE = {"per_device_train_batch_size": "batch_size", "gradient_accumulation_steps": "grad_accumulation"}
#: The Trainer's optimizer settings -> the spec.training fields training_arguments takes them from.
OPTIMIZER = {
    "learning_rate": "learning_rate",
    "weight_decay": "weight_decay",
    "warmup_steps": "warmup_steps",
    "max_grad_norm": "grad_clip_norm",
}

#: The Trainer's switches that would break what an attempt holds to, refused (`check`), and why.
REFUSED = {
    # It halves the micro-batch on an out-of-memory with the same accumulation, and on resume takes
    # the checkpoint's micro-batch (its trainer state's train_batch_size) over the attempt's split.
    "auto_find_batch_size": (
        "the Trainer would halve its micro-batch after an out-of-memory with the same accumulation (fewer "
        "samples per step than the job's) and, resuming, train the checkpoint's micro-batch instead of this "
        "attempt's; the operator splits spec.training.batchSize itself after an out-of-memory, keeping the "
        "samples per step"
    ),
    # Resuming mid-epoch, the Trainer would start the epoch's data from its first batch: the data at a
    # step would depend on where the attempt resumed, and a quarantined step (guard.onBadData skip,
    # named by its global step) would skip another batch than the bad one, which trains again.
    "ignore_data_skip": (
        "a resumed attempt would train the epoch's first batches again instead of the ones after its "
        "checkpoint's step (the data at a step must not depend on where an attempt resumed: a retry, a "
        "fallback and a skipped bad batch resume from mpjob's checkpoints)"
    ),
}


#: The optimizer settings of each TrainingArguments `training_arguments` built, by the arguments'
#: id while they live: the spec's or the script's override, which `tell_unlike_spec` leaves untold.
_BUILT: dict[int, dict[str, Any]] = {}


def _remember(args: TrainingArguments) -> TrainingArguments:
    _BUILT[id(args)] = {k: getattr(args, k) for k in OPTIMIZER}
    weakref.finalize(args, _BUILT.pop, id(args), None)
    return args


def attempt_arguments(run: Session) -> dict[str, Any]:
    """What the attempt decides, whatever the script asks for."""
    mixed = framework_precision(run.precision)
    return {
        "fp16": mixed == "fp16",
        "bf16": mixed == "bf16",
        "max_steps": run.total_steps,
        "seed": run.spec.training.seed,
        "use_cpu": run.device.type == "cpu",
    }


def training_arguments(run: Session, **kwargs: Any) -> TrainingArguments:
    """TrainingArguments for this attempt; `kwargs` are the script's other settings."""
    owned = attempt_arguments(run)
    clash = sorted(set(kwargs) & {*owned, "num_train_epochs"})  # max_steps trains past or short of any epochs
    if clash:
        raise ConfigError(
            f"training_arguments({', '.join(clash)}=...): set by the attempt (precision, spec.training.steps "
            "and seed); change the job's spec instead"
        )
    shape = attempt_shape(run, kwargs, SHAPE, "training_arguments")
    tr = run.spec.training
    defaults = {
        "output_dir": str(Path(run.launch.checkpoint_dir) / ".hf-output"),  # nothing is written there unless saving
        "save_strategy": "no",  # the Trainer's own saves: the script's output, when it asks for them
        "learning_rate": tr.learning_rate,
        "weight_decay": tr.weight_decay,
        "warmup_steps": tr.warmup_steps,
        "max_grad_norm": tr.grad_clip_norm or 0.0,
        "logging_steps": tr.log_every,
        "report_to": [],
        "disable_tqdm": True,
        # The trainer's speed settings (mpjob_trainer.speed): the Trainer compiles with them too.
        "torch_compile": speed.prepare_compile(tr.compile, run.device),
        "dataloader_num_workers": data_workers(tr.data_workers, run.device),
        "dataloader_pin_memory": run.device.type == "cuda",
    }
    try:
        return _remember(TrainingArguments(**{**defaults, **kwargs, **shape, **owned}))
    except ValueError as refused:  # the script's arguments, as transformers checks them: not worth a retry
        raise ConfigError(f"training_arguments(...): TrainingArguments refused them: {refused}") from refused


def check(run: Session, args: TrainingArguments) -> None:
    """Other arguments would train past the attempt's steps, break what it holds to (`REFUSED`: a
    micro-batch of their own, data that depends on where it resumed), or save the Trainer's own
    checkpoints into mpjob's checkpoint folder."""
    if args.max_steps != run.total_steps:
        raise ConfigError(
            f"the Trainer's TrainingArguments disagree with the attempt ({run.total_steps} steps): "
            f"{{'max_steps': {args.max_steps}}}; build them with mpjob_trainer.adapters.hf.training_arguments(run, ...)"
        )
    refused = next((name for name in REFUSED if getattr(args, name)), None)
    if refused is not None:
        raise ConfigError(f"TrainingArguments({refused}=True): {REFUSED[refused]}; leave {refused} off")
    if args.save_strategy != SaveStrategy.NO:
        outside_store(run, str(args.output_dir), "TrainingArguments(output_dir)")


def follow_attempt_shape(run: Session, trainer: Trainer) -> None:
    """The Trainer trains in the attempt's micro-batch and accumulation: its arguments' own must be
    the job's or the attempt's (adapters.spec_settings), and the attempt's are set. transformers
    reads both at `train()`: the accumulation from the arguments, the micro-batch from the
    Trainer's `_train_batch_size`, taken from the arguments in its `__init__` (its own
    auto_find_batch_size sets it so)."""
    args = trainer.args
    shape = attempt_shape(run, {k: getattr(args, k) for k in SHAPE}, SHAPE, "TrainingArguments")
    if all(getattr(args, k) == v for k, v in shape.items()):
        return
    for setting, value in shape.items():
        setattr(args, setting, value)
    trainer._train_batch_size = args.train_batch_size


def tell_unlike_spec(run: Session, args: TrainingArguments) -> None:
    """Tell the script (stderr, its worker log) where its learning rate, weight decay, warm-up or clip
    norm are not the spec's: the Trainer trains with its arguments' own. Once a run (its first
    attempt, rank 0), and not for the values the script gave `training_arguments`."""
    if run.launch.attempt != 0 or run.world.rank != 0:
        return
    tr, given = run.spec.training, _BUILT.get(id(args), {})
    unlike = {k: (getattr(args, k), getattr(tr, f)) for k, f in OPTIMIZER.items() if given.get(k) != getattr(args, k)}
    unlike = {k: (mine, spec) for k, (mine, spec) in unlike.items() if float(mine or 0) != float(spec or 0)}
    if unlike:
        mine = ", ".join(f"{k}={v[0]!r}" for k, v in unlike.items())
        spec = ", ".join(f"{spec_name(OPTIMIZER[k])}={v[1]!r}" for k, v in unlike.items())
        print(
            f"mpjob: the Trainer's TrainingArguments({mine}) are not the spec's ({spec}): it trains with the "
            "arguments' own (mpjob_trainer.adapters.hf.training_arguments(run, ...) takes the spec's)",
            file=sys.stderr,
            flush=True,
        )
