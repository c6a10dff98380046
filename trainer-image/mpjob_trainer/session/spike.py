"""SpikeDetector: a finite loss far above its running window (precision.guard.spike).

Per step, on the device and without a host sync: the step's loss x is compared with the mean
m and standard deviation s of the last `window` accepted losses; x > m + zScore * s (once the
window is full) is a spike. A spike is not accepted into the window (so the spike does not
widen the deviation it is judged by), a finite loss that is not one is. The first and last
spiking step since the last rollback are kept as device scalars (torch.where, as the guard
keeps its first non-finite step).

They are read at the interval's one sync point: NumericGuard.read packs them into the same
all-reduce as its own counters (first: min over ranks, last: max), so detection costs no
extra host sync per step and no extra collective, and is seen at the next log, checkpoint or
evaluation step (not with a one-step lag). The cost per step is a handful of scalar kernels.

The window and its fill count are checkpointed (exact resume decides as a straight run does).
"""

from __future__ import annotations

from typing import Any

import torch

from mpjob_contract.skipping import SpikeSpec

#: "No spike seen": larger than any step index.
NONE = 2**62
#: A deviation floor relative to the mean, so a flat window (a loss stuck at a value) does not
#: make every rounding difference a spike.
RELATIVE_FLOOR = 1e-6


class SpikeDetector:
    def __init__(self, spec: SpikeSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        self.window = torch.zeros(spec.window, dtype=torch.float32, device=device)
        self.accepted = torch.zeros((), dtype=torch.int64, device=device)
        self.first = torch.full((), NONE, dtype=torch.int64, device=device)
        self.last = torch.full((), -1, dtype=torch.int64, device=device)

    def observe(self, loss: torch.Tensor, index: int) -> None:
        """Judge optimizer step `index` (0-based) by its loss; device ops only."""
        x = loss.detach().float().mean()
        size = self.spec.window
        var, mean = torch.var_mean(self.window)
        deviation = torch.maximum(var.sqrt(), mean.abs() * RELATIVE_FLOOR)
        finite = torch.isfinite(x)
        spike = finite & (self.accepted >= size) & (x - mean > self.spec.z_score * deviation)
        accept = finite & ~spike
        slot = (self.accepted % size).view(1)
        kept = torch.where(accept, x, self.window.index_select(0, slot).squeeze(0))
        self.window.index_copy_(0, slot, kept.view(1))
        self.accepted += accept.to(torch.int64)
        self.first = torch.where(spike, torch.clamp(self.first, max=index), self.first)
        self.last = torch.where(spike, torch.clamp(self.last, min=index), self.last)

    def values(self) -> list[torch.Tensor]:
        """What NumericGuard.read all-reduces (max): -first (so the max is the earliest) and last."""
        return [(-self.first).to(torch.float64), self.last.to(torch.float64)]

    @staticmethod
    def agreed(values: list[float]) -> range | None:
        """The spiking steps all ranks agree on (first..last), from `values` all-reduced; None: none."""
        first, last = int(-values[0]), int(values[1])
        return None if first >= NONE or last < 0 else range(first, last + 1)

    def forget_spikes(self) -> None:
        """After a rollback: the spikes seen are dealt with."""
        self.first.fill_(NONE)
        self.last.fill_(-1)

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window, "accepted": self.accepted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        window = state["window"].to(self.device, torch.float32)
        if window.numel() == self.window.numel():
            self.window.copy_(window)
            self.accepted.copy_(torch.as_tensor(state["accepted"], device=self.device))
        else:  # guard.spike.window changed: the window fills again before it judges
            self.window.zero_()
            self.accepted.zero_()
        self.forget_spikes()
