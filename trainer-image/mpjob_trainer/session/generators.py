"""The random generators a training step may draw from: captured into a checkpoint, checked
before anything is loaded from one, and put back.

A checkpoint's `rng` holds torch's CPU generator, one state per CUDA device the writing process
saw, Python's and (when numpy is there) numpy's. A process that sees fewer CUDA devices than
the one that wrote it (a job resumed on a smaller node) gets the states of the devices it has,
by index: the others have no device to draw on here, and what was left is told on stderr; one
that sees more keeps the generators of the rest as they are.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

try:  # numpy is the user's, not a dependency of ours: its generator is kept when it is there
    import numpy as np
except ImportError:  # pragma: no cover - torch runs without numpy
    np = None  # type: ignore[assignment]


def rng_state() -> dict[str, Any]:
    """Every generator a training step may draw from, in a weights_only-safe form."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": list(random.getstate()),
    }
    if np is not None:
        np_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
        state["numpy"] = [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]
    return state


def rng_problem(rng: Any) -> str | None:
    """What makes a checkpoint's `rng` unusable (None: nothing): generators not as `rng_state`
    captures them. A weights-only pickle may hold any plain value there."""
    like = torch.get_rng_state()
    if not isinstance(rng, dict) or not isinstance(torch_rng := rng.get("torch"), torch.Tensor):
        return "holds no generator state (rng) as the trainer writes it"
    if torch_rng.dtype != like.dtype or torch_rng.shape != like.shape:
        found, wanted = f"{torch_rng.dtype} {list(torch_rng.shape)}", f"{like.dtype} {list(like.shape)}"
        return f"holds a torch generator state of {found}, not {wanted}"
    cuda = rng.get("cuda") or []
    if not isinstance(cuda, list) or not all(_byte_state(s) for s in cuda):
        return "holds no CUDA generator states as torch.cuda.get_rng_state_all() gives them"
    if _python_state(rng.get("python")) is None:
        return "holds no Python generator state as random.getstate() gives it"
    if np is not None and "numpy" in rng and _numpy_state(rng["numpy"]) is None:
        return "holds no numpy generator state as numpy.random.get_state() gives it"
    return None


def _byte_state(value: Any) -> bool:
    """Is `value` a generator state as torch keeps one (a 1-D uint8 tensor)?"""
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1


def _python_state(value: Any) -> tuple[Any, ...] | None:
    """`value` (rng_state's python entry) as random.setstate takes it; None when a scratch
    generator does not take it (of another size, not integers)."""
    try:
        state = (value[0], tuple(value[1]), value[2])
        random.Random().setstate(state)
    except Exception:
        return None
    return state


def _numpy_state(value: Any) -> tuple[Any, ...] | None:
    """`value` (rng_state's numpy entry) as numpy.random.set_state takes it; None when a scratch
    generator does not take it."""
    try:
        name, keys, *rest = value
        state = (name, keys.numpy().astype(np.uint32), *rest)
        np.random.RandomState().set_state(state)
    except Exception:
        return None
    return state


def cuda_states_for(states: list[torch.Tensor], devices: int) -> tuple[list[torch.Tensor], int]:
    """The CUDA generator states to put back on a process that sees `devices` CUDA devices: those
    of devices 0..devices-1, and how many were left (their devices are not there)."""
    kept = states[:devices]
    return kept, len(states) - len(kept)


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what `rng_state` captured (rng_problem has checked it)."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        kept, left = cuda_states_for(state["cuda"], torch.cuda.device_count())
        torch.cuda.set_rng_state_all(kept)
        if left:
            print(
                f"mpjob: the checkpoint holds the generators of {len(state['cuda'])} CUDA devices and this process "
                f"sees {len(kept)}: those of the other {left} are left (no device here draws from them)",
                file=sys.stderr,
            )
    python = _python_state(state["python"])
    assert python is not None, "rng_problem checks it before a restore"
    random.setstate(python)
    if np is not None and "numpy" in state:
        numpy_state = _numpy_state(state["numpy"])
        assert numpy_state is not None, "rng_problem checks it before a restore"
        np.random.set_state(numpy_state)


def seed_everything(seed: int) -> None:
    """Same initial weights on every rank, and the same draws in every run of the job."""
    torch.manual_seed(seed)
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
