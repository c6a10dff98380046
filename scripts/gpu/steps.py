"""The GPU check's steps, in order, each with its own time budget (scripts/gpu-run.sh runs this
in the venv it made over the image's torch; docs/benchmarks.md, "A GPU check in one call").

A step is one command. One out of time is stopped (its whole process group) and recorded as
"timed out", and the next step runs. Without CUDA every step runs on the CPU at a smaller size:
the benchmark's steps with `--tiny` (the same code paths, a 2-layer model), the `mpjob run`
steps (scripts/gpu/runs.py) with a shorter story of the same ending.
$OUT gets summary.json, rewritten after every step (a call cut short still returns what ran),
and the logs (at most 8 files in all: the device call returns no more). What the steps write
besides (run directories, the tests' progress log, the benchmark's JSON) stays in --work, and
what matters of it is copied into summary.json.

    python scripts/gpu/steps.py --out OUT [--work DIR] [--only NAME ...]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (scripts/gpu-run.sh): the repository holds its sibling
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.gpu.pytest_progress import progress
from scripts.gpu.runner import CUDA, REPO, Context, Step
from scripts.gpu.runner import main as run_steps
from scripts.gpu.runs import (
    QUICKSTART_ENV,
    fp8_fault,
    fsdp_one_device,
    ladder,
    mpjob_run,
    out_of_memory,
    quickstart,
    run_result,
    split_then_succeeded,
)


# ---------------------------------------------------------------- pytest -m gpu
def gpu_test_files() -> list[str]:
    """The test files that hold gpu-marked tests: collecting only these keeps the run from
    importing the other tests' packages (MLflow's server, boto3, a cluster's clients)."""
    files = [p for p in sorted((REPO / "tests").rglob("test_*.py")) if "pytest.mark.gpu" in p.read_text()]
    return [str(p.relative_to(REPO)) for p in files]


def pytest_command(ctx: Context) -> list[str]:
    log = ctx.folder("pytest") / "progress.jsonl"
    log.unlink(missing_ok=True)
    # The device's 16 cores; one GPU is enough for their small models. A worker with nothing left
    # takes queued tests from a busy one (the dozen trainer runs among 42 quick checks).
    workers = ["-n", "4", "--dist", "worksteal"] if CUDA else []
    return [ctx.python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "--timeout", "75", "-v", *workers,
            "-p", "scripts.gpu.pytest_progress", f"--progress-log={log}", *gpu_test_files()]  # fmt: skip


#: Trainer processes start cold (a fork of a warm server that imported transformers and
#: Lightning outlived the first step's 75 s on the H200), and no library looks for a hub.
PYTEST_ENV = {"MPJOB_TEST_COLD": "1", "HF_HUB_OFFLINE": "1"}


def pytest_result(ctx: Context) -> tuple[dict[str, Any], str | None]:
    """The tests' outcomes from the progress log (pytest_progress): also of a step stopped at its
    budget, with the tests still running then named."""
    log = ctx.work / "pytest" / "progress.jsonl"
    if not log.exists():
        return {}, "no progress log written"
    counts = progress(log)
    problem = f"{len(counts['failedTests'])} failed" if counts["failedTests"] else None
    if counts["collectErrors"]:
        problem = f"not collected: {', '.join(counts['collectErrors'])}"
    if CUDA and counts["skipped"]:
        problem = problem or f"{counts['skipped']} skipped on a CUDA machine"
    if counts["unfinished"] + counts["notStarted"]:
        problem = problem or f"{counts['unfinished'] + counts['notStarted']} of {counts['tests']} never finished"
    return counts, problem


