"""The data order: a seeded permutation per epoch, positioned from an origin (step, samples).

Sample k of the global stream is permutation_e[k mod N] with e = k div N, and micro-batch m
of optimizer step s on rank r takes the `batch` samples starting at
k = origin.samples + (((s - origin.step) * accumulation + m) * world + r) * batch. The origin
is where the attempt resumed: its step and the samples all ranks had consumed by then (the
checkpoint's samples_seen). A run that started on one world size and resumed on another
(sharded checkpoints reshard) goes on with the very next sample of the same stream, although
its samples per step differ from those that led to the checkpoint; on an unchanged world the
origin is (step, step x P) and the position is the step's, as it always was.

Quarantined samples (mpjob_trainer.quarantine: bad data and loss spikes the session rolled back
from) are left out of the micro-batch they fall in; the rest of the order is unchanged, so a
run that quarantined a sample equals one whose data never had it in those places. A micro-batch
left empty is dropped from its step (a step left empty trains nothing). Under several processes
every rank still runs as many passes as the rank holding the most micro-batches
(`StepSampler.passes`): a rank left with fewer pads its step with passes that weigh nothing.

Optimizer step s covers the stream positions [s * P, (s + 1) * P) with P = accumulation x
world x batch, whatever the split of P: an attempt that halves `batch` and doubles
`accumulation` (a fallback to fp32, or after running out of GPU memory) trains on the same
samples per step, in the same order on one process (across ranks the same set per step).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from mpjob_trainer.quarantine import Quarantine


@dataclass(frozen=True)
class Origin:
    """Where the stream stands at optimizer step `step`: `samples` consumed by all ranks."""

    step: int = 0
    samples: int = 0


class StepSampler:
    def __init__(
        self,
        size: int,
        batch: int,
        accumulation: int,
        world: int,
        rank: int,
        seed: int,
        *,
        quarantine: Quarantine | None = None,
        origin: Origin = Origin(),
    ) -> None:
        if origin.step < 0 or origin.samples < 0:
            raise ValueError(f"the data origin must not be negative, got {origin}")
        self.origin = origin
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self.size = size
        self.batch = batch
        self.accumulation = accumulation
        self.world = world
        self.rank = rank
        self.seed = seed
        #: The permutations of the last two epochs drawn (a step's ranks may straddle an epoch's end).
        self._perms: dict[int, torch.Tensor] = {}

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {e: p for e, p in self._perms.items() if e == epoch - 1}
            self._perms[epoch] = torch.randperm(self.size, generator=gen)
        return self._perms[epoch]

    def indices(self, step: int, micro: int, rank: int | None = None) -> list[int]:
        """The samples of micro-batch `micro` of step `step` on this rank (or on `rank`), in order."""
        rank = self.rank if rank is None else rank
        local = (((step - self.origin.step) * self.accumulation + micro) * self.world + rank) * self.batch
        start = self.origin.samples + local
        out: list[int] = []
        k, stop = start, start + self.batch
        while k < stop:  # each epoch's part in one slice (`passes` reads every rank's samples each step)
            epoch, at = divmod(k, self.size)
            part = self._permutation(epoch)[at : at + stop - k].tolist()
            out.extend(part)
            k += len(part)
        return self.quarantine.keep(out) if len(self.quarantine) else out

    def micro_sizes(self, step: int) -> list[int]:
        """The samples of each micro-batch of step `step` that still holds any, in order."""
        return [size for micro in range(self.accumulation) if (size := len(self.indices(step, micro)))]

    def micro_count(self, step: int) -> int:
        """Micro-batches of step `step` that still hold samples."""
        return len(self.micro_sizes(step))

    def passes(self, step: int) -> int:
        """Forward and backward passes every rank runs in step `step`: as many as the rank with the
        most micro-batches still holding samples has (0 only when the quarantine left every rank's
        empty: then every rank skips the step alike).

        The ranks must agree: DDP all-reduces the gradients at the last pass, FSDP2 all-gathers at
        every forward and reduce-scatters at every backward, and a rank that ran fewer (a quarantined
        sample left it fewer micro-batches, or none) would leave its peers waiting in a collective
        until its timeout. Every rank knows every rank's samples (the order is a function of the
        step, the quarantine the same on all), so each finds the count by itself, without a collective."""
        if len(self.quarantine.samples) < self.batch:
            return self.accumulation  # too few quarantined to empty a micro-batch: no rank's samples read
        return max(self._held(step, rank) for rank in range(self.world))

    def _held(self, step: int, rank: int) -> int:
        return sum(1 for micro in range(self.accumulation) if self.indices(step, micro, rank))

    def filler(self, step: int) -> list[int]:
        """The samples of a pass that trains nothing (`passes`: a rank short of passes pads its step
        with them, their loss weighed by 0): this rank's first micro-batch of the step that holds any,
        else the first one of another rank (one holds samples whenever the step runs a pass)."""
        for rank in (self.rank, *range(self.world)):
            for micro in range(self.accumulation):
                if indices := self.indices(step, micro, rank):
                    return indices
        raise ValueError(f"every sample of step {step} is quarantined: the step runs no pass to pad")

    def step_indices(self, step: int) -> list[int]:
        """This rank's samples of optimizer step `step`, micro-batch by micro-batch."""
        return [i for micro in range(self.accumulation) for i in self.indices(step, micro)]


