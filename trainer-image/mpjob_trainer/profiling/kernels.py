"""Where a profile's kernel time went: low precision (fp16, bf16, fp8) or fp32 (the reference's
M11, kernel fallback rate). Pure: it reads the Chrome trace torch.profiler exported.

A kernel is judged by the dtypes of the operator that launched it (`Input type`, recorded with
`record_shapes`): any fp16/bf16/fp8 tensor input makes it low precision, float/double inputs
alone make it fp32, and an operator with no floating tensor input (indexing, copies of ints)
is not counted. On a GPU the time is the CUDA kernels' (linked to their operator by `External
id`); on a CPU, where operators are the kernels, it is each operator's self time (its duration
less its children's on the same thread: `aten::linear` under autocast is fp32 at its entry,
the `aten::addmm` inside it is bf16).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

LOW = ("c10::Half", "c10::BFloat16", "c10::Float8")
FP32 = ("float", "double")


@dataclass(frozen=True)
class KernelTime:
    """Microseconds of classified kernel time by precision."""

    low_us: float = 0.0
    fp32_us: float = 0.0

    @property
    def low_share(self) -> float | None:
        """Share of the classified time in low precision (None: nothing was classified)."""
        total = self.low_us + self.fp32_us
        return self.low_us / total if total > 0 else None


def op_class(types: Iterable[Any]) -> str | None:
    """ "low", "fp32" or None (no floating tensor input) for an operator's input types."""
    names = [t for t in types if isinstance(t, str)]
    if any(name.startswith(LOW) for name in names):
        return "low"
    if any(name in FP32 for name in names):
        return "fp32"
    return None


def _self_times(ops: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each operator with its self time: children nest inside their parent on one thread."""
    result: list[tuple[dict[str, Any], float]] = []
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for op in ops:
        by_thread.setdefault((op.get("pid"), op.get("tid")), []).append(op)
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda o: (float(o["ts"]), -float(o["dur"])))
        stack: list[list[Any]] = []  # [op, end, children's time]
        for op in thread_ops:
            start, dur = float(op["ts"]), float(op["dur"])
            while stack and stack[-1][1] <= start:
                done = stack.pop()
                result.append((done[0], float(done[0]["dur"]) - done[2]))
            if stack:
                stack[-1][2] += dur
            stack.append([op, start + dur, 0.0])
        result += [(item[0], float(item[0]["dur"]) - item[2]) for item in stack]
    return result


def timed_events(trace: dict[str, Any] | list[Any]) -> list[dict[str, Any]]:
    """The events of an exported Chrome trace that have a start and a duration."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [e for e in events if isinstance(e, dict) and isinstance(e.get("dur"), int | float) and "ts" in e]


def launches(
    events: list[dict[str, Any]], categories: Iterable[str] = ("kernel",)
) -> list[tuple[dict[str, Any], dict[str, Any] | None, float]]:
    """Each piece of device work of `categories` (kernels; copies and fills where asked), the
    operator that launched it (linked by `External id`; None: none) and its microseconds. On a
    trace with none (a CPU, where operators are the kernels): each operator, itself, its self time."""
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    wanted = frozenset(categories)
    device = [e for e in events if e.get("cat") in wanted]
    if not device:
        return [(op, op, max(0.0, us)) for op, us in _self_times(ops)]
    by_id = {_external_id(e): e for e in ops}
    return [(e, by_id.get(_external_id(e)), float(e["dur"])) for e in device]


def _external_id(event: dict[str, Any]) -> Any:
    return (event.get("args") or {}).get("External id")


def kernel_time(trace: dict[str, Any] | list[Any]) -> KernelTime:
    """The classified kernel time of an exported Chrome trace."""
    low = fp32 = 0.0
    for _, op, us in launches(timed_events(trace)):
        kind = op_class((op.get("args") or {}).get("Input type") or []) if op is not None else None
        if kind == "low":
            low += us
        elif kind == "fp32":
            fp32 += us
    return KernelTime(low, fp32)
