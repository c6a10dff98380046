"""The one-call GPU check without a GPU (docs/benchmarks.md, "A GPU check in one call"): what
the pack carries, which test files `pytest -m gpu` collects, how a step's budget and outcome
are judged, and bench/trainer_gpu.py's partial runs. `make gpu-rehearse` runs the whole check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import gpu_report, trainer_gpu
from scripts.gpu import requirements, runner, runs, steps
from tests.helpers import gone, wait_for

pytestmark = pytest.mark.unit


def test_the_pack_carries_what_the_image_lacks_and_never_torch() -> None:
    carried = {line.split("==")[0] for line in requirements.carried()}
    assert {"pydantic", "pydantic-core", "kopf", "kubernetes", "torchao"} <= carried
    assert not carried & set(requirements.image())
    assert not carried & requirements.torch_stack()
    held = requirements.held()
    assert held[0] == "torch==2.11.0" and "numpy==2.5.2" in held
    assert any(line.startswith("pytest==") for line in held)


def test_pytest_collects_only_the_files_with_gpu_marked_tests() -> None:
    files = steps.gpu_test_files()
    assert "tests/unit/trainer/test_gpu.py" in files
    assert all("pytest.mark.gpu" in (steps.REPO / f).read_text() for f in files)


def test_a_command_past_its_budget_is_stopped_with_its_children(tmp_path: Path) -> None:
    script = "import subprocess, time; print(subprocess.Popen(['sleep', '60']).pid, flush=True); time.sleep(60)"
    code, seconds = runner.run_command([sys.executable, "-c", script], tmp_path / "log", 1, {})
    assert code is None and seconds < runner.GRACE_S + 5
    child = int((tmp_path / "log").read_text().split()[0])
    assert wait_for(lambda: gone(child), timeout=60)


def attempt(precision: str, reason: str, micro_batch: int = 8, message: str = "") -> dict[str, object]:
    return {"precision": precision, "reason": reason, "microBatch": micro_batch, "message": message}


def test_the_expected_ladders() -> None:
    quality = runs.ladder(("fp8", "NumericFault"), ("bf16", "Succeeded"), first_message="QualityDrift")
    assert quality([attempt("fp8", "NumericFault", message="QualityDrift: ..."), attempt("bf16", "Succeeded")]) is None
    assert quality([attempt("fp8", "NumericFault", message="overflow"), attempt("bf16", "Succeeded")])
    assert quality([attempt("fp8", "Succeeded")])
    oom = [attempt("bf16", "OutOfDeviceMemory", 16), attempt("bf16", "OutOfDeviceMemory", 8)]
    assert runs.split_then_succeeded([*oom, attempt("bf16", "Succeeded", 4)]) is None
    assert (
        runs.split_then_succeeded([*oom, attempt("bf16", "Succeeded", 8)]) == "micro-batches [16, 8, 8] did not shrink"
    )
    assert runs.split_then_succeeded([attempt("bf16", "Succeeded", 16)])


def test_the_benchmark_runs_the_parts_and_precisions_asked_for_in_its_own_order() -> None:
    opts = trainer_gpu.options_from(["--tiny", "--precisions", "bf16,fp32", "--parts", "syncs,side"])
    assert opts.precisions == ("fp32", "bf16") and opts.parts == ("side", "syncs")
    assert trainer_gpu.options_from(["--tiny", "--checkpoint-every", "7"]).setup.checkpoint_every == 7
    with pytest.raises(SystemExit):
        trainer_gpu.options_from(["--tiny", "--parts", "side,everything"])


def test_targets_left_out_of_a_run_read_not_measured() -> None:
    rows = gpu_report.targets({}, {})
    assert len(rows) == 6 and all(figure == gpu_report.NOT_MEASURED for _, figure, _ in rows)


@pytest.mark.parametrize("cuda", [True, False])
def test_the_benchmark_steps_run_the_same_parts_on_cuda_and_tiny_without(
    cuda: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CUDA (the rehearsal) the benchmark itself runs on torch 2.11, at --tiny's sizes."""
    monkeypatch.setattr(steps, "CUDA", cuda)
    ctx = runner.Context(work=tmp_path)
    argv = {step.name: step.command(ctx) for step in steps.STEPS if step.name.startswith(("bench", "fp8"))}
    parts_of = {"bench": "side,guard", "bench_profile": "profile,syncs", "bench_fp32": "side", "bench_batch": "side",
                "fp8_large": "fp8"}  # fmt: skip
    for name, parts in parts_of.items():
        assert argv[name][1] == "bench/trainer_gpu.py" and argv[name][argv[name].index("--parts") + 1] == parts
        assert ("--tiny" in argv[name]) is not cuda and ("--steps" in argv[name]) is cuda
    for name in ("bench", "bench_profile"):
        assert argv[name][argv[name].index("--precisions") + 1] == "bf16"
    assert argv["bench_fp32"][argv["bench_fp32"].index("--precisions") + 1] == "fp32"
    batch = argv["bench_batch"]
    assert batch[batch.index("--precisions") + 1] == "bf16"
    assert batch[batch.index("--batch") + 1] == ("64" if cuda else "16")


def test_the_recompiles_of_a_run_are_read_from_its_worker_logs_without_their_prefixes(tmp_path: Path) -> None:
    log = tmp_path / "attempts" / "a1" / "worker0.log"
    log.parent.mkdir(parents=True)
    prefix = "V1130 17:44:04.009000 8439 torch/_dynamo/guards.py:6374] [2/1] [__recompiles]"
    log.write_text(
        f"{prefix} Recompiling function forward in gpt.py:70\n"
        f"{prefix}     triggered by the following guard failure(s):\n"
        f"{prefix}     - 2/0: GLOBAL_STATE changed: autocast(cuda)_dtype \n"
        f"{prefix}     - User stack trace:\n"
        "a line of the trainer's own\n"
    )
    found = runs.recompiles(tmp_path)
    assert found == ["Recompiling function forward in gpt.py:70", "- 2/0: GLOBAL_STATE changed: autocast(cuda)_dtype "]


def test_a_run_again_reuses_the_graphs_compiled_before_it_and_a_fresh_run_compiles_anew() -> None:
    """The benchmark's A/B, profile and sync runs fit their budget on a GPU only because they reuse
    the warm-up's graphs (the H200 spent tens of seconds on each fresh GPT-2 compile)."""
    from torch._dynamo.utils import counters

    from bench import gpu_trainer
    from bench.gpu_setup import Setup

    setup = Setup(args={}, batch=8, steps=10, compile="always", log_every=5, warmup=0)
    spec = gpu_trainer.job_spec(setup, "bf16", steps=6, log_every=3, every=gpu_trainer.NEVER)
    spec["task"] = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 64}}
    compiled = []
    for again in (False, True, False):
        graphs = counters["stats"]["unique_graphs"]
        events = gpu_trainer.in_process(spec, "bf16", again=again)
        assert any(e["event"] == "compile" and e["compiled"] for e in events)
        compiled.append(counters["stats"]["unique_graphs"] - graphs)
    assert compiled[0] >= 1 and compiled[1] == 0 and compiled[2] == compiled[0]
