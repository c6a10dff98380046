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
which restores everything else (schedules, RNG, loops).

What is read is held to the rules the SDK's own restore holds its checkpoints to, by the same
functions, all of it before the model or the optimizer is touched: each weight a tensor (else
CorruptCheckpoint) of this run's module's names and shapes (else a ConfigError: the model changed;
a Trainer's weights file holds tied weights once) and dtypes (checkpoint.dtypes), its modules able
to take back their extra states (checkpoint.extra_state), the optimizer state one an optimizer
writes that agrees with the checkpoint's weights (else CorruptCheckpoint) and another
configuration's than this run's optimizer (another kind of optimizer, other settings) a ConfigError
(checkpoint.optimizer_state). The optimizer then loads first, with this run's implementation flags
(session.fits.load_fitting: what torch's load or the kind's own state refuses is a ConfigError),
the model last. Messages name the checkpoint, its file and the field."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from mpjob_trainer.checkpoint.dtypes import check_module_dtypes
from mpjob_trainer.checkpoint.extra_state import check_extra_states
from mpjob_trainer.checkpoint.manifest import FRAMEWORK, CorruptCheckpoint
from mpjob_trainer.checkpoint.optimizer_state import check_current, is_optimizer_state
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.fits import load_fitting
from mpjob_trainer.session.state import state_kind_problem

#: What the Hugging Face Trainer names its weights and optimizer state in a checkpoint.
HF_WEIGHTS, HF_OPTIMIZER = "model.safetensors", "optimizer.pt"
#: What the Lightning adapter names Lightning's checkpoint inside the mpjob checkpoint.
LIGHTNING_CHECKPOINT = "lightning.ckpt"
#: The fields of a Lightning checkpoint the replay reads: its module's weights, its optimizers' states.
WEIGHTS, OPTIMIZERS = "state_dict", "optimizer_states"
#: Where a Lightning checkpoint holds its callbacks' states, by each one's `state_key`, and its
#: loops' progress (the fit loop's under FIT_LOOP).
CALLBACKS, LOOPS, FIT_LOOP = "callbacks", "loops", "fit_loop"


def hf_weights(model: nn.Module, folder: Path) -> None:
    """The weights of the Trainer's checkpoint `folder` into `model`, read and checked as the
    replay reads them (see above), before `model` is touched."""
    weights = _hf_read_weights(model, folder)
    model.load_state_dict(weights, strict=False)  # checked: what is missing is tied to what is there


def hf_reader(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Path], None]:
    """The replay's reading of a Trainer checkpoint folder into `model` and `optimizer` (see above)."""

    def read(folder: Path) -> None:
        weights = _hf_read_weights(model, folder)
        state = _read(folder, HF_OPTIMIZER, lambda path: _torch_load(path, _device(model)))
        where = _where(folder, HF_OPTIMIZER)
        _check_optimizer({"model": weights, "optimizer": state}, {"model": model, "optimizer": optimizer}, where)
        load_fitting(optimizer, state, f"{where}'s 'optimizer'", type(optimizer).__name__)
        model.load_state_dict(weights, strict=False)

    return read


def _hf_read_weights(model: nn.Module, folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file  # the Trainer's own dependency

    device = _device(model)
    weights = _read(folder, HF_WEIGHTS, lambda path: load_file(path, device=str(device)))
    check_weights(model, weights, _where(folder, HF_WEIGHTS), "model", tied=True)
    return weights


class Loadable(Protocol):
    """What takes back a state of its own (a Lightning callback, its fit loop)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class Restorable(Loadable, Protocol):
    """A Lightning callback as its resume restores it: its state under `state_key`."""

    @property
    def state_key(self) -> str: ...


def lightning_finished(
    module: nn.Module,
    callbacks: Sequence[Restorable],
    folder: Path,
    load: Callable[[Path], Any],
    fit_loop: Loadable | None = None,
) -> None:
    """A finished fit's Lightning checkpoint in `folder` into `module`, the Trainer's `callbacks`
    and its `fit_loop`, as after that fit: the weights (checked by the replay's rule, above), each
    callback's state under its `state_key` (a ModelCheckpoint's best model, an EarlyStopping's
    count) and the loop's progress (`global_step`, `current_epoch`), as Lightning's resume restores
    them; all of it checked before anything is touched."""
    saved = _read(folder, LIGHTNING_CHECKPOINT, load)
    where = _where(folder, LIGHTNING_CHECKPOINT)
    weights = _field(saved, WEIGHTS, where)
    check_weights(module, weights, where, WEIGHTS, tied=False)
    states: list[tuple[Loadable, Any]] = [*_callback_states(saved, callbacks, where)]
    if fit_loop is not None and (progress := _fit_loop_state(saved, where)) is not None:
        states.append((fit_loop, progress))
    module.load_state_dict(weights)
    for restored, state in states:
        restored.load_state_dict(copy.deepcopy(state))


def _fit_loop_state(saved: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The fit loop's state in the checkpoint `saved` (None: it holds no loops), a mapping; else
    CorruptCheckpoint naming the field."""
    if LOOPS not in saved:
        return None
    return _mapping(_field(saved, LOOPS, where).get(FIT_LOOP), f"{LOOPS}[{FIT_LOOP!r}]", where)


def _callback_states(
    saved: dict[str, Any], callbacks: Sequence[Restorable], where: str
) -> list[tuple[Restorable, dict[str, Any]]]:
    """Each of `callbacks` with its state in the checkpoint `saved` (none there: left as it is, as
    Lightning leaves it), each a mapping; else CorruptCheckpoint naming the field."""
    held = _field(saved, CALLBACKS, where) if CALLBACKS in saved else {}
    return [
        (callback, _mapping(held[callback.state_key], f"{CALLBACKS}[{callback.state_key[:100]!r}]", where))
        for callback in callbacks
        if held.get(callback.state_key)
    ]


def _mapping(state: Any, field: str, where: str) -> dict[str, Any]:
    """`state`, read from the field `field` of the file `where`, when it is a mapping; else
    CorruptCheckpoint naming the field."""
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{where}: its {field} holds a {type(state).__name__}, where a dict is written")
    return state


def lightning_reader(module: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Path], None]:
    """The replay's reading of the Lightning checkpoint in `folder` into `module` and `optimizer`."""

    def read(folder: Path) -> None:
        where = _where(folder, LIGHTNING_CHECKPOINT)
        saved = _read(folder, LIGHTNING_CHECKPOINT, lambda path: _torch_load(path, _device(module)))
        weights, states = _field(saved, WEIGHTS, where), _field(saved, OPTIMIZERS, where, list)
        if len(states) != 1:
            problem = f"{where}: its {OPTIMIZERS} holds {len(states)} optimizer states where this run has 1 optimizer"
            if not states:
                raise CorruptCheckpoint(problem)
            raise ConfigError(f"{problem}: it was written by another configuration; start afresh in a new folder")
        check_weights(module, weights, where, WEIGHTS, tied=False)
        name = f"{OPTIMIZERS}[0]"
        _check_optimizer({WEIGHTS: weights, name: states[0]}, {WEIGHTS: module, name: optimizer}, where)
        load_fitting(optimizer, states[0], f"{where}'s {name}", type(optimizer).__name__)
        module.load_state_dict(weights)

    return read


