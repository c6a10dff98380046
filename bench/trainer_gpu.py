"""The trainer on a GPU beside a compiled nanoGPT loop, in one run.

GPT-2 124M (vocabulary 50304, 12 layers, 12 heads, 768 wide, sequence 1024) on synthetic
tokens (the `gpt` task's `data: random`), trained by mpjob's trainer, run as
`python -m mpjob_trainer` the way the pod runs it, and by nanoGPT's loop (bench/baseline.py:
the model torch.compile'd, fused AdamW, nanoGPT's weight-decay groups) over the same model
class and data, in fp32 with TF32 off and on, fp16 and bf16; then the trainer in fp8 (torchao
float8, compute capability >= 8.9) at that shape, and bf16 and fp8 at a ~1B-parameter shape
at sequence 2048 where fp8 pays (bench/fp8_rows.py). Per precision and side:
tokens/s, MFU (against the device's dense bf16 peak, mpjob_trainer.metrics.peak_flops) and
peak memory, the medians of the log windows (10 steps) after a 20-step warm-up (the
trainer's own step events; the loop's windows are synchronized at the same edges). Both
sides compile (training.compile always). Then, in this process:

- the numeric guard's cost, as interleaved A/B runs (A, B, A, B, ...): A is the trainer as it
  is, B the same with the guard's per-step methods (begin_step, observe_loss, end_step,
  optimizer_stepped) replaced by no-ops, which only a benchmark may do;
- the checkpoint stall at the default interval (checkpoint.everySteps 200): the seconds the
  training thread was blocked per save, from the trainer's checkpointStaged events, over the
  200 steps between saves;
- host syncs per step on CUDA: torch.cuda.set_sync_debug_mode("warn") warnings over two runs
  of different lengths with no log or checkpoint interval inside, the difference divided by
  the step difference.

The targets (H100/H200) are printed beside the figures. `--tiny` runs the same code paths on
the CPU (every CUDA-only figure reads "n/a (no CUDA)") with a 2-layer model, 40-step runs,
5-step windows and a 20-step checkpoint interval; `--json PATH` writes all figures.

    PYTHONPATH=. python bench/trainer_gpu.py                  # on a CUDA machine
    PYTHONPATH=. python bench/trainer_gpu.py --tiny           # CPU smoke run of the same paths
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.baseline import NanoGPTLoop, random_batches
from bench.fp8_rows import fp8_rows, fp8_settings
from mpjob_contract.api import Checkpoint
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import session
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.loop import train
from mpjob_trainer.metrics import peak_flops
from mpjob_trainer.tasks.gpt import make_task

CUDA = torch.cuda.is_available()
NA = "n/a (no CUDA)"
NOT_MEASURED = "not measured (left out of this run)"
GPT2_124M = {"nLayer": 12, "nHead": 12, "nEmbd": 768, "blockSize": 1024, "vocabSize": 50304, "data": "random"}
TINY = {"nLayer": 2, "nHead": 2, "nEmbd": 64, "blockSize": 32, "vocabSize": 512, "data": "random"}
PRECISIONS = ("fp32", "fp32+TF32", "fp16", "bf16")
#: What a run measures, in this order (--parts): the precisions side by side, the fp8 rows, the
#: guard's A/B, the host syncs per step.
PARTS = ("side", "fp8", "guard", "syncs")
#: checkpoint.everySteps' default: the side-by-side runs are longer, so one save falls inside.
CHECKPOINT_EVERY = Checkpoint().every_steps
NEVER = 10**8  # an interval no run reaches
#: --tiny compiles too: inductor's cold compile of TINY (forward and backward, one thread) took
#: 24-29 s per precision and side on the 2-core CPU of docs/benchmarks.md, 2.5 s from a warm
#: cache: within the ~60 s per precision a smoke run may spend (--compile never skips it).
TINY_COMPILE = "always"
GUARD_PER_STEP: dict[str, Callable[..., Any]] = {
    "begin_step": lambda self: None,
    "observe_loss": lambda self, loss: None,
    "end_step": lambda self, step, uses_scaler: None,
    "optimizer_stepped": lambda self, optimizer=None: True,  # "applied", as an ordinary step
}


@dataclass(frozen=True)
class Setup:
    args: dict[str, Any]
    batch: int
    steps: int  # of each side-by-side run: past checkpoint_every, so one save is staged inside
    compile: str  # training.compile of the trainer; the nanoGPT loop compiles unless "never"
    log_every: int = 10
    warmup: int = 20  # steps left out of every figure (compilation, allocator warm-up)
    checkpoint_every: int = CHECKPOINT_EVERY
    ab_pairs: int = 4
    ab_steps: int = 100


@dataclass(frozen=True)
class Figures:
    tokens_per_s: float
    step_s: float
    mfu: float | None
    peak_bytes: int | None
    compiled: bool | None  # None: the trainer did not say


def precision_of(label: str) -> str:
    return label.split("+")[0]


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


def events_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def trainer_run(setup: Setup, label: str) -> list[dict[str, Any]]:
    """The trainer as the pod runs it (`python -m mpjob_trainer`); its event lines."""
    spec = job_spec(setup, label, steps=setup.steps, log_every=setup.log_every)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, **trainer_env(tmp), "MPJOB_LAUNCH": json.dumps(launch(spec, label, tmp))}
        cmd = [sys.executable, "-m", "mpjob_trainer"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"trainer {label} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return events_of(out.stdout)


def windows(events: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """The trainer's step events of the windows after the warm-up."""
    return [e for e in events if e["event"] == "step" and e["step"] > warmup and e.get("samplesPerSecond")]


