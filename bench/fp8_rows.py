"""fp8 beside bf16 for bench/trainer_gpu.py: the trainer in fp8 at the benchmark's shape, and
bf16 and fp8 at a larger shape where fp8 pays.

fp8's gain is in its matmuls: torchao's float8 linears run `torch._scaled_mm` on fp8 tensor
cores (compute capability >= 8.9) at twice bf16's dense peak, but every call also scales and
casts its inputs, which costs memory bandwidth in proportion to the activations. At GPT-2
124M (768 wide) the casts eat most of the gain; at ~1B parameters (2048 wide, sequence 2048)
the matmuls dominate and torchao/torchtitan report 1.2-1.5x. LARGE is that shape: a decoder of
the `gpt` task's layout (LayerNorm, GELU MLP, learned positions; the builtin tasks have no
RMSNorm/SwiGLU/RoPE variant) with 18 layers of width 2048, 16 heads, sequence 2048 and GPT-2's
vocabulary: 18 x 12 x 2048^2 + 2 x 50304 x 2048 = 1.11e9 parameters. Both precisions compile
(torchao needs torch.compile for its speed: its casts fuse into the neighbouring kernels).

On a GPU below compute capability 8.9 the fp8 rows say so and are skipped; on a CPU (--tiny)
fp8 runs emulated (precision.fp8.emulate) and these rows run eagerly (inductor's CPU compile of
three more models would double the smoke run's time for figures that mean nothing there) and
for two log windows after the warm-up: it exercises the code paths and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from bench.gpu_profile import profile_lines
from mpjob_contract.fp8 import fp8_capable

#: The larger shape (see the module docstring); batch 4 x 2048 tokens a step.
LARGE_1B = {"nLayer": 18, "nHead": 16, "nEmbd": 2048, "blockSize": 2048, "vocabSize": 50304, "data": "random"}
LARGE_BATCH = 4
#: --tiny's stand-in for LARGE: twice TINY's width, so that the converted linears exist (the
#: default skip keeps the first and last linear and any dimension not a multiple of 16).
LARGE_TINY = {"nLayer": 2, "nHead": 2, "nEmbd": 128, "blockSize": 32, "vocabSize": 512, "data": "random"}
#: docs/benchmarks.md's target on H100/H200: fp8 tokens/s over bf16's at the larger shape.
FP8_OVER_BF16_TARGET = 1.25


def fp8_hardware() -> bool:
    """Whether this machine's GPU has fp8 tensor cores."""
    return torch.cuda.is_available() and fp8_capable(tuple(torch.cuda.get_device_capability(0)))  # type: ignore[arg-type]


def fp8_settings() -> dict[str, Any]:
    """precision.fp8 of the benchmark's fp8 runs: real fp8 where the GPU has it, else emulated."""
    return {"recipe": "tensorwise", "emulate": not fp8_hardware()}


def fp8_skipped() -> str | None:
    """Why fp8 rows are not run on this machine (None: they are)."""
    if torch.cuda.is_available() and not fp8_hardware():
        major, minor = torch.cuda.get_device_capability(0)
        return f"n/a (compute capability {major}.{minor} < 8.9: no fp8 tensor cores)"
    return None


def large_setup(setup: Any, *, tiny: bool) -> Any:
    """The benchmark's Setup at the larger shape (the same steps, windows and compile)."""
    return replace(setup, args=LARGE_TINY if tiny else LARGE_1B, batch=setup.batch if tiny else LARGE_BATCH)


def ratio_line(figures: dict[str, Any]) -> str:
    """'fp8 / bf16 tokens/s at the larger shape: 1.31x (target >= 1.25x on H100/H200)'."""
    bf16, fp8 = figures.get("bf16"), figures.get("fp8")
    if bf16 is None or fp8 is None:
        return "fp8 / bf16 tokens/s at the larger shape: n/a (no fp8 row)"
    return (
        f"fp8 / bf16 tokens/s at the larger shape: {fp8.tokens_per_s / bf16.tokens_per_s:.2f}x "
        f"(target >= {FP8_OVER_BF16_TARGET}x on H100/H200)"
    )


def profiled_row(label: str, large: Any, run: Callable[..., Any], show: Callable[[str, Any], None]) -> tuple[Any, Any]:
    """One row at the larger shape and where its steps' time went."""
    figures, profile = run(large, label, profile=True)
    show(f"{label} @L", figures)
    return figures, profile


def fp8_rows(
    setup: Any,
    *,
    tiny: bool,
    run: Callable[..., Any],
    show: Callable[[str, Any], None],
) -> dict[str, Any]:
    """bf16 and fp8 at the larger shape (the target's ratio), each with a profile of steps after
    its measured ones (kinds of kernel side by side: where fp8 gained and where it did not), then
    the trainer's fp8 row at the benchmark's shape: a run stopped at its budget has printed the
    rows that matter most first. `run(setup, label, profile=...)` trains one attempt and returns
    its Figures and (profile=True) its profile (bench.gpu_profile); `show` prints a row."""
    skipped = fp8_skipped()
    if tiny:  # two windows after the warm-up: the smoke run only needs each path to run
        setup = replace(setup, compile="never", steps=setup.warmup + 2 * setup.log_every)
    out: dict[str, Any] = {"skipped": skipped, "largeShape": LARGE_TINY if tiny else LARGE_1B, "large": {}}
    profiles: dict[str, Any] = {}
    large = large_setup(setup, tiny=tiny)
    for label in ("bf16", "fp8") if skipped is None else ("bf16",):
        out["large"][label], profiles[label] = profiled_row(label, large, run, show)
    print(ratio_line(out["large"]), flush=True)
    for profile in profiles.values():
        print("\n".join(profile_lines(profile)), flush=True)
    out["largeProfiles"] = profiles
    if skipped is None:
        out["fp8"], _ = run(setup, "fp8", profile=False)
        show("fp8", out["fp8"])
    else:
        print(f"fp8 rows: {skipped}", flush=True)
    return out
