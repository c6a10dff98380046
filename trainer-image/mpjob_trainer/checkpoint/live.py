"""LiveStateDicts: the DCP state dicts of a sharded model and its optimizer, at every save for
the price of `state_dict()`.

torch's `get_state_dict` gives what a sharded checkpoint holds: this rank's shards under
canonical names (no activation-checkpoint wrapper or compiler prefix in a key; the
optimizer's state under parameter names instead of positions), references only. It finds
those names by walking the model for every key, every time: at 8 blocks about 1.5 ms of the
training thread per save, most of what a sharded save holds it, while `model.state_dict()`
and `optimizer.state_dict()` take about 0.1 ms. The names do not change during a run, so the
first call asks torch and learns them, and later calls rename the plain state dicts.

The learnt renaming is used only after it has reproduced torch's answer at that first call
(same keys in the same order, the same tensors, the same other values); otherwise, and while
the optimizer holds no state yet (torch's call initialises it), every call is torch's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpjob_trainer.checkpoint.state_steps import state_dict_steps
from mpjob_trainer.distributed import is_dtensor

#: Name parts torch leaves out of a canonical key (torch.compile's and checkpoint_wrapper's).
WRAPPER_PARTS = ("_orig_mod", "_checkpoint_wrapped_module")


def canonical(key: str) -> str:
    """`key` without the wrapper parts."""
    return ".".join(part for part in key.split(".") if part not in WRAPPER_PARTS)


class LiveStateDicts:
    """get_state_dict(model, [optimizer]) for one model and at most one optimizer (see above)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizer = optimizer
        #: Parameter names by position in the optimizer's groups, once learnt and checked.
        self._names: list[str] | None = None
        self._learnt = False

    def __call__(self) -> tuple[Any, Any]:
        if self._learnt and (self.optimizer is None or self.optimizer.state):
            return self._renamed()
        from torch.distributed.checkpoint.state_dict import get_state_dict

        with state_dict_steps():  # it steps an optimizer that holds no state yet
            model_sd, optim_sd = get_state_dict(self.model, [self.optimizer] if self.optimizer is not None else [])
        if not self._learnt and self._names is None:
            groups: list[dict[str, Any]] = optim_sd.get("param_groups", [])  # type: ignore[assignment]
            self._names = [name for group in groups for name in group["params"]]
            self._learnt = identical((model_sd, optim_sd), self._renamed())
            self._names = self._names if self._learnt else []
        return model_sd, optim_sd

    @property
    def renaming(self) -> bool:
        """Are saves served by the learnt renaming (not torch's walk)?"""
        return self._learnt

    def _renamed(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The plain state dicts under torch's names, in torch's order (renamed keys last)."""
        raw = self.model.state_dict()
        model_sd = {key: value for key, value in raw.items() if canonical(key) == key}
        model_sd.update({canonical(key): value for key, value in raw.items() if canonical(key) != key})
        if self.optimizer is None:
            return model_sd, {}
        names = self._names or []
        osd = self.optimizer.state_dict()
        groups = [{**group, "params": [names[pid] for pid in group["params"]]} for group in osd["param_groups"]]
        return model_sd, {"state": {names[pid]: value for pid, value in osd["state"].items()}, "param_groups": groups}


def identical(a: Any, b: Any) -> bool:
    """The same structure, keys in the same order, the same tensors (storage, shape, dtype)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        x, y = (t.to_local() if is_dtensor(t) else t for t in (a, b))
        return (x.data_ptr(), x.shape, x.dtype, type(a)) == (y.data_ptr(), y.shape, y.dtype, type(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) if type(a) is type(b) else False
