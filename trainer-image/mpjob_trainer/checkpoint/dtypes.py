"""A checkpoint's tensors are loaded only in the dtype they were written in, one rule for both
formats (torch's copy_ would cast any dtype silently: a complex value loses its imaginary part):
- a tensor the checkpoint says is of another dtype than this run's tensor of that name (DCP's
  index, checked against the run by checkpoint.dcp_fit; a single file's tensor itself, by
  `check_module_dtypes` and checkpoint.optimizer_state) is the run's setup: the script builds
  its model, or keeps its optimizer's state, in another dtype than the run that wrote it. Both are
  hashed against the manifest, so damage is caught before; a consistent statement of another
  dtype is what that run held. A ConfigError naming the tensor and both dtypes (`dtype_problem`);
- a shard's tensor of another dtype than its own index says (checkpoint.dcp_reader) is the
  checkpoint disagreeing with itself: CorruptCheckpoint, passed over for the one before it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpjob_trainer.errors import ConfigError


def check_dtype(where: str, name: str, read: Any, live: torch.dtype) -> None:
    """A ConfigError when the checkpoint `where` says its tensor `name` is of the dtype `read`,
    another than this run's `live` one (the rule above)."""
    if read != live:
        raise ConfigError(
            f"{where}: its {name} is {read} where this run's is {live}: the script builds it in another dtype than "
            f"the run that wrote it; build it in {read} as that run did, or start afresh in a new checkpoint folder"
        )


def check_module_dtypes(state: dict[str, Any], objects: dict[str, Any], where: str) -> None:
    """Each tensor a single file's `state` holds for a module among `objects` is of the dtype of
    the module's own tensor of that name (`check_dtype`); other keys are left to torch's load."""
    for name, module in objects.items():
        held = state.get(name)
        if not isinstance(module, nn.Module) or not isinstance(held, dict):
            continue
        for key, live in module.state_dict().items():
            read = held.get(key)
            if isinstance(live, torch.Tensor) and isinstance(read, torch.Tensor):
                check_dtype(where, f"{name}.{key}", read.dtype, live.dtype)
