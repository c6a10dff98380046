"""The GPU check's `mpjob run` steps (scripts/gpu/steps.py runs them in order): each a job run
as a user runs it, on the GPU where there is one, else a shorter story of the same ending on
the CPU, and what its report.json must say (the attempts' precisions and reasons)."""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from scripts.gpu.runner import CUDA, REPO, Context


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
