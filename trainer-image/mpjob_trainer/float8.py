"""fp8 attempts: torchao's float8 linears for the model's eligible nn.Linear modules.

An fp8 attempt swaps eligible linears for torchao's `Float8Linear` (convert_to_float8_training,
before compile and DDP) and runs everything else under bf16 autocast. Float8Linear keeps the
fp32 weight as a plain Parameter and computes its scales per call (dynamic scaling), so the
state_dict is the plain model's: a checkpoint written in fp8 resumes in bf16 or fp32 and back.
`convert` checks that once after converting (a float8 tensor subclass in the state would make
checkpoints unreadable without torchao).

Which linears: not the first and not the last of the model (embedding-side and output
projections are the most sensitive to fp8's 3-bit mantissa, as torchtitan's filters keep
them), none whose dimensions fp8 kernels cannot take (not multiples of 16), none that
precision.fp8.skip names (dotted names or fnmatch patterns), and none of a precision.keepFp32
type or inside a module of one: keep_fp32 runs those in fp32 as in bf16, which a float8 linear,
casting its own operands, would not (autocast off changes nothing for it). The trainer logs
which were converted and why the others were not (the `fp8` event).

Which calls: a converted linear computes in fp8 only when the rows it is given (the tokens of
the micro-batch: every dimension but the last) are a multiple of 16 too, since its weight
gradient is a matmul over those rows; a call with other rows (a micro-batch of 8 samples, an
epoch's short last batch) runs that linear as a plain one, in bf16, instead of failing in the
backward. An `auto` attempt's fp8 probe times what such steps do, so fp8 is chosen only where
it is faster.

The same process also runs the model in other precisions: the fp32 replay of a fault, the
quality gate's fp32 reference, an `auto` attempt's bf16 and fp32 probes. `Fp8Linears.enable`
switches the converted modules between Float8Linear and plain nn.Linear for those modes
(session.modes does it on every mode change): the class is swapped on the instance (both
classes lay out the same parameters; Float8Linear adds only its config attributes), so the
parameters, their optimizer state and DDP's hooks stay as they are, and a linear FSDP2 made a unit
of its own stays one, its class FSDP2's subclass both ways. Host-only, no sync.

torchao is an optional extra (`mpjob-trainer[fp8]`), imported only here, only for fp8.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from mpjob_contract.fp8 import FP8_DIM_MULTIPLE, FP8_MIN_CAPABILITY, Fp8Spec, fp8_capable
from mpjob_trainer.errors import ConfigError

#: Why a linear stayed in bf16 (the `fp8` event's `kept` values); KEEP_FP32's runs in fp32.
FIRST, LAST, DIMS, SKIPPED = "first linear", "last linear", f"dimensions not multiples of {FP8_DIM_MULTIPLE}", "skip"
KEEP_FP32 = "keepFp32"


def capability_of(device: torch.device) -> tuple[int, int] | None:
    """The device's compute capability (None: not a CUDA device)."""
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None  # type: ignore[return-value]


def describe_device(device: torch.device) -> str:
    """'NVIDIA A100-SXM4-80GB (cuda:0, compute capability 8.0)' or 'cpu'."""
    capability = capability_of(device)
    if capability is None:
        return str(device)
    return f"{torch.cuda.get_device_name(device)} ({device}, compute capability {capability[0]}.{capability[1]})"


def require_fp8_device(spec: Fp8Spec, device: torch.device) -> None:
    """A configuration error, naming the device and the fields, unless this device has fp8 tensor
    cores or precision.fp8.emulate is set."""
    if spec.emulate or fp8_capable(capability_of(device)):
        return
    need = ".".join(str(n) for n in FP8_MIN_CAPABILITY)
    raise ConfigError(
        f"precision.mode fp8 needs a GPU of compute capability >= {need} (fp8 tensor cores: Ada, Hopper or "
        f"later); this process runs on {describe_device(device)}. Choose precision.mode bf16 or auto, or set "
        "precision.fp8.emulate: true to emulate fp8 (tests and CPUs; not faster)"
    )


def plan(
    linears: list[tuple[str, nn.Linear]], skip: Iterable[str], kept_fp32: Iterable[str] = ()
) -> dict[str, str | None]:
    """Each linear's name -> why it stays out of fp8, or None when it is converted. `kept_fp32`:
    the names of the modules keepFp32 runs in fp32 (a linear among them or inside one stays)."""
    patterns, kept = list(skip), list(kept_fp32)
    last = len(linears) - 1
    verdicts: dict[str, str | None] = {}
    for i, (name, linear) in enumerate(linears):
        why = None
        if any(name == k or name.startswith(f"{k}.") or not k for k in kept):
            why = KEEP_FP32
        elif i == 0:
            why = FIRST
        elif i == last:
            why = LAST
        elif linear.in_features % FP8_DIM_MULTIPLE or linear.out_features % FP8_DIM_MULTIPLE:
            why = DIMS
        elif any(fnmatch.fnmatchcase(name, p) for p in patterns):
            why = SKIPPED
        verdicts[name] = why
    return verdicts