def trainer_figures(events: list[dict[str, Any]], warmup: int) -> Figures:
    steps = windows(events, warmup)
    mfus = [e["mfu"] for e in steps if e.get("mfu") is not None]
    compiled = next((e["compiled"] for e in events if e["event"] == "compile"), None)
    return Figures(
        tokens_per_s=statistics.median(e["tokensPerSecond"] for e in steps),
        step_s=statistics.median(e["stepSeconds"] for e in steps),
        mfu=statistics.median(mfus) if mfus else None,
        peak_bytes=max((e.get("peakDeviceMemoryBytes") or 0) for e in steps) or None,
        compiled=compiled,
    )


# ---------------------------------------------------------------- nanoGPT's loop, same model and data
def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


@contextlib.contextmanager
def tf32(allowed: bool) -> Iterator[None]:
    """TF32 matmuls as the trainer's fp32 attempts set them (precision.tf32)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def timed_windows(step: Callable[[], None], setup: Setup) -> list[float]:
    """Seconds per step of each `log_every` window after the warm-up, synchronized at the
    window edges (where the trainer reads its interval)."""
    for _ in range(setup.warmup):
        step()
    sync()
    per_step = []
    for _ in range((setup.steps - setup.warmup) // setup.log_every):
        start = time.perf_counter()
        for _ in range(setup.log_every):
            step()
        sync()
        per_step.append((time.perf_counter() - start) / setup.log_every)
    return per_step


def release() -> None:
    """Give back what a run in this process held (compiled graphs, cached device memory), so
    the next run, here or in a trainer process, starts with the whole device."""
    torch.compiler.reset()
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()


def baseline_run(setup: Setup, label: str) -> Figures:
    device = torch.device("cuda" if CUDA else "cpu")
    release()
    torch.manual_seed(0)
    task = make_task(setup.args)
    flops, tokens = task.flops_per_sample or 0.0, task.tokens_per_sample or 0
    data = random_batches(task.dataset, setup.batch, device)
    compiled = setup.compile != "never"
    loop = NanoGPTLoop(task.model.to(device), task.loss, data, precision=precision_of(label), compiled=compiled)
    if CUDA:
        torch.cuda.reset_peak_memory_stats(device)
    with tf32(label.endswith("TF32")):
        step_s = statistics.median(timed_windows(loop.step, setup))
    peak_bytes = torch.cuda.max_memory_allocated(device) if CUDA else None
    del task, loop, data
    release()
    peak, samples_per_s = peak_flops(device), setup.batch / step_s
    return Figures(
        tokens_per_s=samples_per_s * tokens,
        step_s=step_s,
        mfu=samples_per_s * flops / peak if peak else None,
        peak_bytes=peak_bytes,
        compiled=compiled,
    )


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


def in_process(spec: dict, label: str) -> list[dict[str, Any]]:
    """One attempt trained in this process, as `python -m mpjob_trainer` trains it; its events."""
    release()  # compile afresh, as a new pod does (inductor's disk cache stays)
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
                events = in_process(spec, label)
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
            in_process(spec, label)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


def syncs_per_step(setup: Setup, label: str, lengths: tuple[int, int] = (10, 30)) -> float | None:
    """Host syncs per optimizer step: two runs with no interval inside (only the last step's),
    the difference of their counts over the difference of their lengths."""
    if not CUDA:
        return None
    specs = [job_spec(setup, label, steps=n, log_every=NEVER, every=NEVER) for n in lengths]
    in_process(specs[0], label)  # warm-up: both counted runs then compile from the same caches
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


# ---------------------------------------------------------------- what it prints
def device_line() -> str:
    if CUDA:
        return f"device: {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}); torch {torch.__version__}"
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    cpu = names[0] if names else platform.processor() or "unknown CPU"
    return f"device: CPU ({cpu}, {os.cpu_count()} cores), no CUDA; torch {torch.__version__}"


def percent(value: float | None) -> str:
    return f"{value * 100:.1f} %" if value is not None else NA


def row(label: str, side: str, f: Figures) -> str:
    memory = f"{f.peak_bytes / 2**30:.2f} GiB" if f.peak_bytes else NA
    how = {True: "compiled", False: "eager", None: "compile ?"}[f.compiled]
    return (
        f"{label:<10} {side:<8} {how:<9} {f.tokens_per_s:>12,.0f} tok/s {f.step_s * 1e3:>9.2f} ms/step  "
        f"MFU {percent(f.mfu):<14} peak memory {memory}"
    )


def targets(results: dict[str, dict[str, Figures]], extra: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, figure, target) for the targets of docs/benchmarks.md, which hold on H100/H200;
    "not measured" where this run left the figure out (--precisions, --parts)."""
    bf16, fp32 = (results[p]["mpjob"] if p in results else None for p in ("bf16", "fp32"))
    stall, syncs, guard = extra.get("checkpointStall"), extra.get("syncsPerStep"), extra.get("guard")
    ratio = extra.get("bf16VsNanoGPT")
    if stall:
        stall_figure = f"{stall['percent']:.2f} % at everySteps {stall['everySteps']}"
    else:
        stall_figure = "no checkpointStaged event" if bf16 else NOT_MEASURED
    if syncs is None:
        sync_figure = NOT_MEASURED
    else:
        sync_figure = " / ".join(f"{syncs[p]:g}" for p in ("bf16", "fp16")) if CUDA else NA
    return [
        ("bf16 MFU (mpjob)", percent(bf16.mfu) if bf16 else NOT_MEASURED, ">= 50 %"),
        ("bf16 tokens/s, mpjob / nanoGPT loop", f"{ratio:.3f}" if ratio else NOT_MEASURED, ">= 0.95"),
        ("bf16 / strict fp32 tokens/s (mpjob)",
         f"{bf16.tokens_per_s / fp32.tokens_per_s:.2f}x" if bf16 and fp32 else NOT_MEASURED, ">= 6x"),
        ("guard overhead (bf16 step time)", f"{guard['overheadPercent']:+.2f} %" if guard else NOT_MEASURED,
         "<= 0.5 %"),
        ("checkpoint stall (bf16)", stall_figure, f"<= 1 % at everySteps {CHECKPOINT_EVERY}"),
        ("host syncs per step (bf16 / fp16)", sync_figure, "0 / <= 1"),
    ]  # fmt: skip


def print_extras(extra: dict[str, Any]) -> None:
    guard, stall = extra.get("guard"), extra.get("checkpointStall")
    if guard:
        print(
            f"guard A/B ({guard['precision']}, {guard['pairs']} interleaved pairs of {guard['steps']}-step runs, "
            f"medians): guard on {guard['guardOnSeconds'] * 1e3:.3f} ms/step, per-step methods no-ops "
            f"{guard['guardOffSeconds'] * 1e3:.3f} ms/step: overhead {guard['overheadPercent']:+.2f} % of step time"
        )
    if "checkpointStall" in extra and stall is None:
        print("checkpoint stall (bf16): no checkpointStaged event (the run staged no save before its last step)")
    elif stall is not None:
        print(
            f"checkpoint stall (bf16, everySteps {stall['everySteps']}): {stall['saves']} save(s) staged, "
            f"{stall['stallSeconds'] * 1e3:.1f} ms blocked per save: {stall['percent']:.3f} % of training time"
        )
    if "syncsPerStep" in extra:
        syncs = ", ".join(f"{label} {count:g}" for label, count in extra["syncsPerStep"].items()) if CUDA else NA
        print(f"host syncs per step (set_sync_debug_mode): {syncs}")


def fp8_json(fp8: dict[str, Any]) -> dict[str, Any]:
    """bench.fp8_rows' figures as JSON (Figures as dicts)."""
    large = {label: dataclasses.asdict(f) for label, f in fp8["large"].items()}
    at_base = dataclasses.asdict(fp8["fp8"]) if "fp8" in fp8 else None
    return {"skipped": fp8["skipped"], "largeShape": fp8["largeShape"], "fp8": at_base, "large": large}


def compile_line(setup: Setup) -> str:
    baseline = "eager" if setup.compile == "never" else "torch.compile"
    return f"compile: trainer training.compile={setup.compile}; nanoGPT loop {baseline}"


def side_by_side(
    setup: Setup, precisions: tuple[str, ...] = PRECISIONS
) -> tuple[dict[str, dict[str, Figures]], dict[str, list[dict[str, Any]]]]:
    """Each precision, nanoGPT's loop then the trainer; the trainer's events by precision."""
    results, events = {}, {}
    for label in precisions:
        baseline = baseline_run(setup, label)
        print(row(label, "nanoGPT", baseline), flush=True)
        events[label] = trainer_run(setup, label)
        mpjob = trainer_figures(events[label], setup.warmup)
        print(row(label, "mpjob", mpjob), flush=True)
        results[label] = {"nanoGPT": baseline, "mpjob": mpjob}
    return results, events


def listed(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated subset of `choices`, kept in their order."""

    def parse(text: str) -> tuple[str, ...]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        if not names or set(names) - set(choices):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices)}")
        return tuple(c for c in choices if c in names)

    return parse


@dataclass(frozen=True)
class Options:
    setup: Setup
    json_path: str | None
    precisions: tuple[str, ...] = PRECISIONS
    parts: tuple[str, ...] = PARTS


def options_from(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU: the same code paths")
    parser.add_argument("--batch", type=int, help="samples per step (default 16; --tiny 4)")
    parser.add_argument("--steps", type=int, help="steps of each side-by-side run (default 240; --tiny 30)")
    parser.add_argument("--compile", choices=["always", "never"], help="both sides (default: always)")
    parser.add_argument("--precisions", type=listed(PRECISIONS), default=PRECISIONS, help="side by side in these")
    parser.add_argument("--parts", type=listed(PARTS), default=PARTS, help="measure these")
    every_help = f"checkpoint.everySteps of the side-by-side runs (default {CHECKPOINT_EVERY}; --tiny 20)"
    parser.add_argument("--checkpoint-every", type=int, help=every_help)
    parser.add_argument("--ab-pairs", type=int, help="interleaved guard A/B pairs (default 4; --tiny 2)")
    parser.add_argument("--json", metavar="PATH", help="write every figure to PATH as JSON (after each part)")
    opts = parser.parse_args(argv)
    if not opts.tiny and not CUDA:
        parser.error("no CUDA device: GPT-2 124M needs a GPU (--tiny runs the same code paths on the CPU)")
    if opts.tiny:
        base = Setup(args=TINY, batch=4, steps=30, compile=TINY_COMPILE, log_every=5, warmup=10, checkpoint_every=20,
                     ab_pairs=2, ab_steps=20)  # fmt: skip
    else:
        base = Setup(args=GPT2_124M, batch=16, steps=240, compile="always")
    setup = dataclasses.replace(
        base,
        batch=opts.batch or base.batch,
        steps=opts.steps or base.steps,
        compile=opts.compile or base.compile,
        checkpoint_every=opts.checkpoint_every or base.checkpoint_every,
        ab_pairs=opts.ab_pairs or base.ab_pairs,
    )
    return Options(setup, opts.json, opts.precisions, opts.parts)


def main(argv: list[str] | None = None) -> None:
    opts = options_from(argv)
    setup = opts.setup
    print(device_line())
    print(
        f"model: gpt {setup.args}; batch {setup.batch}; {setup.steps} steps a run; figures: medians of "
        f"{setup.log_every}-step windows from step {setup.warmup + 1}"
    )
    print(compile_line(setup), flush=True)
    document: dict[str, Any] = {"device": device_line(), "torch": torch.__version__, "setup": dataclasses.asdict(setup),
                                "parts": list(opts.parts)}  # fmt: skip
    extra: dict[str, Any] = {}
    results: dict[str, dict[str, Figures]] = {}

    def write() -> None:  # after each part: a run stopped part-way keeps what it measured
        if opts.json_path:
            Path(opts.json_path).write_text(json.dumps({**document, **extra}, indent=2) + "\n")

    if "side" in opts.parts:
        results, events = side_by_side(setup, opts.precisions)
        ratios = {label: pair["mpjob"].tokens_per_s / pair["nanoGPT"].tokens_per_s for label, pair in results.items()}
        print("mpjob / nanoGPT tokens/s: " + ", ".join(f"{label} {r:.3f}" for label, r in ratios.items()), flush=True)
        document["precisions"] = {label: {side: dataclasses.asdict(f) for side, f in pair.items()}
                                  for label, pair in results.items()}  # fmt: skip
        document["ratios"] = ratios
        if "bf16" in results:
            extra["bf16VsNanoGPT"] = ratios["bf16"]
            extra["checkpointStall"] = checkpoint_stall(events["bf16"], results["bf16"]["mpjob"].step_s,
                                                        setup.checkpoint_every)  # fmt: skip
        write()
    if "fp8" in opts.parts:
        fp8 = fp8_rows(
            setup,
            tiny=setup.args == TINY,
            run=lambda s, label: trainer_figures(trainer_run(s, label), s.warmup),
            show=lambda label, f: print(row(label, "mpjob", f), flush=True),
        )
        document["fp8"] = fp8_json(fp8)
        write()
    if "guard" in opts.parts:
        extra["guard"] = guard_ab(setup)
        write()
    if "syncs" in opts.parts:
        extra["syncsPerStep"] = {label: syncs_per_step(setup, label) for label in ("bf16", "fp16")}
    print_extras(extra)
    print("targets (H100/H200; a CPU run says nothing about them):")
    for what, figure, target in targets(results, extra):
        print(f"  {what:<44} {figure:<36} target {target}")
    document["targets"] = targets(results, extra)
    write()


if __name__ == "__main__":
    main()
