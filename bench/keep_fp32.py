"""keepFp32's host cost per call: a kept module against the bare one, eager and compiled.

Each module runs under CPU autocast (bf16) on a small bf16 input (8 x 64, so the arithmetic is
a few microseconds and the difference is host overhead), three ways: bare (not kept), kept by
the previous implementation (`--before FILE`: a precision.py whose keep_fp32 is loaded from
that file, e.g. the forward pre-hook/post-hook pair) and kept by the current one. Rows:
LayerNorm (wrapped on a CPU; on CUDA autocast runs it in fp32 and keepFp32 leaves it alone)
and MSELoss (autocast runs it in fp32 on both: never wrapped now). Compiled = `torch.compile`
(inductor) of a parent module that calls it (so it is traced inside a model's frame, not as
the root), under the same autocast; graph breaks come from `torch._dynamo.explain`. For the
timings dynamo is told to guard on module hooks: by default it does not
(`skip_nnmodule_hook_guards`), and a hooked module compiled after a bare one of the same class
is served the bare one's graph, in bf16; the last lines show which output dtype each
implementation gets that way.

Timing: CPU time of the calling thread (`time.thread_time`) over CALLS calls per sample,
REPEATS samples per variant taken in rotating order, median per call; the overhead is the
variant's median minus the bare module's.

Usage:
  git show 83a791f~1:trainer-image/mpjob_trainer/precision.py > /tmp/precision_before.py  # the hooks
  OMP_NUM_THREADS=1 uv run --no-sync python bench/keep_fp32.py --before /tmp/precision_before.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mpjob_trainer import precision

CALLS, REPEATS, WIDTH = 2000, 15, 64
CPU = torch.device("cpu")
KeepFp32 = Callable[[nn.Module, list[str], torch.device], list[str]]


def load_keep_fp32(path: Path) -> KeepFp32:
    """keep_fp32 from another copy of precision.py (the implementation before a change)."""
    spec = importlib.util.spec_from_file_location("precision_before", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module.keep_fp32  # type: ignore[no-any-return]


def subject(kind: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    x = torch.randn(8, WIDTH, dtype=torch.bfloat16)
    if kind == "LayerNorm":
        return nn.LayerNorm(WIDTH), (x,)
    return nn.MSELoss(), (x, torch.randn(8, WIDTH, dtype=torch.bfloat16))


def variants(kind: str, keepers: dict[str, KeepFp32], *, compiled: bool) -> dict[str, Callable[[], Any]]:
    """bare and one kept module per implementation, each a no-argument call."""
    calls: dict[str, Callable[[], Any]] = {}
    for label, keep in {"bare": None, **keepers}.items():
        module, inputs = subject(kind)
        if keep is not None:
            keep(module, [kind], CPU)
        calls[label] = bound(torch.compile(Host(module)) if compiled else module, inputs)
    return calls


class Host(nn.Module):
    """Compiled, the module is called from a parent's forward, as in a model (not as the root frame)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.inner(*inputs)


def bound(run: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    return lambda: run(*inputs)


def per_call_us(calls: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Median CPU time per call of each variant, samples taken in rotating order."""
    samples: dict[str, list[float]] = {label: [] for label in calls}
    labels = list(calls)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        for call in calls.values():  # warm-up, and the compile when compiled
            for _ in range(50):
                call()
        for repeat in range(REPEATS):
            for label in labels[repeat % len(labels) :] + labels[: repeat % len(labels)]:
                call, start = calls[label], time.thread_time()
                for _ in range(CALLS):
                    call()
                samples[label].append((time.thread_time() - start) / CALLS * 1e6)
    return {label: statistics.median(values) for label, values in samples.items()}


def graph_breaks(kind: str, keep: KeepFp32) -> int:
    module, inputs = subject(kind)
    keep(module, [kind], CPU)
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return int(torch._dynamo.explain(Host(module))(*inputs).graph_break_count)


def served_dtype(keep: KeepFp32) -> torch.dtype:
    """A kept LayerNorm's output dtype, compiled after a bare LayerNorm in the same process."""
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        bare, inputs = subject("LayerNorm")
        torch.compile(Host(bare))(*inputs)
        kept, inputs = subject("LayerNorm")
        keep(kept, ["LayerNorm"], CPU)
        return torch.compile(Host(kept))(*inputs).dtype  # type: ignore[no-any-return]


def report(kind: str, keepers: dict[str, KeepFp32]) -> None:
    for compiled in (False, True):
        times = per_call_us(variants(kind, keepers, compiled=compiled))
        bare = times.pop("bare")
        cells = "  ".join(f"{label} {t:6.1f} us (+{t - bare:5.1f})" for label, t in times.items())
        print(f"{kind:9s} {'compiled' if compiled else 'eager':8s} bare {bare:6.1f} us  {cells}")
    breaks = ", ".join(f"{label} {graph_breaks(kind, keep)}" for label, keep in keepers.items())
    print(f"{kind:9s} graph breaks under autocast: {breaks}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a precision.py to compare with (its keep_fp32)")
    args = parser.parse_args()
    keepers: dict[str, KeepFp32] = {}
    if args.before:
        keepers["before"] = load_keep_fp32(args.before)
    keepers["now"] = precision.keep_fp32
    cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split(":")[1].splitlines()[0].strip()
    print(f"torch {torch.__version__}, {cpu}, {torch.get_num_threads()} thread(s); per call, CPU time")
    print(f"autocast keeps in fp32 without help: cpu {sorted(precision.autocast_fp32_types('cpu'))}")
    print(f"                                     cuda {sorted(precision.autocast_fp32_types('cuda'))}")
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
        for kind in ("LayerNorm", "MSELoss"):
            report(kind, keepers)
    for label, keep in keepers.items():
        print(f"{label}: a kept LayerNorm compiled after a bare one returns {served_dtype(keep)} (fp32 is right)")


if __name__ == "__main__":
    main()