def _field(saved: Any, key: str, where: str, kind: type = dict) -> Any:
    """What the checkpoint `saved` (of the file `where`) holds under `key`, when it is a `kind`;
    else CorruptCheckpoint naming the field."""
    held = saved.get(key) if isinstance(saved, dict) else None
    if not isinstance(held, kind):
        what = f"a {type(held).__name__}" if isinstance(saved, dict) and key in saved else "nothing"
        raise CorruptCheckpoint(f"{where}: holds {what} under {key!r}, where a {kind.__name__} is written")
    return held


def check_weights(module: nn.Module, weights: dict[Any, Any], where: str, name: str, *, tied: bool) -> None:
    """The weights read from the file `where` (its field `name`) fit this run's `module` (see
    above), or the error saying why; `tied`: a weight tied to one that is there may be missing."""
    live = module.state_dict()
    odd = next((key for key, value in weights.items() if not _tensor_where(live, key, value)), None)
    if odd is not None:
        raise CorruptCheckpoint(f"{where}: its {name} holds a {type(weights[odd]).__name__} under {str(odd)[:100]!r}")
    there = {value.data_ptr() for key, value in live.items() if key in weights and isinstance(value, torch.Tensor)}
    missing = [key for key, value in live.items() if key not in weights and not (tied and _tied(value, there))]
    unexpected = [key for key in weights if key not in live]
    resized = [key for key, value in live.items() if key in weights and _shape(value) != _shape(weights[key])]
    if missing or unexpected or resized:
        raise ConfigError(f"{where}: its {name} {_unlike(live, weights, missing, unexpected, resized)}")
    check_module_dtypes({name: weights}, {name: module}, where)  # checkpoint.dtypes' rule
    check_extra_states(module, name)


def _unlike(
    live: dict[str, Any], weights: dict[str, Any], missing: list[str], unexpected: list[str], resized: list[str]
) -> str:
    """How weights read differ from this run's module's `live` ones, and what to do."""
    if resized:
        key = resized[0]
        found = f"has {key[:100]!r} of shape {_shape(weights[key])} where this run's model has {_shape(live[key])}"
    elif missing:
        found = f"lacks {', '.join(key[:100] for key in missing[:5])} of this run's model"
    else:
        found = f"holds {', '.join(key[:100] for key in unexpected[:5])}, which this run's model has not"
    advice = "build it as that run did, or start afresh in a new checkpoint folder"
    return f"{found}: the model changed since it was written; {advice}"


def _tensor_where(live: dict[str, Any], key: Any, value: Any) -> bool:
    """Is `value`, read under `key`, a weight's entry: a name, and a tensor where the run's is one?"""
    return isinstance(key, str) and (isinstance(value, torch.Tensor) or not isinstance(live.get(key), torch.Tensor))


def _tied(value: Any, there: set[int]) -> bool:
    return isinstance(value, torch.Tensor) and value.data_ptr() in there


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _check_optimizer(state: dict[str, Any], objects: dict[str, Any], where: str) -> None:
    """The optimizer state in `state` (read from `where`) by checkpoint.optimizer_state's rule, as
    the SDK's restore checks its own: CorruptCheckpoint or a ConfigError, saying why."""
    if (problem := state_kind_problem(state, objects)) is not None:
        raise CorruptCheckpoint(f"{where}: {problem}")
    name, saved = next((key, value) for key, value in state.items() if isinstance(objects[key], torch.optim.Optimizer))
    if not is_optimizer_state(saved):
        raise CorruptCheckpoint(f"{where}: its {name} holds no optimizer state (no state or param_groups)")
    check_current(state, objects, where)


def _torch_load(path: Path, device: torch.device) -> Any:
    return torch.load(path, map_location=device, weights_only=True)


def _where(folder: Path, name: str) -> str:
    """How messages name the file `name` of the framework checkpoint `folder`."""
    return f"{folder.parent.name}: {FRAMEWORK}/{name}"


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
