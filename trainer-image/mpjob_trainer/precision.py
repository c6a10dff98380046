"""Precision policy of an attempt: autocast dtype, GradScaler, modules kept in fp32 (F4).

fp32: no autocast (TF32 matmuls only when spec.precision.tf32). fp16: autocast + GradScaler
from spec.precision.lossScale; master weights stay fp32 (the model is never cast). bf16:
autocast, no scaler (bf16 has fp32's exponent range).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mpjob_contract.api import Precision, PrecisionSpec, resolve_auto

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def device_capability(device: torch.device) -> tuple[int, int] | None:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return (major, minor)
    return None


def resolve(requested: str, device: torch.device) -> Precision:
    """`auto`: bf16 on compute capability >= 8.0 and CPU, fp16 on 7.x, fp32 below."""
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
        return self.precision == "fp16"

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
        return torch.amp.GradScaler(
            self.device.type,
            init_scale=ls.init,
            growth_factor=ls.growth_factor,
            backoff_factor=ls.backoff_factor,
            growth_interval=ls.growth_interval,
        )


@contextlib.contextmanager
def _fp32_region(device_type: str) -> Iterator[None]:
    with torch.autocast(device_type=device_type, enabled=False):
        yield


def keep_fp32(model: nn.Module, type_names: list[str], device: torch.device) -> list[str]:
    """Run modules whose type name is listed in fp32 under autocast; returns what was wrapped."""
    wanted = set(type_names)
    wrapped: list[str] = []
    regions: dict[int, contextlib.AbstractContextManager[None]] = {}

    def pre_hook(mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        region = regions[id(mod)] = _fp32_region(device.type)
        region.__enter__()
        return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    def post_hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
        regions.pop(id(mod)).__exit__(None, None, None)
        return out

    for name, module in model.named_modules():
        if type(module).__name__ not in wanted:
            continue

        module.register_forward_pre_hook(pre_hook)
        module.register_forward_hook(post_hook)
        wrapped.append(name)
    return wrapped