def micro_batch(dataset: Dataset[Any], sampler: StepSampler, step: int, micro: int) -> Any:
    return collate(dataset, sampler.indices(step, micro))


def collate(dataset: Dataset[Any], indices: list[int]) -> Any:
    return default_collate([dataset[i] for i in indices])


def is_namedtuple(value: Any) -> bool:
    """A namedtuple takes its fields by position, not as one iterable as a tuple does."""
    return isinstance(value, tuple) and hasattr(value, "_fields")


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if is_namedtuple(batch):
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def data_workers(configured: int | None, device: torch.device) -> int:
    """training.dataWorkers, or its default: 2 collating processes on CUDA (the device would
    wait for the host otherwise), none on CPU (they would take the cores the step runs on)."""
    if configured is not None:
        return configured
    return 2 if device.type == "cuda" else 0


class StepBatches(Sampler[list[int]]):
    """The micro-batches of optimizer steps [start, stop) in training order, as index lists
    (a DataLoader batch_sampler: the order stays StepSampler's, whoever collates)."""

    def __init__(self, sampler: StepSampler, start: int, stop: int) -> None:
        self.sampler, self.start, self.stop = sampler, start, stop

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.stop):
            for micro in range(self.sampler.accumulation):
                indices = self.sampler.indices(step, micro)
                if indices:
                    yield indices

    def __len__(self) -> int:
        return sum(self.sampler.micro_count(step) for step in range(self.start, self.stop))


def _ignore_sigterm(_: int) -> None:
    """DataLoader workers leave SIGTERM to the trainer, which checkpoints and then stops them
    (a worker that died of it first would turn a preemption into a crash)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class StepLoader:
    """Each optimizer step's micro-batches, collated ahead of the step by `workers` DataLoader
    processes (pinned when `pin`) while the device trains; the same tensors as micro_batch().

    The loader runs ahead over steps [start, stop). A step asked for out of that order (an
    `auto` attempt's measurement runs the first step more than once, an fp32 replay re-runs
    old ones) is collated in the training process instead, so every step sees its own samples.
    With no workers every step is collated in the training process.
    """

    def __init__(self, dataset: Dataset[Any], sampler: StepSampler, *, span: range, workers: int, pin: bool) -> None:
        self.dataset, self.sampler = dataset, sampler
        self._next, self._stop = span.start, span.stop
        self._workers, self._pin = workers, pin
        self._batches: Iterator[Any] | None = None
        self._start(span.start)

    @property
    def _stamp(self) -> tuple[int, int, int]:
        """What the collated batches depend on besides the order: the quarantine and the split."""
        return self.sampler.quarantine.version, self.sampler.batch, self.sampler.accumulation

    def _start(self, step: int) -> None:
        """Collate ahead from `step` on (again, when the quarantine or the split changed under the workers)."""
        self._batches, self._next, self._version = None, step, self._stamp
        if self._workers > 0 and step < self._stop:
            loader = DataLoader(
                self.dataset,
                batch_sampler=StepBatches(self.sampler, step, self._stop),
                num_workers=self._workers,
                pin_memory=self._pin,
                prefetch_factor=2,
                worker_init_fn=_ignore_sigterm,
            )
            self._batches = iter(loader)

    def micro_batches(self, step: int) -> list[Any]:
        """The micro-batches of optimizer step `step` that hold samples, in order."""
        if self._batches is not None and self._version != self._stamp and step >= self._next:
            self._start(step)
        if self._batches is not None and step == self._next and step < self._stop:
            self._next += 1
            return [next(self._batches) for _ in range(self.sampler.micro_count(step))]
        micros = range(self.sampler.accumulation)
        return [micro_batch(self.dataset, self.sampler, step, m) for m in micros if self.sampler.indices(step, m)]

    def passes(self, step: int) -> tuple[list[Any], list[int]]:
        """Every pass of optimizer step `step`, as many as on every rank (StepSampler.passes): the
        batches, and the samples each trains (0 for the passes that pad a rank short of micro-batches)."""
        batches, sizes = self.micro_batches(step), self.sampler.micro_sizes(step)
        padding = self.sampler.passes(step) - len(batches)
        if padding > 0:
            filler = collate(self.dataset, self.sampler.filler(step))
            batches, sizes = [*batches, *[filler] * padding], [*sizes, *[0] * padding]
        return batches, sizes

    def close(self) -> None:
        """Stop the workers (their iterator shuts them down when it is dropped)."""
        self._batches = None
