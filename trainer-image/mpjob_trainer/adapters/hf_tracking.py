"""The Hugging Face Trainer's best-model tracking through mpjob's checkpoints and resumes.

The Trainer tracks its best model (TrainerState best_metric, best_global_step,
best_model_checkpoint) and an EarlyStoppingCallback its patience counter when it evaluates, in
`_maybe_log_save_evaluate`, which it calls right after the step's `on_step_end`. mpjob's
checkpoint of step N is written after it (`after_evaluation`): the session closes the step
there, so the trainer state it holds has seen step N's evaluation, which a resume from step N
never runs again (the guard's verdict on step N follows that evaluation and the Trainer's own
save of N too: a faulting step's own save, in the script's output_dir, may hold its non-finite
weights; the next attempt trains and saves that step again). An attempt resuming from mpjob's
checkpoint restores the callbacks' states the Trainer saved in it (`RESUMING`: transformers'
`restore_callback_states_from_checkpoint` is off by default, and an EarlyStoppingCallback would
count its patience from 0 again). A retry that finds the last step checkpointed trains nothing;
`read_last` and `load_best` then leave the Trainer as its `train()` would have: the checkpoint's
trainer state, and the best model's weights under `load_best_model_at_end` (the script's own
save, in its output_dir: where that folder is gone, as on a new pod's disk, the last weights
stay, told on stderr, as the Trainer itself does). A best model's checkpoint that a trainer state
read from a checkpoint names outside output_dir is never followed (`best_inside`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState

from mpjob_trainer.adapters.reload import HF_WEIGHTS, hf_weights
from mpjob_trainer.checkpoint.manifest import FRAMEWORK, CorruptCheckpoint

#: What the Trainer's arguments say while it resumes from mpjob's checkpoint.
RESUMING = {"restore_callback_states_from_checkpoint": True}


def after_evaluation(trainer: Trainer, close: Callable[[], None]) -> None:
    """`close` (the step the callback's `on_step_end` left open, if any) runs after the Trainer's
    logging, evaluation and own save of the step (an instance attribute now)."""
    original = trainer._maybe_log_save_evaluate

    def maybe_log_save_evaluate(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        close()

    trainer._maybe_log_save_evaluate = maybe_log_save_evaluate  # type: ignore[method-assign]


def epoch_ends(state: TrainerState, control: Any) -> bool:
    """Does the Trainer leave its epoch after the step it just logged, evaluated and saved (the
    epoch's last step, or a stop)? Then it calls on_epoch_end and `_maybe_log_save_evaluate` once
    more, where an epoch's evaluation and save (`eval_strategy="epoch"`) happen: the step closes there."""
    last = state.epoch is not None and float(state.epoch).is_integer()
    return bool(last or control.should_epoch_stop or control.should_training_stop)


def read_state(folder: Path) -> TrainerState:
    """The trainer state in the Trainer's checkpoint `folder`, checked: a JSON object of
    TrainerState's fields, its best-model fields of their kinds; else CorruptCheckpoint."""
    where = f"{folder.parent.name}: {FRAMEWORK}/{TRAINER_STATE_NAME}"
    try:
        saved = json.loads((folder / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpoint(f"{where}: cannot be read as JSON ({exc})") from exc
    known = {field.name for field in fields(TrainerState)}
    if not isinstance(saved, dict) or not set(saved) <= known:
        odd = sorted(set(saved) - known)[:5] if isinstance(saved, dict) else type(saved).__name__
        raise CorruptCheckpoint(f"{where}: holds {odd}, not the Trainer's state fields")
    kinds = {"best_model_checkpoint": (str,), "best_metric": (int, float), "best_global_step": (int,)}
    for name, kind in kinds.items():
        value = saved.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise CorruptCheckpoint(f"{where}: its {name} is a {type(value).__name__}, not {kind[0].__name__}")
    return TrainerState(**saved)


def best_inside(state: TrainerState, output_dir: str | None) -> None:
    """Drop the best model's checkpoint `state` names (as if none were recorded) unless it lies
    inside the Trainer's `output_dir`, links and `..` resolved, told on stderr. The Trainer's own
    saves are there; a checkpoint read from a store is not trusted, and load_best_model_at_end
    would load weights from wherever it points. Every trainer state read from a checkpoint comes
    through here: `read_last`'s, and the one `Trainer.train` reads itself (MpjobCallback)."""
    best = state.best_model_checkpoint
    if best is None:
        return
    try:  # TrainingArguments make output_dir a folder's name; None is only its type's
        inside = output_dir is not None and Path(best).resolve().is_relative_to(Path(output_dir).resolve())
    except (OSError, RuntimeError, TypeError, ValueError):  # a NUL, a link loop, not a name: no folder of its
        inside = False
    if not inside:
        print(
            f"mpjob: load_best_model_at_end: the checkpoint's trainer state names {str(best)[:200]!r} as the best "
            f"model's checkpoint, outside output_dir {output_dir}: not followed",
            file=sys.stderr,
        )
        state.best_model_checkpoint = None


def read_last(trainer: Trainer) -> Callable[[Path], None]:
    """The reading of the Trainer's checkpoint of the last step into the Trainer, as after its
    `train()`: the weights and the trainer state, both checked before either is taken (the
    best model's checkpoint it names followed only inside output_dir: `best_inside`)."""

    def read(folder: Path) -> None:
        state = read_state(folder)
        best_inside(state, trainer.args.output_dir)
        assert trainer.model is not None
        hf_weights(trainer.model, folder)
        trainer.state = state

    return read


def load_best(trainer: Trainer) -> None:
    """Under load_best_model_at_end, the best model's weights into the Trainer's model, as its
    `train()` ends (see above); nothing without it or with no best model."""
    best = trainer.state.best_model_checkpoint
    if not trainer.args.load_best_model_at_end or best is None:
        return
    model = trainer.model
    assert model is not None
    if not (Path(best) / HF_WEIGHTS).is_file():
        print(
            f"mpjob: load_best_model_at_end: the best model's checkpoint {best} (step "
            f"{trainer.state.best_global_step}) is gone; the model keeps the last step's weights",
            file=sys.stderr,
        )
        return
    hf_weights(model, Path(best))