class Fp8Linears:
    """The converted linears of one model, and the switch between fp8 and plain linears."""

    def __init__(self, modules: dict[str, nn.Module], kept: dict[str, str]) -> None:
        self.modules = modules
        self.kept = kept
        self.float8_class: dict[str, type[nn.Module]] = {name: type(m) for name, m in modules.items()}
        self.enabled = True

    @property
    def names(self) -> list[str]:
        return list(self.modules)

    def require_any(self) -> None:
        """An fp8 forward pass needs a converted linear: with none (every linear kept, or none in the
        model) the attempt would train bf16 under fp8's name, its status and metrics saying fp8."""
        if self.modules:
            return
        kept = [f"{name}: {why}" for name, why in self.kept.items()]
        listed = ", ".join(kept[:5]) + (f", and {len(kept) - 5} more" if len(kept) > 5 else "")
        raise ConfigError(
            f"precision.mode fp8: no linear of the model can run in fp8 ({listed or 'it has no nn.Linear'}): an fp8 "
            "attempt would train bf16 under fp8's name. Choose precision.mode bf16, or see docs/fp8.md for the "
            "linears fp8 takes"
        )

    def enable(self, on: bool) -> None:
        """Run the converted linears in fp8 (True) or as plain nn.Linear (False). A linear sharded on
        its own since it was converted (FSDP2 made its class its own subclass of FSDPModule) stays
        one both ways, its FSDP2 methods with it."""
        if on == self.enabled:
            return
        for name, module in self.modules.items():
            if on:
                module.__class__ = self.float8_class[name]
            else:
                self.float8_class[name] = type(module)
                module.__class__ = plain_linear_class(type(module))
        self.enabled = on


#: nn.Linear as an FSDP2 unit (`plain_linear_class`), made once.
_SHARDED_LINEAR: list[type[nn.Module]] = []


def plain_linear_class(float8_class: type[nn.Module]) -> type[nn.Module]:
    """The class a converted linear of `float8_class` runs as a plain one: nn.Linear, or, where
    FSDP2 made the linear a unit of its own (its class derives from FSDPModule), nn.Linear as such
    a unit, FSDPModule first as fully_shard places it."""
    if not any(base.__name__ == "FSDPModule" for base in float8_class.__mro__):
        return nn.Linear
    if not _SHARDED_LINEAR:
        from torch.distributed.fsdp import FSDPModule

        _SHARDED_LINEAR.append(type("FSDPLinear", (FSDPModule, nn.Linear), {}))
    return _SHARDED_LINEAR[0]


def fp8_rows(input: torch.Tensor) -> bool:
    """Whether fp8 kernels take this input's rows (all but the last dimension, flattened)."""
    features = input.shape[-1]
    return features > 0 and (input.numel() // features) % FP8_DIM_MULTIPLE == 0


#: One row-checked class per torchao linear class (`rows_checked`).
_ROWS_CHECKED: dict[type[nn.Module], type[nn.Module]] = {}


def rows_checked(float8_class: type[nn.Module]) -> type[nn.Module]:
    """`float8_class` whose calls with rows fp8 kernels cannot take run as a plain nn.Linear."""
    if float8_class in _ROWS_CHECKED:
        return _ROWS_CHECKED[float8_class]

    def forward(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:
        if fp8_rows(input):
            return float8_class.forward(self, input)  # type: ignore[no-any-return]
        return nn.Linear.forward(self, input)

    made = _ROWS_CHECKED[float8_class] = type(
        f"RowChecked{float8_class.__name__}", (float8_class,), {"forward": forward}
    )
    return made


def torchao_float8() -> Any:
    """torchao.float8, or a configuration error saying how to get it."""
    try:
        import torchao.float8 as float8
    except ImportError as exc:
        raise ConfigError(
            f"precision.mode fp8 needs torchao (the trainer's fp8 extra: pip install 'mpjob-trainer[fp8]'): {exc}"
        ) from exc
    return float8


def convert(model: nn.Module, spec: Fp8Spec, keep_fp32: Iterable[str] = ()) -> Fp8Linears:
    """Swap the model's eligible linears for torchao Float8Linear, in place (before compile and
    wrap), per precision.fp8's recipe, skip list and emulate, and precision.keepFp32's types."""
    float8 = torchao_float8()
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear and name]
    types = set(keep_fp32)
    verdicts = plan(linears, spec.skip, [name for name, m in model.named_modules() if type(m).__name__ in types])
    chosen = {name for name, why in verdicts.items() if why is None}
    config = dataclasses.replace(float8.Float8LinearConfig.from_recipe_name(spec.recipe), emulate=spec.emulate)
    if chosen:
        float8.convert_to_float8_training(model, config=config, module_filter_fn=lambda _m, fqn: fqn in chosen)
    modules = dict(model.named_modules())
    for name in chosen:
        modules[name].__class__ = rows_checked(type(modules[name]))
    require_plain_state(model.state_dict().items())
    kept = {name: why for name, why in verdicts.items() if why is not None}
    return Fp8Linears({name: modules[name] for name in sorted(chosen)}, kept)


def require_plain_state(state: Iterable[tuple[str, Any]]) -> None:
    """Checkpoints hold plain tensors only (any precision resumes them, torchao or not)."""
    for key, value in state:
        if isinstance(value, torch.Tensor) and type(value) not in (torch.Tensor, nn.Parameter):
            raise ConfigError(
                f"fp8 conversion left a {type(value).__name__} in the model's state ({key}): checkpoints must hold "
                "plain tensors so that bf16 and fp32 attempts can resume them"
            )
