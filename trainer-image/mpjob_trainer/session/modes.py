"""AttemptPrecision: the attempt's precision state and the modes the session runs code in.

An attempt trains in one precision, yet the session runs the loop's code in others for a
while: an `auto` attempt times its step in each candidate precision (PROBE, session.measure),
a numeric fault is replayed in fp32 (REPLAY, session.replay), and the quality gate evaluates
the same weights in fp32 (EVAL, session.quality). They all read one state: the precision, its
PrecisionPolicy (autocast dtype, TF32) and the GradScaler. This class owns that state, and a
mode is entered and left through ONE method, `entered(mode, precision)`: a context manager
that sets all of it for the block and puts all of it back afterwards, whatever the block
raises. The attempt's own precision changes only through `settle` (an `auto` attempt's
measured choice, a change in place), in TRAIN; `unsettle` takes a change in place back, GradScaler
and all, when it found no state to train from (the attempt ends in the precision it trained in).

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
- fp8's converted linears (mpjob_trainer.float8) run in fp8 exactly while the current mode's
  precision is fp8: every other mode sees plain nn.Linear modules.

fp8: an fp8 attempt on a device without fp8 tensor cores (and without precision.fp8.emulate) is
a configuration error when this state is made, before any step (no retry can give the node
fp8). `convert_fp8` (at the first of run.keep_fp32, run.compile and run.wrap) converts the
model's eligible linears in an fp8 attempt, and in an `auto` one on a device with fp8 (it
measures fp8 among its candidates); an fp8 forward pass with nothing converted is a
configuration error, since it would train bf16 under fp8's name.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

from mpjob_contract.api import Precision, PrecisionSpec
from mpjob_contract.fp8 import fp8_capable
from mpjob_trainer import float8
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.events import EventLog
from mpjob_trainer.float8 import Fp8Linears
from mpjob_trainer.precision import PrecisionPolicy

#: TRAIN's policy and GradScaler, as `settle` leaves them and `entered` keeps them for the block.
Settled = tuple[PrecisionPolicy, torch.amp.GradScaler | None]


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
        #: The model's fp8 linears, once an fp8-capable attempt converted them (convert_fp8).
        self.fp8: Fp8Linears | None = None
        #: How deep the session's own code is entered (`ours`: run.autocast(), run.backward()): a
        #: forward under an autocast outside it is the script's own (session.own_autocast).
        self.own_depth = 0
        if precision == "fp8":
            float8.require_fp8_device(spec.fp8, device)

    def convert_fp8(self, model: nn.Module, *, auto: bool, log: EventLog) -> list[str]:
        """Convert `model`'s eligible linears once, when this attempt may train in fp8; their names."""
        wanted = self.precision == "fp8" or (auto and fp8_capable(float8.capability_of(self.device)))
        if wanted and self.fp8 is None:
            linears = float8.convert(model, self.spec.fp8, self.spec.keep_fp32)
            self.attach_fp8(linears)
            fp8 = self.spec.fp8
            log("fp8", converted=linears.names, kept=linears.kept, recipe=fp8.recipe, emulate=fp8.emulate)
        return self.fp8.names if self.fp8 is not None else []

    def release_model(self) -> None:
        """The loop's model is being built anew (Session.reentering): let go of the old one's fp8
        linears (their weights with them); a new model is converted when this mode trains fp8."""
        self.fp8 = None

    def attach_fp8(self, linears: Fp8Linears) -> None:
        """Switch these fp8 linears with the mode's precision from now on."""
        self.fp8 = linears
        linears.enable(self.precision == "fp8")

    @property
    def precision(self) -> Precision:
        """The precision the current mode runs in (TRAIN: the attempt's)."""
        return self.policy.precision

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The current mode's autocast for forward passes (a no-op in fp32)."""
        if self.precision == "fp8" and self.fp8 is None:
            raise ConfigError(
                "precision.mode fp8: pass the model to run.wrap(model) (or run.keep_fp32 or run.compile) before the "
                "first forward (it converts the model's linears to fp8); an fp8 attempt with no fp8 linears would "
                "train bf16 under fp8's name"
            )
        if self.precision == "fp8" and self.fp8 is not None:
            self.fp8.require_any()
        return _Ours(self, self.policy.autocast())

    def ours(self) -> contextlib.AbstractContextManager[Any]:
        """The block is the session's own: an autocast in force there is `autocast()`'s (a forward
        recomputed by activation checkpointing in run.backward() runs under the one it saw)."""
        return _Ours(self, contextlib.nullcontext())

    def settle(self, precision: str) -> Settled:
        """Train in `precision` from here on, with a fresh GradScaler (an `auto` attempt's choice, a
        change in place); what TRAIN held before, for `unsettle`."""
        self._require(Mode.TRAIN, "settle")
        left = (self.policy, self.scaler)
        self._set(PrecisionPolicy(cast(Precision, precision), self.device, self.spec), sets_backend=True)
        return left

    def unsettle(self, left: Settled) -> None:
        """Train again as before the `settle` that returned `left`: a change in place that found no
        good state to go back to ends the attempt in the precision it trained in, its scale kept."""
        self._require(Mode.TRAIN, "unsettle")
        self._put_back(left, sets_backend=True)

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
            self._put_back(saved, sets_backend=mode.sets_backend)

    def _put_back(self, saved: Settled, *, sets_backend: bool) -> None:
        """TRAIN's policy and GradScaler as `saved` held them, fp8's linears and TF32 following."""
        self.policy, self.scaler = saved
        if self.fp8 is not None:
            self.fp8.enable(self.precision == "fp8")
        if sets_backend:
            self.policy.configure_backend()

    def _set(self, policy: PrecisionPolicy, *, sets_backend: bool) -> None:
        self.policy = policy
        if self.fp8 is not None:
            self.fp8.enable(policy.precision == "fp8")
        if sets_backend:
            policy.configure_backend()
        self.scaler = policy.make_scaler()

    def _require(self, mode: Mode, action: str) -> None:
        if self.mode is not mode:
            raise RuntimeError(f"cannot {action} in {self.mode.value} mode: modes are entered from {mode.value} only")


class _Ours:
    """`autocast`'s and `ours`'s context: `inner` (the mode's autocast, or nothing) entered as the
    session's own. A class, not a generator: it runs in every step's forward and backward."""

    def __init__(self, amp: AttemptPrecision, inner: contextlib.AbstractContextManager[Any]) -> None:
        self.amp, self.inner = amp, inner

    def __enter__(self) -> Any:
        self.amp.own_depth += 1
        return self.inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        self.amp.own_depth -= 1
        return self.inner.__exit__(*exc)
