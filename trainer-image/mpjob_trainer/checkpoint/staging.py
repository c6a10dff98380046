"""Private host copies of a training state, for a checkpoint written while training goes on.

`snapshot` copies now (blocking), for a synchronous write; `StagingBuffers` fills reusable
(pinned, for CUDA) buffers without waiting for the device, and `Staged.ready()` is where the
writer thread, not the training thread, waits for the copies to land.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

#: Values a snapshot may share with the state it copies.
IMMUTABLE = (int, float, str, bytes, bool, type(None))


def snapshot(obj: Any) -> Any:
    """A private CPU copy of a (nested) state dict, made now (blocking; fresh tensors each call).
    For a synchronous write; the periodic checkpoints stage into reusable buffers instead."""
    if isinstance(obj, IMMUTABLE):  # the generators' states are hundreds of ints: no deepcopy each
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
    return copy.deepcopy(obj)


@dataclass
class Staged:
    """A state dict staged in host memory. Its tensors may still be filling from CUDA:
    `ready()` blocks until they have (one event per device), and must return before reading."""

    state: dict[str, Any]
    events: list[torch.cuda.Event] = field(default_factory=list)

    def ready(self) -> None:
        for event in self.events:
            event.synchronize()


class StagingBuffers:
    """Reusable host copies of a state dict's tensors, so that a checkpoint costs the training
    thread no more than issuing the copies.

    Each tensor has one buffer, keyed by its place in the state dict (("optimizer", "state", 3,
    "exp_avg")), allocated at the first save and refilled by every later one; a tensor whose
    shape, dtype or device kind changed gets a new buffer, and a place no longer in the state
    drops its own. Buffers of CUDA tensors are pinned, so `copy_(src, non_blocking=True)` is a
    true asynchronous device-to-host copy: nothing waits for it on the host. Pinned memory is
    page-locked for the life of the run (one copy of the state, like the snapshot it replaces,
    but kept); CPU tensors get ordinary memory and their copy is synchronous anyway.

    Why the copies read the values of this step although training goes on at once: a copy is
    enqueued on the current stream of its tensor's device, behind every kernel of the steps
    already launched and ahead of every kernel launched later (the next optimizer update
    included), and a stream runs its work in order. So the copy sees the weights as they are
    when `stage` is called, not as they will be. An event recorded on each device's current
    stream after the copies marks their end; `Staged.ready()` waits for those events in the
    writer thread, never on the training thread. (A temporary source tensor freed right
    after staging is safe too: the caching allocator reuses its memory only for work queued
    later on the same stream.) Code that updates weights on another stream must order that
    stream after the current one, which PyTorch requires of it anyway.

    A buffer may be refilled only when the write that read it has finished: the caller waits
    for the previous save before staging the next (Checkpointer does). Values that are not
    tensors are deep-copied, so training mutating them later cannot change what is written.

    Pinned memory is slow to allocate (page-locking: on an H200 the first save of GPT-2 124M's
    1.5 GB of weights and AdamW state held the training thread 1.47 s, later saves only the
    copies' issue), so `reserve` allocates a state's buffers ahead in a background thread, and
    `stage` waits for that thread only if it has not finished.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], tuple[torch.Tensor, bool]] = {}
        self._used: set[tuple[Any, ...]] = set()
        self._devices: set[torch.device] = set()
        self._reserving: threading.Thread | None = None

    def reserve(self, state: dict[str, Any]) -> None:
        """Allocate, in a background thread, the buffers `stage(state)` would (nothing is copied;
        only the tensors' shapes, dtypes and devices are read, here)."""
        self.reserved()
        layout = [
            (place, tensor.shape, tensor.dtype, tensor.device.type == "cuda") for place, tensor in _tensors(state, ())
        ]
        self._reserving = threading.Thread(target=self._allocate, args=(layout,), name="staging-reserve", daemon=True)
        self._reserving.start()

    def reserved(self) -> None:
        """Wait for a reservation still allocating (stage calls this first)."""
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None

    def _allocate(self, layout: list[tuple[tuple[Any, ...], torch.Size, torch.dtype, bool]]) -> None:
        for place, shape, dtype, pinned in layout:
            self._held(place, shape, dtype, pinned)

    def stage(self, state: dict[str, Any]) -> Staged:
        """Copy `state` into the buffers (device copies issued, not awaited)."""
        self.reserved()
        self._used, self._devices = set(), set()
        staged = self._copy(state, ())
        for stale in self._buffers.keys() - self._used:
            del self._buffers[stale]
        events = [_copies_done(device) for device in sorted(self._devices, key=str)]
        return Staged(staged, events)

    def buffer(self, place: tuple[Any, ...]) -> torch.Tensor | None:
        """The buffer of the tensor at `place` (None when there is none)."""
        held = self._buffers.get(place)
        return held[0] if held is not None else None

    def _copy(self, obj: Any, place: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), place)
        if isinstance(obj, dict):
            return {k: self._copy(v, (*place, k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v, (*place, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self._copy(v, (*place, i)) for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _tensor(self, tensor: torch.Tensor, place: tuple[Any, ...]) -> torch.Tensor:
        if not _stageable(tensor):
            return tensor.to("cpu", copy=True)  # sparse, or another backend: a plain blocking copy
        pinned = tensor.device.type == "cuda"
        held = self._held(place, tensor.shape, tensor.dtype, pinned)
        held.copy_(tensor, non_blocking=True)
        self._used.add(place)
        if pinned:
            self._devices.add(tensor.device)
        return held

    def _held(self, place: tuple[Any, ...], shape: torch.Size, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        """The buffer at `place`, allocated anew unless the one there has this shape, dtype and pinning."""
        held = self._buffers.get(place)
        if held is None or held[1] != pinned or held[0].shape != shape or held[0].dtype != dtype:
            held = (torch.empty(shape, dtype=dtype, pin_memory=pinned), pinned)
            self._buffers[place] = held
        return held[0]


def _stageable(tensor: torch.Tensor) -> bool:
    """A dense CPU or CUDA tensor: one `stage` copies into a reusable buffer."""
    return tensor.layout == torch.strided and tensor.device.type in ("cpu", "cuda")


def _tensors(obj: Any, place: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """The stageable tensors of a (nested) state, with their places, as `stage` walks them."""
    if isinstance(obj, torch.Tensor):
        if _stageable(obj):
            yield place, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, (*place, k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _tensors(v, (*place, i))


def _copies_done(device: torch.device) -> torch.cuda.Event:
    """An event on `device`'s current stream, behind the copies just issued there."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
