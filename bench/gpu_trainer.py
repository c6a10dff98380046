"""The trainer's runs for bench/trainer_gpu.py, and the figures read from its events.

As the pod runs it: `python -m mpjob_trainer` in a subprocess (trainer_run), its figures from
its own step events (trainer_figures) and the checkpoint stall from its checkpointStaged events
(checkpoint_stall: the seconds the training thread was blocked per save over the steps between
saves, at the default interval, checkpoint.everySteps 200); where its steps' time goes from the
trace it writes when asked for a profile on its metrics port (bench.gpu_profiled). Then, in this
process (in_process: one attempt trained as `python -m mpjob_trainer` trains it):

- the numeric guard's cost, as interleaved A/B runs (A, B, A, B, ...): A is the trainer as it
  is, B the same with the guard's per-step methods (begin_step, observe_loss, end_step,
  optimizer_stepped) replaced by no-ops, which only a benchmark may do;
- host syncs per step on CUDA: torch.cuda.set_sync_debug_mode("warn") warnings over two runs
  of different lengths with no log or checkpoint interval inside, the difference divided by
  the step difference.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from bench.fp8_rows import fp8_settings
from bench.gpu_setup import CUDA, Figures, Setup, precision_of, release
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import session
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.loop import train

NEVER = 10**8  # an interval no run reaches
GUARD_PER_STEP: dict[str, Any] = {  # methods, and the `applied` property
    "begin_step": lambda self: None,
    "observe_loss": lambda self, loss, spoilt=None: None,
    "end_step": lambda self, step, uses_scaler: None,
    "optimizer_stepped": lambda self, optimizer=None: True,  # "applied", as an ordinary step
    "applied": property(lambda self: True),  # and so read by the step's close (session.updates)
}


# ---------------------------------------------------------------- the trainer, as the pod runs it
def job_spec(setup: Setup, label: str, *, steps: int, log_every: int, every: int | None = None) -> dict:
    return {
        "task": {"builtin": "gpt", "args": setup.args},
        "training": {"steps": steps, "batchSize": setup.batch, "logEvery": log_every, "compile": setup.compile},
        "precision": {
            "mode": precision_of(label),
            "tf32": label.endswith("TF32"),
            **({"fp8": fp8_settings()} if precision_of(label) == "fp8" else {}),
        },
        "checkpoint": {"everySteps": every or setup.checkpoint_every},
        "resources": {"gpusPerWorker": 1 if CUDA else 0},
    }


def launch(spec: dict, label: str, tmp: str) -> dict:
    precision = precision_of(label)
    return {"jobName": "bench", "attempt": 0, "precision": precision, "checkpointDir": f"{tmp}/ckpt", "spec": spec}


def trainer_env(tmp: str) -> dict[str, str]:
    return {"MPJOB_METRICS_PORT": "off", "MPJOB_TERMINATION_LOG": f"{tmp}/report.json"}


#: The trainer as the pod runs it.
TRAINER = [sys.executable, "-m", "mpjob_trainer"]


def process_env(spec: dict, label: str, tmp: str, **extra: str) -> dict[str, str]:
    """The environment of a trainer process training `spec` in `label` (`extra` on top)."""
    return {**os.environ, **trainer_env(tmp), "MPJOB_LAUNCH": json.dumps(launch(spec, label, tmp)), **extra}


def events_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def trainer_run(setup: Setup, label: str) -> list[dict[str, Any]]:
    """The trainer as the pod runs it (`python -m mpjob_trainer`); its event lines."""
    spec = job_spec(setup, label, steps=setup.steps, log_every=setup.log_every)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(TRAINER, env=process_env(spec, label, tmp), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"trainer {label} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return events_of(out.stdout)


def windows(events: list[dict[str, Any]], warmup: int, last: int | None = None) -> list[dict[str, Any]]:
    """The trainer's step events of the windows after the warm-up (and up to step `last`)."""
    steps = [e for e in events if e["event"] == "step" and e["step"] > warmup and e.get("samplesPerSecond")]
    return [e for e in steps if last is None or e["step"] <= last]


