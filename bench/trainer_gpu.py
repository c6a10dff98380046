"""The trainer on a GPU beside a compiled nanoGPT loop, in one run.

GPT-2 124M (vocabulary 50304, 12 layers, 12 heads, 768 wide, sequence 1024) on synthetic
tokens (the `gpt` task's `data: random`), measured in these parts (--parts), in this order:

- side: in fp32 with TF32 off and on, fp16 and bf16, nanoGPT's loop (bench/gpu_baseline.py)
  then mpjob's trainer run as `python -m mpjob_trainer` the way the pod runs it
  (bench/gpu_trainer.py), both compiled (training.compile always); the bf16 run's checkpoint
  stall;
- fp8: the trainer in bf16 and fp8 (torchao float8, compute capability >= 8.9) at a
  ~1B-parameter shape at sequence 2048 where fp8 pays, each with a profile of its steps, then
  in fp8 at the benchmark's shape (bench/fp8_rows.py);
- guard: the numeric guard's cost, as interleaved A/B runs in this process;
- profile: where a bf16 step's time goes, by kind of kernel, and how busy the GPU was
  (bench/gpu_profile.py), from the trace of a profile the trainer is asked for;
- syncs: host syncs per step on CUDA, in this process.

Per precision and side: the figures of bench/gpu_setup.py's Figures; bench/gpu_report.py prints
them with the targets (H100/H200) beside them. `--tiny` runs the same code paths on the CPU
(every CUDA-only figure reads "n/a (no CUDA)") with a 2-layer model, 30-step runs, 5-step
windows after a 10-step warm-up and a 20-step checkpoint interval; `--json PATH` writes all
figures.

    PYTHONPATH=. python bench/trainer_gpu.py                  # on a CUDA machine
    PYTHONPATH=. python bench/trainer_gpu.py --tiny           # CPU smoke run of the same paths
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.fp8_rows import fp8_rows
from bench.gpu_baseline import baseline_run
from bench.gpu_profile import profile_lines
from bench.gpu_profiled import profiled_figures, step_breakdown
from bench.gpu_report import compile_line, device_line, fp8_json, print_extras, row, targets
from bench.gpu_setup import CHECKPOINT_EVERY, CUDA, Figures, Setup
from bench.gpu_trainer import checkpoint_stall, guard_ab, syncs_per_step, trainer_figures, trainer_run

GPT2_124M = {"nLayer": 12, "nHead": 12, "nEmbd": 768, "blockSize": 1024, "vocabSize": 50304, "data": "random"}
TINY = {"nLayer": 2, "nHead": 2, "nEmbd": 64, "blockSize": 32, "vocabSize": 512, "data": "random"}
PRECISIONS = ("fp32", "fp32+TF32", "fp16", "bf16")
#: What a run measures, in this order (--parts): the precisions side by side, the fp8 rows, the
#: guard's A/B, where a bf16 step's time goes, the host syncs per step.
PARTS = ("side", "fp8", "guard", "profile", "syncs")
#: --tiny compiles too: inductor's cold compile of TINY (forward and backward, one thread) took
#: 24-29 s per precision and side on the 2-core CPU of docs/benchmarks.md, 2.5 s from a warm
#: cache: within the ~60 s per precision a smoke run may spend (--compile never skips it).
TINY_COMPILE = "always"


def side_by_side(
    setup: Setup, precisions: tuple[str, ...] = PRECISIONS
) -> tuple[dict[str, dict[str, Figures]], dict[str, list[dict[str, Any]]]]:
    """Each precision, nanoGPT's loop then the trainer; the trainer's events by precision."""
    results, events = {}, {}
    for label in precisions:
        began = time.monotonic()
        baseline = baseline_run(setup, label)
        print(f"{row(label, 'nanoGPT', baseline)}  run {time.monotonic() - began:.0f} s", flush=True)
        began = time.monotonic()
        events[label] = trainer_run(setup, label)
        mpjob = trainer_figures(events[label], setup.warmup)
        print(f"{row(label, 'mpjob', mpjob)}  run {time.monotonic() - began:.0f} s", flush=True)
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
            run=lambda s, label, profile: (
                profiled_figures(s, label) if profile else (trainer_figures(trainer_run(s, label), s.warmup), None)
            ),
            show=lambda label, f: print(row(label, "mpjob", f), flush=True),
        )
        document["fp8"] = fp8_json(fp8)
        write()
    if "guard" in opts.parts:
        began = time.monotonic()
        extra["guard"] = guard_ab(setup)
        print(f"guard A/B: {time.monotonic() - began:.0f} s", flush=True)
        write()
    if "profile" in opts.parts:
        extra["profile"] = step_breakdown(setup)
        print("\n".join(profile_lines(extra["profile"])), flush=True)
        write()
    if "syncs" in opts.parts:
        began = time.monotonic()
        extra["syncsPerStep"] = {label: syncs_per_step(setup, label) for label in ("bf16", "fp16")}
        print(f"host syncs: {time.monotonic() - began:.0f} s", flush=True)
    print_extras(extra)
    print("targets (H100/H200; a CPU run says nothing about them):")
    for what, figure, target in targets(results, extra):
        print(f"  {what:<44} {figure:<36} target {target}")
    document["targets"] = targets(results, extra)
    write()


if __name__ == "__main__":
    main()
