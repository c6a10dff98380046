"""The per-step checks of a script's own precision code, alone: what each adds to a step.

A loop on the SDK runs, each step, `run.autocast()` (a context that marks the session's own
autocast, session.modes), the forward pre-hook that refuses a script's own autocast
(session.own_autocast), `run.backward()` inside the same mark (a forward recomputed there is
the session's own), and `run.step()`, whose optimizer carries a step pre-hook refusing an fp16
step outside it (session.steps) and which keeps which optimizers the loop unscaled itself
(`run.unscale`). A whole-loop A/B (bench/sdk_overhead.py) cannot resolve microseconds on a
shared machine, so each piece is timed here against what the step ran without it, in one
process: blocks of N calls, A then B, ROUNDS times, the median of the per-block differences
in thread CPU time (drift in the machine's load falls on both halves of a pair alike).

No piece reads a device value: the host reads per step are bench/sdk_overhead.py's to count.
Usage: PYTHONPATH=. python bench/check_overhead.py
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable

import torch
from torch import nn

from mpjob_contract.api import Guard, PrecisionSpec
from mpjob_trainer.distributed import World
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.steps import AppliedSteps, StepNumerics

N, ROUNDS = 2000, 41
CPU = torch.device("cpu")


def added(before: Callable[[], object], after: Callable[[], object]) -> tuple[float, float]:
    """(microseconds per call of `before`, microseconds `after` adds), medians over the rounds."""
    costs, extra = [], []
    for _ in range(ROUNDS):
        t0 = time.thread_time()
        for _ in range(N):
            before()
        t1 = time.thread_time()
        for _ in range(N):
            after()
        t2 = time.thread_time()
        costs.append((t1 - t0) / N * 1e6)
        extra.append(((t2 - t1) - (t1 - t0)) / N * 1e6)
    return statistics.median(costs), statistics.median(extra)


def pieces() -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """(what, the step without it, the step with it) for each new piece."""
    amp = AttemptPrecision("fp16", CPU, PrecisionSpec.model_validate({"mode": "fp16"}))
    guard = NumericGuard(Guard(), CPU, World(rank=0, size=1, local_rank=0))
    param = nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    plain, hooked = torch.optim.SGD([param], lr=0.0), torch.optim.SGD([param], lr=0.0)
    AppliedSteps(guard).watch(plain)  # the post-hook the step had before
    StepNumerics(amp, guard).watch(hooked)  # and the pre-hook (a framework's: the check returns at once)
    early = weakref.WeakSet[torch.optim.Optimizer]()  # the optimizers the loop unscaled before step()

    def nothing() -> None:
        pass

    def policy_autocast() -> None:
        with amp.policy.autocast():
            pass

    def run_autocast() -> None:
        with amp.autocast():
            pass

    def ours() -> None:
        with amp.ours():
            pass

    def unscale_bookkeeping() -> bool:  # the set operations StepNumerics.step and close added
        unscaled_early = plain in early
        early.discard(plain)
        early.clear()
        return unscaled_early

    return [
        ("run.autocast(): the session's mark around the mode's autocast", policy_autocast, run_autocast),
        ("run.backward(): the same mark around backward", nothing, ours),
        ("the optimizer's step pre-hook (the fp16 own-step check)", plain.step, hooked.step),
        (
            "run.unscale's bookkeeping in step() and end_step() (a stand-in: the same set operations)",
            nothing,
            unscale_bookkeeping,
        ),
    ]


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {ROUNDS} rounds of {N} calls, thread CPU time")
    total = 0.0
    for what, before, after in pieces():
        cost, extra = added(before, after)
        total += extra
        print(f"{what}: +{extra:.2f} us (the call without it: {cost:.2f} us)", flush=True)
    print(f"added per step (one optimizer, forward check already there): {total:.2f} us")


if __name__ == "__main__":
    main()
