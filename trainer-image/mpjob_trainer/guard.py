"""NumericGuard: decides when a precision cannot go on (failure modes F1 and F2).

State machine and invariants:
- `consecutive_overflows` counts optimizer steps in a row that GradScaler skipped because the scaled gradients held
  inf/NaN. It is known on the host with no extra device sync: GradScaler.step() already synchronizes on found_inf
  and calls optimizer.step() only for finite gradients, and an optimizer step post-hook records that call. Under DDP
  the gradients are all-reduced before the check, so every rank skips the same steps: the count agrees.
- `non_finite` counts steps whose loss was NaN/Inf. It lives on the device (accumulated with tensor ops, no sync)
  and is read by `read()`, then the loss scale, once per log interval: that is the guard's one deliberate sync
  point, shared with the log line. Ranks gather it there (and take the max), so they decide at the same step. The
  loss the interval reports rides in the same gather: the job's, every rank's weighed by its samples (`job_loss`).
- Messages say what happened when, in 1-based step numbers like the log lines: the first faulting step, the step the
  guard noticed it at and, for the counters read at intervals, the previous read (the interval the fault lay in).
  The first non-finite loss since the last good checkpoint rides in the interval's one all-reduce (no extra sync);
  the first one read is the attempt's first, since a checkpoint is only marked good after a clean interval.
- `healthy` (may the state be checkpointed as good?) reads only values the interval's all-reduce agreed on: whether
  a rank's last step was skipped (the overflow count agrees by itself, ranks skipping the same steps, but rides in
  the read so that a rank whose count went astray cannot split the ranks' checkpoints), the most non-finite losses
  any rank observed since the previous read, and whether any rank reports a non-finite loss. A checkpoint is a
  collective (sharded saves, the finite-state check): ranks that decided apart would wait for ever.
- `first_fault_step` says where trouble began, for the fp32 replay (mpjob_trainer.session.replay): the first
  overflow-skipped step (host state), and the first non-finite loss or update of non-finite gradients (no GradScaler
  skips it: the next loss shows it) since the last good checkpoint, a device tensor read once a precision has ended.
- Loss-scale calibration at the start of fp16 training (a few backoffs from 65536) never trips the guard: it resets
  `consecutive_overflows` on the first applied step and stays far from `minLossScale`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mpjob_contract.api import Guard as GuardSpec
from mpjob_contract.faults import GuardRule
from mpjob_trainer.distributed import World, all_gather_rows, all_reduce_max
from mpjob_trainer.errors import NumericFault
from mpjob_trainer.job_loss import job_loss, loss_share
from mpjob_trainer.spike import SpikeDetector

#: Rules whose trouble is tied to the steps it happened at: a fp32 replay of those steps tells
#: a precision's fault from the data's. Stagnation is not (it is slow, not non-finite).
REPLAYABLE_RULES = frozenset(
    {GuardRule.MAX_CONSECUTIVE_OVERFLOWS, GuardRule.MAX_NON_FINITE_LOSSES, GuardRule.LOSS_SCALE_COLLAPSED}
)
NO_STEP = 2**62
#: Why the loss scale is below guard.minLossScale: overflows backed it off, or none did (init is under it).
BACKED_OFF = ": overflow-skipped steps since the last good checkpoint"
STARTED_BELOW = " with no overflow since the last good checkpoint: precision.lossScale.init is under the floor"


@dataclass
class GuardReading:
    non_finite_losses: int
    loss_scale: float | None
    #: Largest `flag` any rank passed to read() (used to agree on preemption under DDP).
    flag: float = 0.0
    #: Steps whose finite loss spiked (guard.spike; mpjob_trainer.spike), agreed by all ranks.
    spikes: tuple[int, ...] | None = None
    #: The attempt's first non-finite loss (1-based step, earliest over the ranks), if any.
    first_non_finite: int | None = None
    #: The job's loss at the last step: the mean of the ranks' reported losses, each weighed by
    #: its samples (non-finite when any rank's is); None when no rank reported one.
    loss: float | None = None
    #: What guard.maxNonFiniteLosses judges: the most non-finite losses a rank has since its last rollback.
    held: int = 0


class NumericGuard:
    def __init__(self, spec: GuardSpec, device: torch.device, world: World) -> None:
        self.spec = spec
        self.world = world
        self.device = device
        #: The loss spike detector (guard.spike.action rollback), fed and read with the guard.
        self.spike: SpikeDetector | None = None
        self.restart_at(0)

    def restart_at(self, step: int) -> None:
        """Count from nothing, as a new attempt's guard does, from step index `step` (an
        attempt that starts in place after a fallback, session.inplace)."""
        device = self.device
        self.consecutive_overflows = self.overflow_steps = 0
        self._non_finite = torch.zeros((), dtype=torch.int64, device=device)
        self.non_finite_losses = 0
        #: Non-finite losses since the previous read on the rank that saw most (agreed by all).
        self.new_non_finite = 0
        self._non_finite_at_read = torch.zeros((), dtype=torch.int64, device=device)
        #: Did any rank, at the last read, report a non-finite loss or stand in overflow-skipped
        #: steps (agreed by all)?
        self.unfit = False
        self.forgiven = 0  # the most a rank counted before the last rollback (session.skipping): not held
        self._forgiven_here = torch.zeros((), dtype=torch.int64, device=device)  # this rank's own (see rewind)
        self._applied = False
        self._last_loss: tuple[float, int] | None = None  # and the step it was read at
        self._stagnant_since: int | None = None
        # Since the last good checkpoint (mark_good), 0-based step indexes, -1 = none: a non-finite loss, trouble.
        self._first_non_finite = torch.full((2,), -1, dtype=torch.int64, device=device)
        self._first_overflow: int | None = None
        #: Host state of the reads: the attempt's first non-finite loss (1-based) and the step
        #: of the previous read (what a message calls the check interval).
        self.first_non_finite: int | None = None
        self.read_at: int | None = None
        self.previous_read_at: int | None = None
        self._step_index = self._started_at = step

    # -- per step, host only ------------------------------------------------------------
    def begin_step(self) -> None:
        self._applied = False

    @property
    def applied(self) -> bool:
        """Was an update applied in the current training step (since `begin_step`)?"""
        return self._applied

    def optimizer_stepped(self, optimizer: object = None) -> bool:
        """Optimizer step post-hook: GradScaler found the gradients finite. Returns whether this is
        the training step's first applied update (the count of applied steps goes up once).

        A fused optimizer (`fused=True`, the default of transformers' Trainer) takes GradScaler's
        `found_inf` into its own step() and is called even for overflowing gradients; reading that
        flag is the one sync per step a non-fused optimizer makes inside GradScaler.step."""
        found_inf = getattr(optimizer, "found_inf", None)
        if isinstance(found_inf, torch.Tensor) and bool(found_inf.item()):
            return False
        first, self._applied = not self._applied, True
        return first

    def observe_loss(self, loss: torch.Tensor, spoilt: torch.Tensor | None = None) -> None:
        """Count a non-finite loss on the device; note the first step of one, and of one or a `spoilt` update."""
        bad = (~torch.isfinite(loss.detach())).any()
        self._non_finite += bad.to(torch.int64)
        first = torch.stack([bad, bad if spoilt is None else bad | spoilt]) & (self._first_non_finite < 0)
        self._first_non_finite = torch.where(first, self._step_index, self._first_non_finite)
        if self.spike is not None:
            self.spike.observe(loss, self._step_index)

    def end_step(self, step: int, uses_scaler: bool) -> NumericFault | None:
        """Close optimizer step `step` (1-based), which observe_loss saw as index step - 1; the
        fault of too many overflow-skipped steps in a row, if so (checked every step)."""
        self._step_index = step
        if not uses_scaler:
            return None
        if self._applied:
            self.consecutive_overflows = 0
            return None
        if self._first_overflow is None:
            self._first_overflow = step - 1
        self.consecutive_overflows += 1
        self.overflow_steps += 1
        if self.consecutive_overflows < self.spec.max_consecutive_overflows:
            return None
        return NumericFault(
            GuardRule.MAX_CONSECUTIVE_OVERFLOWS,
            f"{self.consecutive_overflows} consecutive overflow-skipped steps "
            f"(guard.maxConsecutiveOverflows={self.spec.max_consecutive_overflows}): the first at step "
            f"{step - self.consecutive_overflows + 1}, detected at step {step} (checked every step)",
        )

    # -- at log intervals: the one sync point -------------------------------------------
    def read(
        self,
        scaler: torch.amp.GradScaler | None,
        flag: float = 0.0,
        reported: torch.Tensor | float | None = None,
        weight: float = 1.0,
    ) -> GuardReading:
        """The interval's one wait for the device: the non-finite counts, `flag` and whether the
        state is fit to keep (`healthy`; `reported`: the loss this rank reports, over `weight`
        samples), gathered from every rank in one collective and one tensor read: the max of
        each, and the job's loss (`job_loss`). The loss scale is read after it with GradScaler's public
        `get_scale()`, whose `.item()` then copies one number the finished steps have already
        computed (nothing is left queued to wait for); it needs no all-reduce, since every rank
        skips the same steps (see above) and so holds the same scale."""
        first = self._first_non_finite[0]
        values = [
            self._non_finite.to(torch.float64),
            torch.tensor(flag, dtype=torch.float64, device=self.device),
            -torch.where(first >= 0, first, NO_STEP).to(torch.float64),  # max of the negated: the earliest
            (self._non_finite - self._non_finite_at_read).to(torch.float64),  # this rank's, since its last read
            self._unfit(reported),
            (self._non_finite - self._forgiven_here).to(torch.float64),  # held against the guard
            *(self.spike.values() if self.spike is not None else []),
        ]
        rows = all_gather_rows(torch.cat([torch.stack(values), loss_share(reported, weight, self.device)]), self.world)
        reduced = torch.cat([rows[:, :-2].amax(dim=0), rows[:, -2:].sum(dim=0)]).tolist()  # the one read
        packed, loss = reduced[:-2], job_loss(reduced[-2:])
        self._non_finite_at_read = self._non_finite.clone()
        self.non_finite_losses = int(packed[0])
        self.new_non_finite, self.unfit = int(packed[3]), packed[4] > 0
        if self.first_non_finite is None and -packed[2] < NO_STEP:
            self.first_non_finite = int(-packed[2]) + 1
        self.previous_read_at, self.read_at = self.read_at, self._step_index
        scale = scaler.get_scale() if scaler is not None else None
        span = self.spike.agreed(packed[6:]) if self.spike is not None else None
        spikes = self.spike.spiked(span, self.world) if self.spike is not None and span is not None else None
        return GuardReading(
            self.non_finite_losses, scale, packed[1], spikes, self.first_non_finite, loss, int(packed[5])
        )

    def _when(self, first: int | None, step: int) -> str:
        """When a fault read at an interval happened: its first step, the read, the interval."""
        since = (
            f"the previous read was at step {self.previous_read_at}"
            if self.previous_read_at is not None
            else f"the first read since the attempt started at step {self._started_at}"
        )
        began = f"the first at step {first}, " if first is not None else ""
        return f"{began}detected at step {step} (the guard reads its counters at log and checkpoint steps; {since})"

    def check(
        self, step: int, reading: GuardReading, loss: float | None, grad_norm: float | None
    ) -> NumericFault | None:
        """The fault an interval's read shows, if any (the first rule it breaks)."""
        if (held := reading.held) >= self.spec.max_non_finite_losses:
            forgiven = f"; {self.forgiven} more before a rollback, not held against it" if self.forgiven else ""
            return NumericFault(
                GuardRule.MAX_NON_FINITE_LOSSES,
                f"{held} non-finite losses in this attempt "
                f"(guard.maxNonFiniteLosses={self.spec.max_non_finite_losses}{forgiven}): "
                f"{self._when(reading.first_non_finite, step)}",
            )
        if reading.loss_scale is not None and reading.loss_scale < self.spec.min_loss_scale:
            first = self._first_overflow + 1 if self._first_overflow is not None else None
            return NumericFault(
                GuardRule.LOSS_SCALE_COLLAPSED,
                f"loss scale {reading.loss_scale:g} below guard.minLossScale={self.spec.min_loss_scale:g}"
                f"{BACKED_OFF if first is not None else STARTED_BELOW}, {self._when(first, step)}",
            )
        return self._stagnated(step, loss, grad_norm)

    def _stagnated(self, step: int, loss: float | None, grad_norm: float | None) -> NumericFault | None:
        """Stuck since the first read that shows it: a loss read as at the previous read stood from that read on."""
        if self.spec.stagnation_steps > 0 and loss is not None:
            last = self._last_loss
            same = last is not None and abs(loss - last[0]) <= 1e-7 * max(1.0, abs(loss))
            if not (same or (grad_norm is not None and grad_norm == 0.0)):
                self._stagnant_since = None
            elif self._stagnant_since is None:
                self._stagnant_since = last[1] if last is not None and same else step
            elif step - self._stagnant_since >= self.spec.stagnation_steps:
                return NumericFault(
                    GuardRule.STAGNATION,
                    f"loss or gradients stuck since step {self._stagnant_since} "
                    f"(guard.stagnationSteps={self.spec.stagnation_steps})",
                )
            self._last_loss = (loss, step)
        return None

    def start_at(self, step: int) -> None:
        """The attempt's first step is `step` (0-based index: resumed from a checkpoint there)."""
        self._step_index = self._started_at = step

    def mark_good(self) -> None:
        """A checkpoint of the current state was taken as good: trouble is counted from here."""
        self._first_overflow = None
        self._first_non_finite.fill_(-1)

    def rewind(self, step: int) -> None:
        """The state was rolled back to `step` (0-based index; session.skipping): trouble, the non-finite count
        the guard checks and a stuck loss are counted from there again. Those of the rolled-back steps are
        forgiven as counted now, on the device (a fault seen at a step's end, not at a read, leaves some unread),
        each rank its own: a bad sample skipped on one rank forgives nothing of another's losses. A collective."""
        self.consecutive_overflows = 0
        self._last_loss = self._stagnant_since = None  # as a restarted attempt, not the rolled-back steps' reads
        counted = all_reduce_max(self._non_finite.to(torch.float64), self.world)
        self.forgiven = int(counted.item())  # those of the rolled-back steps no longer count
        self._forgiven_here = self._non_finite.clone()  # on each rank, its own
        self._non_finite_at_read = self._non_finite.clone()  # nor are they new at the next read
        self.first_non_finite = None  # a later message names the first fault after the rollback
        self._step_index = step
        self.mark_good()

    def first_fault_step(self, rule: GuardRule) -> int | None:
        """The 0-based step where the trouble that tripped `rule` began, agreed by all ranks (their earliest; this
        rank's: `own_first`, its first non-finite loss: `own_loss`); None when the rule points at no step. Syncs."""
        if rule not in REPLAYABLE_RULES:
            return None
        self.own_loss, trouble = self._first_non_finite.tolist()
        if rule is GuardRule.MAX_CONSECUTIVE_OVERFLOWS:
            candidates = [self._step_index - self.consecutive_overflows]
        else:  # a skipped step alone is GradScaler calibrating: it counts only for a collapsed scale
            candidates = [trouble]
            if rule is GuardRule.LOSS_SCALE_COLLAPSED and self._first_overflow is not None:
                candidates.append(self._first_overflow)
        self.own_first = mine = min((int(c) for c in candidates if c >= 0), default=NO_STEP)
        earliest = -all_reduce_max(torch.tensor(-float(mine), dtype=torch.float64, device=self.device), self.world)
        return None if earliest >= NO_STEP else int(earliest)

    def _unfit(self, reported: torch.Tensor | float | None) -> torch.Tensor:
        """1.0 when this rank's state is unfit to keep (it stands in overflow-skipped steps, or the
        loss it reports is NaN/Inf), else 0.0, on the device (no sync)."""
        if self.consecutive_overflows > 0 or reported is None:
            return torch.tensor(float(self.consecutive_overflows > 0), dtype=torch.float64, device=self.device)
        value = torch.as_tensor(reported, device=self.device).detach()
        return (~torch.isfinite(value)).any().to(torch.float64)

    def healthy(self) -> bool:
        """May the current state be checkpointed as good? (Call right after `read`.) Decided from
        values every rank agrees on, so all ranks take the checkpoint's collectives or none does."""
        return not self.unfit and self.new_non_finite == 0
