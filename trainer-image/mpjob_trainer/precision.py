"""Precision policy of an attempt: autocast dtype, GradScaler, modules kept in fp32 (F4).

fp32: no autocast (TF32 matmuls only when spec.precision.tf32). fp16: autocast + GradScaler
from spec.precision.lossScale; master weights stay fp32 (the model is never cast). bf16:
autocast, no scaler (bf16 has fp32's exponent range). fp8: float8 linears that scale their own
tensors, the rest under bf16 autocast, no scaler (vocabulary.LOSS_SCALED: fp16 alone has one).
"""

from __future__ import annotations

import contextlib
import math
import types
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from mpjob_contract.api import Precision, PrecisionSpec, resolve_auto
from mpjob_contract.vocabulary import LOSS_SCALED
from mpjob_trainer.data import is_namedtuple

#: Autocast dtypes; fp8 runs all but its float8 linears (mpjob_trainer.float8) under bf16 autocast.
DTYPES = {"fp8": torch.bfloat16, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def device_capability(device: torch.device) -> tuple[int, int] | None:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return (major, minor)
    return None


def resolve(requested: str, device: torch.device) -> Precision:
    """The precision an attempt starts in. `auto` gets the device's default (bf16 on compute
    capability >= 8.0 and CPU, fp16 on 7.x, fp32 below) until the session measures the node
    (session.measure, once the loop registers its step)."""
    return resolve_auto(requested, device_capability(device))  # type: ignore[arg-type]


@dataclass
class PrecisionPolicy:
    precision: Precision
    device: torch.device
    spec: PrecisionSpec

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    @property
    def uses_scaler(self) -> bool:
        return self.precision == LOSS_SCALED

    def configure_backend(self) -> None:
        if self.device.type == "cuda":
            allow = self.precision == "fp32" and self.spec.tf32
            torch.backends.cuda.matmul.allow_tf32 = allow
            torch.backends.cudnn.allow_tf32 = allow

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        if not self.uses_scaler:
            return None
        ls = self.spec.loss_scale
        scaler = torch.amp.GradScaler(
            self.device.type,
            init_scale=ls.init,
            growth_factor=ls.growth_factor,
            backoff_factor=ls.backoff_factor,
            growth_interval=ls.growth_interval,
        )
        _MADE_IN[scaler] = scaler.state_dict()
        return scaler


#: Each GradScaler `make_scaler` made, and the state it was made in.
_MADE_IN: weakref.WeakKeyDictionary[torch.amp.GradScaler, dict[str, Any]] = weakref.WeakKeyDictionary()


def fresh_scaler_state(scaler: torch.amp.GradScaler) -> dict[str, Any] | None:
    """The state `scaler` was made in (precision.lossScale.init, no growth counted): what a restarted
    attempt's GradScaler holds when its checkpoint has no fp16 scale to load (None: not one of ours)."""
    return _MADE_IN.get(scaler)


#: What GradScaler.load_state_dict reads: the positive real numbers, and the counts.
_SCALER_NUMBERS = ("scale", "growth_factor", "backoff_factor")
_SCALER_COUNTS = ("growth_interval", "_growth_tracker")


def scaler_state_problem(value: Any) -> str | None:
    """What makes a checkpoint's GradScaler state unusable (None: nothing, or no state: None or the
    empty dict of a disabled scaler): a key GradScaler.load_state_dict reads missing, a scale or
    factor that is no finite positive number, a count that is no count. The scaler stores what it
    is given unchecked (a NaN scale would make every fp16 step non-finite), so it is checked here."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        return "that is no mapping"
    for key in (*_SCALER_NUMBERS, *_SCALER_COUNTS):
        if key not in value:
            return f"without {key}"
        item, counted = value[key], key in _SCALER_COUNTS
        if type(item) is bool or not isinstance(item, int if counted else int | float):
            return f"whose {key} is {item!r:.40}"
        if not math.isfinite(item) or item < 0 or (item == 0 and key != "_growth_tracker"):
            return f"whose {key} is {item!r:.40}"
    return None


# ---------------------------------------------------------------- keepFp32
class AutocastFp32(NamedTuple):
    """Why autocast already runs a module type in fp32: the aten op it calls is on autocast's
    fp32 list (inputs cast to fp32, output fp32) on that device type, since that torch version."""

    op: str
    since: tuple[int, int] = (2, 5)  # the trainer's torch floor


_LOSSES = {
    "MSELoss": AutocastFp32("mse_loss"),
    "L1Loss": AutocastFp32("l1_loss"),
    "SmoothL1Loss": AutocastFp32("smooth_l1_loss"),
    "HuberLoss": AutocastFp32("huber_loss"),
    "NLLLoss": AutocastFp32("nll_loss"),
    "KLDivLoss": AutocastFp32("kl_div"),
    "BCEWithLogitsLoss": AutocastFp32("binary_cross_entropy_with_logits"),
    "PoissonNLLLoss": AutocastFp32("poisson_nll_loss"),
    "CosineEmbeddingLoss": AutocastFp32("cosine_embedding_loss"),
    "HingeEmbeddingLoss": AutocastFp32("hinge_embedding_loss"),
    "MarginRankingLoss": AutocastFp32("margin_ranking_loss"),
    "SoftMarginLoss": AutocastFp32("soft_margin_loss"),
    "TripletMarginLoss": AutocastFp32("triplet_margin_loss"),
    "MultiMarginLoss": AutocastFp32("multi_margin_loss"),
}

#: torch.nn module types that autocast already runs in fp32, per device type, by class name.
#: CUDA: AT_FORALL_FP32 and AT_FORALL_FP32_SET_OPT_DTYPE in aten/src/ATen/autocast_mode.h (the
#: "CUDA Ops that can autocast to float32" of torch.amp's Autocast Op Reference); rms_norm joined
#: them in torch 2.12. CPU: its fp32 list (aten/src/ATen/autocast_mode.cpp) holds the losses but
#: no norm and no softmax: a LayerNorm under CPU autocast returns its input's dtype. Each entry is
#: checked by tests/unit/trainer/test_keep_fp32.py (CPU on the CPU, CUDA's with fake CUDA tensors
#: and, on a GPU, on the GPU). A device type not listed (mps, xpu, ...) skips nothing.
AUTOCAST_FP32: dict[str, dict[str, AutocastFp32]] = {
    "cuda": {
        "LayerNorm": AutocastFp32("layer_norm"),
        "GroupNorm": AutocastFp32("group_norm"),
        "RMSNorm": AutocastFp32("rms_norm", since=(2, 12)),
        "Softmax": AutocastFp32("softmax"),
        "LogSoftmax": AutocastFp32("log_softmax"),
        "Softplus": AutocastFp32("softplus"),
        "CosineSimilarity": AutocastFp32("cosine_similarity"),
        **_LOSSES,
    },
    # CUDA has no cross_entropy_loss entry: it runs log_softmax with the input's dtype given.
    "cpu": {"CrossEntropyLoss": AutocastFp32("cross_entropy_loss"), **_LOSSES},
}


def autocast_fp32_types(device: torch.device | str) -> frozenset[str]:
    """Names of the torch.nn module types autocast already runs in fp32 on this device type
    with the running torch: keepFp32 leaves them alone, at no cost."""
    major, minor = torch.__version__.split(".")[:2]
    version = (int(major), int(minor))
    table = AUTOCAST_FP32.get(torch.device(device).type, {})
    return frozenset(name for name, why in table.items() if version >= why.since)


def _fp32(value: Any) -> Any:
    """`value` with its floating tensors in fp32, also those nested in tuples (named ones too),
    lists and dicts. A container holding none is returned itself, not copied; anything else
    (integer tensors, other objects, other container types) is passed as it is."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    kind = type(value)
    if kind is dict:
        items = {key: _fp32(item) for key, item in value.items()}
        changed = any(items[key] is not item for key, item in value.items())
        return items if changed else value
    if kind is list or kind is tuple or is_namedtuple(value):
        converted = [_fp32(item) for item in value]
        if all(new is old for new, old in zip(converted, value, strict=True)):
            return value
        return converted if kind is list else tuple(converted) if kind is tuple else kind(*converted)
    return value


#: The attribute of a kept module holding (the forward it had, the autocast device type).
KEPT = "mpjob_kept_fp32"


def fp32_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A kept module's `forward`, bound to it: the one it had, with autocast off and floating
    tensor arguments (positional and keyword, also nested in tuples, lists and dicts) cast to
    fp32.

    Bound on the instance, so the module's class, parameters and state_dict keys stay as they
    were, and a deepcopy rebinds both methods to the copy. One function bound to each module,
    not an object per module: torch.compile guards a callable object by identity, so every new
    model instance in a process recompiled (and past dynamo's cache limit ran eagerly); a bound
    function it guards by its code. torch.compile traces the `with torch.autocast` branch (the
    form it supports on every torch the trainer runs on) without a graph break; eager calls flip
    the autocast flag directly, which costs a quarter of the context manager's host time.
    """
    forward, device_type = getattr(module, KEPT)
    positional, named = [_fp32(a) for a in args], {k: _fp32(v) for k, v in kwargs.items()}
    if torch.compiler.is_compiling():
        with torch.autocast(device_type, enabled=False):
            return forward(*positional, **named)
    enabled = torch.is_autocast_enabled(device_type)
    torch.set_autocast_enabled(device_type, False)
    try:
        return forward(*positional, **named)
    finally:
        torch.set_autocast_enabled(device_type, enabled)


def kept_in_fp32(module: nn.Module) -> bool:
    """Whether keep_fp32 runs this module in fp32 (its forward is fp32_forward, bound to it)."""
    forward = vars(module).get("forward")
    return isinstance(forward, types.MethodType) and forward.__func__ is fp32_forward


def keep_module_in_fp32(module: nn.Module, device_type: str) -> None:
    """Run `module` in fp32 under autocast (once: a module kept already is left as it is)."""
    if not kept_in_fp32(module):
        setattr(module, KEPT, (module.forward, device_type))
        module.forward = types.MethodType(fp32_forward, module)  # type: ignore[method-assign]


def keep_fp32(model: nn.Module, type_names: list[str], device: torch.device) -> list[str]:
    """Run modules whose type name is listed in fp32 under autocast; returns the names of those wrapped.

    torch.nn's own class of a type in autocast_fp32_types(device) is not touched: autocast runs it
    in fp32 already. Anything else of a listed name (a class of your own called LayerNorm too) gets
    fp32_forward. Calling it again wraps nothing twice.
    """
    wanted, free = set(type_names), autocast_fp32_types(device)
    wrapped: list[str] = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind not in wanted or (kind in free and type(module) is getattr(nn, kind, None)):
            continue
        keep_module_in_fp32(module, device.type)
        wrapped.append(name)
    return wrapped
