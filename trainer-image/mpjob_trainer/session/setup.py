"""ModelSetUp: the loop's model as the attempt trains it (fp8 linears, keepFp32, compile, the
optimizer, DDP or FSDP2), the part of the Session the loop calls while it sets up."""

from __future__ import annotations

import torch
from torch import nn

from mpjob_contract.api import MixedPrecisionJobSpec, Precision
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import sharding, speed
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.events import EventLog
from mpjob_trainer.precision import autocast_fp32_types, keep_fp32
from mpjob_trainer.session.modes import AttemptPrecision


def named_as_the_model_names(model: nn.Module, kept: list[str]) -> None:
    """A keepFp32 type the model lacks is fine (a spec shared by models, the default LayerNorm), but
    one that differs from a type of the model only in case is a misspelling that would keep nothing
    in fp32, silently: a ConfigError naming the type it means. Checked in every precision."""
    types = {type(module).__name__ for module in model.modules()}
    for name in kept:
        meant = sorted(kind for kind in types if kind.lower() == name.lower() and kind != name)
        if name not in types and meant:
            raise ConfigError(
                f"spec.precision.keepFp32: {name!r} names no module type of the model (class names are "
                f"case-sensitive): did you mean {meant[0]!r}?"
            )


class ModelSetUp:
    """The Session's set-up calls for the loop's model, in the attempt's precision."""

    def __init__(
        self,
        spec: MixedPrecisionJobSpec,
        launch: AttemptLaunch,
        amp: AttemptPrecision,
        wrapper: sharding.Wrapper,
        *,
        log: EventLog,
        device: torch.device,
    ) -> None:
        self.spec, self.launch, self.amp, self.wrapper = spec, launch, amp, wrapper
        self.log, self.device = log, device

    @property
    def precision(self) -> Precision:
        return self.amp.precision

    def _convert_fp8(self, model: nn.Module) -> None:
        """fp8 linears in fp8 attempts (session.modes), once, at whichever of keep_fp32, compile
        and wrap comes first: a loop need not call keep_fp32 for fp8, as for fp16 and bf16."""
        self.amp.convert_fp8(model, auto=self.launch.precision == "auto", log=self.log)

    def keep_fp32(self, model: nn.Module) -> list[str]:
        """The precision's set-up of the model: fp8 linears in fp8 attempts, then keepFp32
        module types run in fp32 under autocast (those autocast runs so already left alone);
        returns the names of the modules wrapped. An fp32 attempt wraps none (no autocast: they
        run in fp32 already), unless it re-promotes in place: its model then trains on in a low
        precision, set up as the restarted attempt's would be (the wrappers change nothing in fp32)."""
        self._convert_fp8(model)
        named_as_the_model_names(model, self.spec.precision.keep_fp32)
        lowers = self.spec.precision.in_place and self.launch.promote_in_place_to is not None
        if self.precision == "fp32" and not lowers:
            return []
        kept, free = self.spec.precision.keep_fp32, autocast_fp32_types(self.device)
        wrapped = keep_fp32(model, kept, self.device)
        self.log("keepFp32", wrapped=wrapped, skipped=[name for name in kept if name in free])
        return wrapped

    def compile(self, model: nn.Module) -> nn.Module:
        """`torch.compile(model)` as spec.training.compile says (auto: on CUDA), else `model`.
        Call it after keep_fp32 and before wrap; resume() takes the uncompiled module."""
        self._convert_fp8(model)  # before tracing: the compiled graph holds the fp8 linears
        compiled = speed.compile_model(model, self.spec.training.compile, self.device)
        self.log("compile", mode=self.spec.training.compile, compiled=compiled is not model)
        return compiled

    def adamw(
        self, model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
    ) -> torch.optim.AdamW:
        """AdamW with no weight decay on parameters of fewer than 2 dimensions, fused on CUDA."""
        if not any(p.requires_grad for p in model.parameters()):
            raise ConfigError(
                f"adamw({type(model).__name__}): the model has no trainable parameters (none with requires_grad): "
                "nothing for an optimizer to train; a loop without one closes its steps with run.end_step alone"
            )
        return speed.adamw(model, lr=lr, weight_decay=weight_decay, betas=betas)

    def wrap(self, model: nn.Module, *, blocks: sharding.Blocks = None) -> nn.Module:
        """The model as spec.parallelism trains it: DDP, or FSDP2 on each of `blocks` and the root,
        in place (make the optimizer after); activation checkpointing per block (mpjob_trainer.sharding)."""
        self._convert_fp8(model)  # before DDP or FSDP2 takes the parameters
        return self.wrapper.wrap(model, blocks, precision=self.precision)


class SetUpCalls:
    """The Session's set-up calls (its OPEN phase, and again in a loop re-entered to wrap anew),
    each ModelSetUp's in the attempt's precision."""

    _setup: ModelSetUp

    def keep_fp32(self, model: nn.Module) -> list[str]:
        """fp8 linears in fp8 attempts, then spec.precision.keepFp32 module types in fp32 (ModelSetUp)."""
        return self._setup.keep_fp32(model)

    def compile(self, model: nn.Module) -> nn.Module:
        """`torch.compile(model)` as spec.training.compile says; after keep_fp32, before wrap (ModelSetUp)."""
        return self._setup.compile(model)

    def adamw(
        self, model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
    ) -> torch.optim.AdamW:
        """AdamW, no weight decay on parameters of fewer than 2 dimensions, fused on CUDA (ModelSetUp)."""
        return self._setup.adamw(model, lr=lr, weight_decay=weight_decay, betas=betas)

    def wrap(self, model: nn.Module, *, blocks: sharding.Blocks = None) -> nn.Module:
        """The model as spec.parallelism trains it: DDP, or FSDP2 on `blocks` and the root (ModelSetUp)."""
        return self._setup.wrap(model, blocks=blocks)
