"""AttemptPrecision: the attempt's precision state and the modes the session runs code in.

An attempt trains in one precision, yet the session runs the loop's code in others for a
while: an `auto` attempt times its step in each candidate precision (PROBE, session.measure),
a numeric fault is replayed in fp32 (REPLAY, session.replay), and the quality gate evaluates
the same weights in fp32 (EVAL, session.quality). They all read one state: the precision, its
PrecisionPolicy (autocast dtype, TF32) and the GradScaler. This class owns that state, and a
mode is entered and left through ONE method, `entered(mode, precision)`: a context manager
that sets all of it for the block and puts all of it back afterwards, whatever the block
raises. The attempt's own precision changes only through `settle` (an `auto` attempt's
measured choice), in TRAIN.

Autocast follows the precision (none in fp32); `run.precision` is the current mode's.

| mode   | precision     | GradScaler            | TF32 (CUDA)  | `run.step()`                | entered by          |
|--------|---------------|-----------------------|--------------|-----------------------------|---------------------|
| TRAIN  | the attempt's | fp16: the attempt's   | its own      | unscale, clip, step, zero   | start(); settle(p)  |
| PROBE  | a candidate   | fresh (fp16)          | candidate's  | zero the gradients only     | session.measure     |
| REPLAY | fp32          | none                  | fp32's       | clip, step, zero            | session.replay      |
| EVAL   | fp32          | none (no backward)    | TRAIN's (1)  | not called                  | session.quality     |

(1) The quality gate's reference pass runs plain fp32 matmuls: EVAL is entered only from a
low precision, whose TRAIN state has TF32 off. TRAIN's scaler is fp16 attempts' only, built
from spec.precision.lossScale; a step that overflowed is skipped (GradScaler.step).

Invariants:
- Modes do not nest: every mode is entered from TRAIN and returns to it (anything else is a
  bug in the session and raises). Leaving restores the mode, precision, policy, scaler and
  the TF32 flags exactly as they were, so TRAIN's GradScaler keeps its calibrated scale across
  an evaluation.
- The state is host-only: entering or leaving a mode never waits for the device.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any, cast

import torch

from mpjob_contract.api import Precision, PrecisionSpec
from mpjob_trainer.precision import PrecisionPolicy


class Mode(enum.Enum):
    """What the session is running the loop's code for (the table in the module docstring)."""

    TRAIN = "train"
    PROBE = "probe"
    REPLAY = "replay"
    EVAL = "eval"

    @property
    def applies_updates(self) -> bool:
        """Does `run.step()` step the optimizer? (A probe only times the step.)"""
        return self is not Mode.PROBE

    @property
    def sets_backend(self) -> bool:
        """Does entering the mode set TF32 for its precision? (EVAL's reference keeps TRAIN's.)"""
        return self is not Mode.EVAL


class AttemptPrecision:
    """The precision state of one attempt; see the module docstring for its states."""

    def __init__(self, precision: Precision, device: torch.device, spec: PrecisionSpec) -> None:
        self.device = device
        self.spec = spec
        self.mode = Mode.TRAIN
        self.policy = PrecisionPolicy(precision, device, spec)
        self.policy.configure_backend()
        self.scaler: torch.amp.GradScaler | None = self.policy.make_scaler()

    @property
    def precision(self) -> Precision:
        """The precision the current mode runs in (TRAIN: the attempt's)."""
        return self.policy.precision

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The current mode's autocast for forward passes (a no-op in fp32)."""
        return self.policy.autocast()

    def settle(self, precision: str) -> None:
        """Train in `precision` from here on, with a fresh GradScaler (an `auto` attempt's choice)."""
        self._require(Mode.TRAIN, "settle")
        self._set(PrecisionPolicy(cast(Precision, precision), self.device, self.spec), sets_backend=True)

    @contextlib.contextmanager
    def entered(self, mode: Mode, precision: str = "fp32") -> Iterator[None]:
        """Run the block in `mode` and `precision`; TRAIN's whole state comes back afterwards."""
        self._require(Mode.TRAIN, f"enter {mode.value}")
        if mode is Mode.TRAIN:
            raise RuntimeError("TRAIN is left and re-entered, not entered: use settle() to change its precision")
        saved = (self.policy, self.scaler)
        self.mode = mode
        self._set(PrecisionPolicy(cast(Precision, precision), self.device, self.spec), sets_backend=mode.sets_backend)
        try:
            yield
        finally:
            self.mode = Mode.TRAIN
            self.policy, self.scaler = saved
            if mode.sets_backend:
                self.policy.configure_backend()

    def _set(self, policy: PrecisionPolicy, *, sets_backend: bool) -> None:
        self.policy = policy
        if sets_backend:
            policy.configure_backend()
        self.scaler = policy.make_scaler()

    def _require(self, mode: Mode, action: str) -> None:
        if self.mode is not mode:
            raise RuntimeError(f"cannot {action} in {self.mode.value} mode: modes are entered from {mode.value} only")
