"""The GPU check's steps, in order, each with its own time budget (scripts/gpu-run.sh runs this
in the venv it made over the image's torch; docs/benchmarks.md, "A GPU check in one call").

A step is one command. One out of time is stopped (its whole process group) and recorded as
"timed out", and the next step runs. Without CUDA every step runs on the CPU at a smaller size:
the benchmark's steps with `--tiny` (the same code paths, a 2-layer model), the `mpjob run`
steps with a shorter story of the same ending.
$OUT gets summary.json, rewritten after every step (a call cut short still returns what ran),
and the logs (at most 8 files in all: the device call returns no more). What the steps write
besides (run directories, the tests' progress log, the benchmark's JSON) stays in --work, and
what matters of it is copied into summary.json.

    python scripts/gpu/steps.py --out OUT [--work DIR] [--only NAME ...]
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script (scripts/gpu-run.sh): the repository holds its sibling
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.gpu.pytest_progress import progress
from scripts.gpu.runner import CUDA, REPO, Context, Step
from scripts.gpu.runner import main as run_steps


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


# ---------------------------------------------------------------- `mpjob run` of a job
def job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": name}, "spec": spec}


def example(path: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / path).read_text())


def on_this_machine(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest for `mpjob run` here: one GPU per worker where there is one, else none."""
    doc = copy.deepcopy(manifest)
    doc["spec"].setdefault("resources", {})["gpusPerWorker"] = 1 if CUDA else 0
    doc["spec"]["checkpoint"].pop("volume", None)  # `mpjob run` keeps checkpoints in its run folder
    return doc


def mpjob_run(name: str, manifest: Callable[[], dict[str, Any]]) -> Callable[[Context], list[str]]:
    def command(ctx: Context) -> list[str]:
        folder = ctx.folder(name)
        (folder / "job.yaml").write_text(yaml.safe_dump(on_this_machine(manifest())))
        out = folder / "out"
        return [ctx.python, "-m", "mpjob.cli", "run", str(folder / "job.yaml"), "--out", str(out), "--fresh", "--json"]

    return command


#: What the results keep of each attempt (inPlace: the change was made in the running process).
ATTEMPT_FIELDS = (
    "precision", "reason", "startStep", "microBatch", "gradAccumulation", "worldSize", "exitCode", "inPlace",
)  # fmt: skip
#: Of an attempt's message, in summary.json.
MESSAGE_CHARS = 300


def run_result(name: str, expect: Callable[[list[dict[str, Any]]], str | None]) -> Callable[..., Any]:
    """report.json's phase, step and attempts; the problem: `expect`'s, or a phase not Succeeded."""

    def result(ctx: Context) -> tuple[dict[str, Any], str | None]:
        path = ctx.work / name / "out" / "report.json"
        if not path.exists():
            return {}, "no report.json"
        report = json.loads(path.read_text())
        attempts = [{**{k: a.get(k) for k in ATTEMPT_FIELDS}, "message": (a.get("message") or "")[:MESSAGE_CHARS]}
                    for a in report.get("attempts", [])]  # fmt: skip
        figures = {"phase": report.get("phase"), "step": report.get("step"), "attempts": attempts,
                   "recompiles": recompiles(ctx.work / name / "out")}  # fmt: skip
        problem = expect(attempts) if report.get("phase") == "Succeeded" else f"phase {report.get('phase')}"
        return figures, problem

    return result


#: Of the workers' logs, in summary.json: at most this many lines of inductor's recompile log.
RECOMPILE_LINES = 40


RECOMPILE_LINE = re.compile(r"\[__recompiles\]\s+(Recompiling function .*|- \d+/\d+: .*)")


def recompiles(out: Path) -> list[str]:
    """What TORCH_LOGS=recompiles wrote to the attempts' worker logs (a step's env sets it): each
    recompiled function and the guards that failed, without the log's prefixes."""
    logs = sorted(out.glob("attempts/*/worker*.log"))
    found = (RECOMPILE_LINE.search(line) for log in logs for line in log.read_text(errors="replace").splitlines())
    return [match.group(1)[:MESSAGE_CHARS] for match in found if match][:RECOMPILE_LINES]