# ---------------------------------------------------------------- bench/trainer_gpu.py
#: The benchmark sized to its budget (on the H200 a compiled GPT-2 run, start to end, took
#: 35-45 s, mostly compiling): bf16 side by side with a save inside the runs, and two A/B pairs
#: (153 s there on 2026-12-04); where a bf16 step's time goes and the host syncs are a step of
#: their own, as are fp32 (strict) side by side and fp8. The save at step 50 comes 40 steps
#: (1.7 s there) after the first interval reserved its staging buffers.
BENCH_PARTS = ["--precisions", "bf16", "--parts", "side,guard"]
BENCH_ARGS = ["--steps", "60", *BENCH_PARTS, "--checkpoint-every", "50", "--ab-pairs", "2"]
#: The profiled run (the trainer as a pod, asked for a profile of steps after its measured ones),
#: then the sync counts in this process: bf16 compiled once, fp16 compiled anew.
PROFILE_PARTS = ["--precisions", "bf16", "--parts", "profile,syncs"]
PROFILE_ARGS = ["--steps", "60", *PROFILE_PARTS]
FP32_PARTS = ["--precisions", "fp32", "--parts", "side"]
FP32_ARGS = ["--steps", "40", *FP32_PARTS]
#: bf16 at four times the batch, both loops: at 16 x 1024 tokens both stood at 34 % MFU on the
#: H200, and this says how much of the way to 50 % is the shape's (small matmuls for 132 SMs).
BATCH_PARTS = ["--precisions", "bf16", "--parts", "side"]
BATCH_ARGS = ["--steps", "40", *BATCH_PARTS, "--batch", "64"]
#: bf16 and fp8 at the 1.1 B shape, each profiled after its measured steps (on the H200 the two
#: rows took about 300 s, mostly compiling), then fp8 at 124M.
FP8_ARGS = ["--steps", "40", "--parts", "fp8"]
#: Without CUDA: the same parts at --tiny's own sizes (a save inside its runs too).
TINY_BENCH_ARGS, TINY_FP8_ARGS = ["--tiny", *BENCH_PARTS], ["--tiny", "--parts", "fp8"]
TINY_PROFILE_ARGS = ["--tiny", *PROFILE_PARTS]
TINY_FP32_ARGS, TINY_BATCH_ARGS = ["--tiny", *FP32_PARTS], ["--tiny", *BATCH_PARTS, "--batch", "16"]


def bench_command(name: str, args: list[str], tiny: list[str]) -> Callable[[Context], list[str]]:
    def command(ctx: Context) -> list[str]:
        figures = str(ctx.folder(name) / "figures.json")
        return [ctx.python, "bench/trainer_gpu.py", "--json", figures, *(args if CUDA else tiny)]

    return command


def bench_result(name: str) -> Callable[[Context], tuple[dict[str, Any], str | None]]:
    def result(ctx: Context) -> tuple[dict[str, Any], str | None]:
        path = ctx.work / name / "figures.json"
        if not path.exists():
            return {}, "no figures written"
        return json.loads(path.read_text()), None

    return result


# ---------------------------------------------------------------- the steps, in order
STEPS = [
    Step("pytest", 150, "pytest.log", pytest_command, pytest_result, PYTEST_ENV),
    Step("bench", 180, "bench.log", bench_command("bench", BENCH_ARGS, TINY_BENCH_ARGS), bench_result("bench")),
    Step("bench_profile", 240, "bench.log", bench_command("bench_profile", PROFILE_ARGS, TINY_PROFILE_ARGS),
         bench_result("bench_profile")),
    Step("quickstart", 90, "runs.log", mpjob_run("quickstart", quickstart),
         run_result("quickstart", ladder(("fp16", "NumericFault"), ("bf16", "Succeeded"))), QUICKSTART_ENV),
    Step("oom", 30, "runs.log", mpjob_run("oom", out_of_memory), run_result("oom", split_then_succeeded)),
    Step("fsdp", 30, "runs.log", mpjob_run("fsdp", fsdp_one_device),
         run_result("fsdp", ladder(("fp16", "NumericFault"), ("bf16", "Succeeded")))),
    Step("bench_fp32", 100, "bench.log", bench_command("bench_fp32", FP32_ARGS, TINY_FP32_ARGS),
         bench_result("bench_fp32")),
    Step("bench_batch", 100, "bench.log", bench_command("bench_batch", BATCH_ARGS, TINY_BATCH_ARGS),
         bench_result("bench_batch")),
    Step("fp8_large", 420, "fp8.log", bench_command("fp8_large", FP8_ARGS, TINY_FP8_ARGS), bench_result("fp8_large")),
    Step("fp8_fault", 45, "fp8.log", mpjob_run("fp8_fault", fp8_fault),
         run_result("fp8_fault", ladder(("fp8", "NumericFault"), ("bf16", "Succeeded"), first_message="QualityDrift"))),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return run_steps(STEPS, argv, description=__doc__.split("\n\n")[0] if __doc__ else None)


if __name__ == "__main__":
    sys.exit(main())
