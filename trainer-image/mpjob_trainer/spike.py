"""SpikeDetector: a finite loss far above its running window (precision.guard.spike).

Per step the detector only stores the step's loss on the device (one copy, no host sync).
At the interval's one read (NumericGuard.read calls `values()` just before its all-reduce) the
losses of the steps since the last read are judged together, on the device: a finite loss x
with x > m + zScore * s, where m and s are the mean and standard deviation of the last
`window` accepted losses before the interval (once the window is full), is a spike. Spikes
are not accepted into the window (a spike does not widen the deviation it is judged by);
finite losses that are not are. The first and last spiking step ride the guard's packed
all-reduce (first: min over ranks, last: max), so detection costs no extra host sync per step
and no extra collective, and a spike is seen at the next log, checkpoint or evaluation step
(the guard's cadence, not a one-step lag). Only when a read finds one do the ranks gather which
steps between the first and the last spiked on any of them (`spiked`, one more collective): the
steps between two spikes that did not spike are not the spike's, and the rung keeps them.

The window and its fill count are checkpointed (a resumed run judges as a straight run does);
a checkpoint is taken right after a read, when no loss is pending.
"""

from __future__ import annotations

from typing import Any

import torch

from mpjob_contract.skipping import SpikeSpec
from mpjob_trainer.distributed import World, all_gather_rows

#: "No spike seen": larger than any step index.
NONE = 2**62
#: A deviation floor relative to the mean, so a flat window (a loss stuck at a value) does not
#: make every rounding difference a spike.
RELATIVE_FLOOR = 1e-6


class SpikeDetector:
    def __init__(self, spec: SpikeSpec, device: torch.device, *, pending: int = 64) -> None:
        self.spec = spec
        self.device = device
        # The accepted losses, a ring; slot `window` takes what is not accepted (see _accept).
        self.window = torch.zeros(spec.window + 1, dtype=torch.float32, device=device)
        self.accepted = torch.zeros((), dtype=torch.int64, device=device)
        self.first = torch.full((), NONE, dtype=torch.int64, device=device)
        self.last = torch.full((), -1, dtype=torch.int64, device=device)
        self._losses = torch.zeros(pending, dtype=torch.float32, device=device)
        self._steps: list[int] = []  # the 0-based step of each pending loss (host)
        #: Each judged loss's step where it spiked, else -1 (device), until the spikes are dealt with.
        self._spiking: list[torch.Tensor] = []

    def observe(self, loss: torch.Tensor, index: int) -> None:
        """Keep step `index`'s loss for the next read: one device copy, no sync."""
        if len(self._steps) == self._losses.numel():  # an interval longer than the buffer: judge what is held
            self._judge()
        value = loss.detach()
        self._losses[len(self._steps)] = value if value.dim() == 0 else value.float().mean()
        self._steps.append(index)

    def values(self) -> list[torch.Tensor]:
        """Judge the pending losses; what NumericGuard.read all-reduces (max): -first (so the max
        is the earliest) and last."""
        if self._steps:
            self._judge()
        return [(-self.first).to(torch.float64), self.last.to(torch.float64)]

    def _judge(self) -> None:
        """The pending losses against the window as it stood before them; device ops only."""
        count, size = len(self._steps), self.spec.window
        x = self._losses[:count]
        steps = torch.tensor(self._steps, dtype=torch.int64).to(self.device, non_blocking=True)
        self._steps = []
        var, mean = torch.var_mean(self.window[:size])
        deviation = torch.maximum(var.sqrt(), mean.abs() * RELATIVE_FLOOR)
        finite = torch.isfinite(x)
        spike = finite & (self.accepted >= size) & (x - mean > self.spec.z_score * deviation)
        self.first = torch.minimum(self.first, torch.where(spike, steps, NONE).min())
        self.last = torch.maximum(self.last, torch.where(spike, steps, -1).max())
        self._spiking.append(torch.where(spike, steps, -1))
        self._accept(x, finite & ~spike)

    def _accept(self, x: torch.Tensor, accept: torch.Tensor) -> None:
        """Write the accepted losses into the ring in order, without a sync: each goes to the
        next free slot, the rest to the spare slot. In chunks of at most `window`, so no two
        accepted losses of one write share a slot."""
        size = self.spec.window
        for chunk in range(0, x.numel(), size):
            part, taken = x[chunk : chunk + size], accept[chunk : chunk + size].to(torch.int64)
            slots = torch.where(taken > 0, (self.accepted + taken.cumsum(0) - 1) % size, size)
            self.window.index_copy_(0, slots, part)
            self.accepted += taken.sum()

    def agreed(self, values: list[float]) -> range | None:
        """The span of the steps that spiked on any rank (first..last), from `values` all-reduced;
        None: none (and nothing judged so far is kept)."""
        first, last = int(-values[0]), int(values[1])
        if first >= NONE or last < 0:
            self._spiking = []
            return None
        return range(first, last + 1)

    def flags(self, span: range) -> torch.Tensor:
        """1 for each step of `span` whose loss spiked on this rank, else 0 (device ops only)."""
        flags = torch.zeros(len(span), dtype=torch.float64, device=self.device)
        if self._spiking:
            spiking = torch.cat(self._spiking)
            inside = (spiking >= span.start) & (spiking < span.stop)
            at = (spiking - span.start).clamp(0, len(span) - 1)
            flags.scatter_reduce_(0, at, inside.to(torch.float64), reduce="amax")
        return flags

    def spiked(self, span: range, world: World) -> tuple[int, ...]:
        """The steps of `span` (`agreed`'s) that spiked on any rank: one gather, on every rank."""
        rows = all_gather_rows(self.flags(span), world)
        return tuple(step for step, flag in zip(span, rows.amax(dim=0).tolist(), strict=True) if flag > 0)

    def forget_spikes(self) -> None:
        """After a rollback: the spikes seen are dealt with, the pending losses were rolled back."""
        self.first.fill_(NONE)
        self.last.fill_(-1)
        self._steps = []
        self._spiking = []

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window[: self.spec.window], "accepted": self.accepted}

    @staticmethod
    def state_problem(state: Any) -> str | None:
        """What makes a checkpoint's spike window unusable (None: nothing): not as `state_dict`
        writes it (finite float losses, a count of those accepted). Checked before anything is loaded."""
        if not isinstance(state, dict):
            return "a spike window that is no mapping"
        if (missing := next((key for key in ("window", "accepted") if key not in state), None)) is not None:
            return f"a spike window without {missing}"
        window, accepted = state["window"], state["accepted"]
        if not isinstance(window, torch.Tensor) or not window.is_floating_point() or window.dim() != 1:
            return "a spike window that is no float tensor"
        if not bool(torch.isfinite(window).all()):
            return "a spike window of non-finite losses"
        count = accepted.item() if isinstance(accepted, torch.Tensor) and accepted.numel() == 1 else accepted
        if type(count) is not int or count < 0:
            return f"a spike window whose accepted is no count ({accepted!r:.40})"
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The checkpoint's window (`state_problem` checked it)."""
        window = state["window"].to(self.device, torch.float32)
        if window.numel() == self.spec.window:
            self.window[: self.spec.window].copy_(window)
            self.accepted.copy_(torch.as_tensor(state["accepted"], device=self.device))
        else:  # guard.spike.window changed: the window fills again before it judges
            self.window.zero_()
            self.accepted.zero_()
        self.forget_spikes()
