"""Whether an optimizer's just-loaded state is one its own kind wrote (`check_fits`).

torch's load_state_dict checks the group and parameter counts only: the state of another kind
of optimizer loads, and its first step fails (a KeyError, taken for an infrastructure failure
and retried). Two things are compared, both from torch's own answers, no table of optimizers:
- each param group holds every hyperparameter of this run's kind (its `defaults`, as built:
  SGD's state lacks AdamW's betas);
- each parameter's state holds every entry a step of this kind keeps under that group's
  settings (Adam's lacks Adamax's exp_inf): found by one step of a scratch optimizer of the
  same class, built with those settings, over one scratch parameter of the same dtype and
  device. A kind whose step cannot be taken so (LBFGS wants a closure) is not compared.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from mpjob_trainer.checkpoint.optimizer_settings import kept_run_flags
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.twins import module_twin, optimizer_twin


def check_loads(obj: Any, saved: Any, what: str, into: str) -> None:
    """What `load_fitting` would refuse, found on a meta twin of `obj` (session.twins) so that
    nothing of `obj` changes: a ConfigError naming both when `saved` does not fit; nothing when it
    fits, or when no twin can be made or the twin cannot tell (its own load checks it then)."""
    twin: torch.nn.Module | torch.optim.Optimizer | None = None
    if isinstance(obj, torch.nn.Module):
        twin = module_twin(obj)
    elif isinstance(obj, torch.optim.Optimizer):
        twin = optimizer_twin(obj)
    if twin is None:
        return
    try:
        if isinstance(twin, torch.nn.Module):  # not assign=True: torch writes it into `saved`'s own metadata
            with warnings.catch_warnings():  # "copying ... to a meta parameter ... is a no-op": as meant
                warnings.simplefilter("ignore", UserWarning)
                twin.load_state_dict(saved)
        else:
            twin.load_state_dict(kept_run_flags(saved, twin.param_groups))
            check_fits(twin, hyperparameters(obj), on=_device(obj))
    except Exception as exc:
        if mismatch(exc):
            raise _refusal(what, into, exc) from exc


def load_all(objects: dict[str, Any], state: dict[str, Any]) -> None:
    """Load each of `objects` its state under its name in `state`, all or nothing. Modules and
    optimizers are checked on meta twins first (`check_loads`); the others (LR schedulers,
    samplers, the script's own objects) have no twin, so they load first, each after a copy of its
    own state is kept, and when any load fails (theirs, or a module's or an optimizer's after them)
    those copies are loaded back before the error is raised: a refusal changes none of them."""
    for name, obj in objects.items():
        check_loads(obj, state[name], f"the checkpoint's {name!r}", name)
    others = {n: o for n, o in objects.items() if not isinstance(o, torch.nn.Module | torch.optim.Optimizer)}
    kept: dict[str, Any] = {}
    try:
        for name in [*others, *(n for n in objects if n not in others)]:
            if name in others:
                kept[name] = copy.deepcopy(others[name].state_dict())  # a checkpoint's: plain values, tensors
            load_fitting(objects[name], state[name], f"the checkpoint's {name!r}", name)
    except BaseException as exc:
        _put_back(objects, kept, exc)
        raise


def _put_back(objects: dict[str, Any], kept: dict[str, Any], exc: BaseException) -> None:
    """Load back the states `kept` of `objects` after `exc`; one that does not take its own state
    back is named on `exc` (it holds what its failed load left)."""
    for name, held in kept.items():
        try:
            objects[name].load_state_dict(held)
        except Exception as failed:
            exc.add_note(f"{name!r} did not take its own state back after the failed load ({failed!r})")


def _refusal(what: str, into: str, exc: BaseException) -> ConfigError:
    return ConfigError(f"cannot load {what} into this run's {into}: {exc}")


def _device(optimizer: torch.optim.Optimizer) -> torch.device | None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return params[0].device if params else None


def load_fitting(obj: Any, saved: Any, what: str, into: str) -> None:
    """Load `saved` (`what`: the checkpoint's state, as messages name it) into the run's `obj`
    (`into`: its name): an optimizer with this run's implementation flags
    (checkpoint.optimizer_settings.kept_run_flags) and then holding what its own kind keeps
    (`check_fits`). A state that does not fit (`mismatch`) is a ConfigError naming both; a failure
    to load (I/O, memory) raises as it is (an InfraError)."""
    defaults = hyperparameters(obj)  # as built: loading may add newer flags to its defaults
    try:
        obj.load_state_dict(
            kept_run_flags(saved, obj.param_groups) if isinstance(obj, torch.optim.Optimizer) else saved
        )
        check_fits(obj, defaults)
    except Exception as exc:
        if not mismatch(exc):
            raise
        raise _refusal(what, into, exc) from exc


def check_fits(obj: Any, defaults: Iterable[str], *, on: torch.device | None = None) -> None:
    """A ValueError naming what does not fit when `obj` is an optimizer whose just-loaded state
    another kind of optimizer wrote; `defaults`: its hyperparameters' names as the run built it;
    `on`: the device its kind's step is probed on (default: its parameters', not a twin's meta)."""
    if not isinstance(obj, torch.optim.Optimizer):
        return
    kind = type(obj).__name__
    advice = "build the optimizer the run that wrote it built, or start afresh in a new checkpoint folder"
    position = 0
    for index, group in enumerate(obj.param_groups):
        if lacking := sorted(set(defaults) - set(group)):
            held = ", ".join(sorted(set(group) - {"params"}))
            raise ValueError(
                f"its param group {index} holds no {', '.join(lacking)} (it holds {held}): another kind of "
                f"optimizer than this run's {kind} wrote it; {advice}"
            )
        needed = _kept(obj, group, on)
        for param in group["params"]:
            held_state = obj.state.get(param)
            if needed and held_state and (missing := sorted(needed - set(held_state))):
                raise ValueError(
                    f"its state for parameter {position} holds no {', '.join(missing)} (it holds "
                    f"{', '.join(sorted(held_state))}; a step of this run's {kind} keeps {', '.join(sorted(needed))}): "
                    f"another kind of optimizer wrote it; {advice}"
                )
            position += 1


def mismatch(exc: BaseException) -> bool:
    """Does `exc`, raised while a user object loads a checkpoint's state, say that state does not
    fit the object (a configuration error): torch's own RuntimeError of size mismatch, missing or
    unexpected keys, an optimizer's ValueError (group count, group sizes, `check_fits`), a state
    of another shape (KeyError, TypeError)? An optimizer state that disagrees with itself never
    gets here: it is CorruptCheckpoint before anything loads (checkpoint.optimizer_state). Anything
    else (an I/O error, memory, a CUDA error) is a failure to load, not a mismatch: an InfraError,
    retried."""
    if isinstance(exc, ValueError | KeyError | TypeError):
        return True
    return type(exc) is RuntimeError and str(exc).startswith("Error(s) in loading state_dict")


def hyperparameters(obj: Any) -> set[str]:
    """The hyperparameters an optimizer `obj`'s param groups hold (before a load: as the run built
    it; a load adds newer flags to its `defaults` that a group it loads may not hold)."""
    if not isinstance(obj, torch.optim.Optimizer):
        return set()
    return set(obj.defaults) & {key for group in obj.param_groups for key in group}


def _kept(obj: torch.optim.Optimizer, group: dict[str, Any], on: torch.device | None = None) -> set[str] | None:
    """The per-parameter state entries one step of `obj`'s kind keeps under `group`'s settings
    (None: a scratch step of its kind cannot be taken)."""
    if not group["params"]:
        return None
    like: torch.Tensor = group["params"][0]
    scratch = torch.zeros(1, dtype=like.dtype, device=on or like.device, requires_grad=True)
    accepted = inspect.signature(type(obj)).parameters
    anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    settings = {key: value for key, value in group.items() if key != "params" and (anything or key in accepted)}
    try:
        probe = type(obj)([scratch], **settings)
        scratch.grad = torch.zeros_like(scratch)
        probe.step()
    except Exception:
        return None
    return set(probe.state[scratch])