def trainer_figures(events: list[dict[str, Any]], warmup: int, last: int | None = None) -> Figures:
    steps = windows(events, warmup, last)
    mfus = [e["mfu"] for e in steps if e.get("mfu") is not None]
    compiled = next((e["compiled"] for e in events if e["event"] == "compile"), None)
    return Figures(
        tokens_per_s=statistics.median(e["tokensPerSecond"] for e in steps),
        step_s=statistics.median(e["stepSeconds"] for e in steps),
        mfu=statistics.median(mfus) if mfus else None,
        peak_bytes=max((e.get("peakDeviceMemoryBytes") or 0) for e in steps) or None,
        compiled=compiled,
    )


# ---------------------------------------------------------------- a profile of its steps
# ---------------------------------------------------------------- the trainer in this process
@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def in_process(spec: dict, label: str, *, again: bool = False) -> list[dict[str, Any]]:
    """One attempt trained in this process, as `python -m mpjob_trainer` trains it; its events.
    It compiles afresh, as a new pod does (inductor's disk cache stays), unless it runs `again`
    the model of the runs before it: the A/B, profile and sync runs then reuse their graphs, and
    compile only a precision they did not (on the H200 each fresh compile of GPT-2 cost tens of
    seconds: eleven of them outlived the step's budget)."""
    if not again:
        release()
    out = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, environment(trainer_env(tmp)):
        attempt = AttemptLaunch.model_validate(launch(spec, label, tmp))
        try:
            with contextlib.redirect_stdout(out), session.start(launch=attempt) as run:
                train(run)
        except SystemExit as exc:
            raise RuntimeError(f"in-process trainer {label} exited {exc.code}:\n{out.getvalue()[-3000:]}") from None
    return events_of(out.getvalue())


@contextlib.contextmanager
def guard_per_step_off() -> Iterator[None]:
    """B of the A/B: NumericGuard's per-step methods as no-ops (the spec cannot turn it off)."""
    saved = {name: NumericGuard.__dict__[name] for name in GUARD_PER_STEP}
    for name, no_op in GUARD_PER_STEP.items():
        setattr(NumericGuard, name, no_op)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(NumericGuard, name, method)


def guard_ab(setup: Setup, label: str = "bf16") -> dict[str, Any]:
    """Median step time with the guard (A) and without its per-step work (B), interleaved."""
    spec = job_spec(setup, label, steps=setup.ab_steps, log_every=setup.log_every, every=NEVER)
    in_process(spec, label)  # warm-up: caches and allocator, counted by neither side
    times: dict[str, list[float]] = {"A": [], "B": []}
    for _ in range(setup.ab_pairs):
        for side in ("A", "B"):
            with guard_per_step_off() if side == "B" else contextlib.nullcontext():
                events = in_process(spec, label, again=True)
            times[side].append(statistics.median(e["stepSeconds"] for e in windows(events, setup.warmup)))
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    return {"precision": label, "pairs": setup.ab_pairs, "steps": setup.ab_steps, "guardOnSeconds": a,
            "guardOffSeconds": b, "overheadPercent": 100 * (a - b) / b, "runs": times}  # fmt: skip


def sync_warnings(spec: dict, label: str) -> int:
    """Synchronizing CUDA operations in one in-process run, as set_sync_debug_mode("warn") sees them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            in_process(spec, label, again=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


def syncs_per_step(setup: Setup, label: str, lengths: tuple[int, int] = (10, 30)) -> float | None:
    """Host syncs per optimizer step: two runs with no interval inside (only the last step's),
    the difference of their counts over the difference of their lengths."""
    if not CUDA:
        return None
    specs = [job_spec(setup, label, steps=n, log_every=NEVER, every=NEVER) for n in lengths]
    # Warm-up, so that neither counted run compiles: it reuses the graphs of a run before it in
    # this precision (the guard's A/B, the profile), else compiles them beside those it holds.
    in_process(specs[0], label, again=True)
    short, long = (sync_warnings(spec, label) for spec in specs)
    return (long - short) / (lengths[1] - lengths[0])


def checkpoint_stall(events: list[dict[str, Any]], step_s: float, every: int) -> dict[str, Any] | None:
    """The training thread's blocked seconds per save (checkpointStaged: the asynchronous saves,
    not the final one) over the time of the `every` steps between saves; None without one."""
    total = next(e["totalSteps"] for e in events if e["event"] == "start")
    staged = [e for e in events if e["event"] == "checkpointStaged" and e["step"] < total]
    if not staged:
        return None
    per_save = statistics.mean(e["stallSeconds"] for e in staged)
    percent = 100 * per_save / (every * step_s)
    return {"everySteps": every, "saves": len(staged), "stallSeconds": per_save, "percent": percent}