def ladder(*expected: tuple[str, str], first_message: str = "") -> Callable[[list[dict[str, Any]]], str | None]:
    """The attempts' (precision, reason), in order; the first's message names `first_message`."""

    def check(attempts: list[dict[str, Any]]) -> str | None:
        seen = [(a["precision"], a["reason"]) for a in attempts]
        if seen != list(expected):
            return f"attempts {seen}, expected {list(expected)}"
        if first_message not in attempts[0]["message"]:
            return f"attempt 0 ended {attempts[0]['message']!r}, expected {first_message}"
        return None

    return check


def split_then_succeeded(attempts: list[dict[str, Any]]) -> str | None:
    """One or more OutOfDeviceMemory attempts, each with a smaller micro-batch, then Succeeded."""
    reasons = [a["reason"] for a in attempts]
    batches = [a["microBatch"] for a in attempts]
    if reasons[-1] != "Succeeded" or len(reasons) < 2 or set(reasons[:-1]) != {"OutOfDeviceMemory"}:
        return f"attempts ended {reasons}, expected OutOfDeviceMemory then Succeeded"
    if any(later >= earlier for earlier, later in itertools.pairwise(batches)):
        return f"micro-batches {batches} did not shrink"
    return None


#: On the H200 the bf16 attempt that followed the fp16 fault in place (compiled) read non-finite
#: losses (torch 2.11's AOTAutograd cache, since turned off there): the recompiles, and why,
#: go to summary.json, to see what a precision change compiles.
QUICKSTART_ENV = {"TORCH_LOGS": "recompiles"}


def quickstart() -> dict[str, Any]:
    """examples/quickstart.yaml; on the CPU a shorter run of the same story (the whole one takes
    minutes there): the overflow at step 30 of 60, checkpoints every 10, compiled as on CUDA
    (the rehearsal's torch 2.11 showed there what broke the in-place bf16 attempt on the H200)."""
    doc = example("examples/quickstart.yaml")
    if not CUDA:
        doc["spec"]["task"]["args"]["overflowAtStep"] = 30
        doc["spec"]["training"].update(steps=60, compile="always")  # compiled, as `auto` is on CUDA
        doc["spec"]["checkpoint"]["everySteps"] = 10
    return doc


def out_of_memory() -> dict[str, Any]:
    """On CUDA a real out-of-memory: 256 sequences of 2048 tokens over GPT-2's vocabulary hold
    ~1 GiB of logits and their gradients each, several times the H200's 141 GB, and the
    micro-batch is halved until it fits. On the CPU the mlp task's injected one
    (outOfMemoryAbove) walks the same path."""
    if CUDA:
        args = {"nLayer": 2, "nHead": 8, "nEmbd": 512, "blockSize": 2048, "vocabSize": 50304, "data": "random"}
        task, training = {"builtin": "gpt", "args": args}, {"steps": 3, "batchSize": 256, "logEvery": 1}
    else:
        args = {"inputs": 8, "hidden": 16, "samples": 256, "outOfMemoryAbove": 4}
        task, training = {"builtin": "mlp", "args": args}, {"steps": 20, "batchSize": 16, "logEvery": 5}
    return job("oom", {
        "task": task,
        "training": {**training, "compile": "never"},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 10},
        "runPolicy": {"maxAttempts": 6},
    })  # fmt: skip


def fsdp_one_device() -> dict[str, Any]:
    """FSDP2 over one process (one GPU, or the CPU): fp16 overflows at step 15, bf16 resumes from
    the sharded checkpoint at step 10."""
    args = {"nLayer": 4, "nHead": 4, "nEmbd": 256, "blockSize": 256, "vocabSize": 50304, "data": "random",
            "overflowAtStep": 15}  # fmt: skip
    if not CUDA:
        args = {**args, "nLayer": 2, "nHead": 2, "nEmbd": 32, "blockSize": 32, "vocabSize": 512}
    return job("fsdp", {
        "task": {"builtin": "gpt", "args": args},
        "training": {"steps": 30, "batchSize": 8, "logEvery": 5, "compile": "never"},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "parallelism": {"strategy": "fsdp"},
        "checkpoint": {"everySteps": 10},
        "resources": {"processesPerWorker": 1},
    })  # fmt: skip


def fp8_fault() -> dict[str, Any]:
    """examples/fp8-fallback.yaml: real fp8 (torchao on fp8 tensor cores) on CUDA, emulated on the CPU."""
    doc = example("examples/fp8-fallback.yaml")
    doc["spec"]["precision"]["fp8"]["emulate"] = not CUDA
    return doc


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
