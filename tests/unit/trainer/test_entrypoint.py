"""Configuration errors, DDP and the metrics endpoint of the real trainer."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from mpjob_contract import metrics as names
from mpjob_contract.codes import ExitCode
from tests import warm
from tests.helpers import free_port, rendezvous, wait_for
from tests.unit.trainer.conftest import launch_env, paced_spec, parse, run_trainer, spec

pytestmark = pytest.mark.unit


@pytest.mark.process
def test_a_module_that_does_not_import_is_a_config_error(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(task={"module": "no_such_pkg.train:make_task"}))
    assert run.code == ExitCode.CONFIG_ERROR
    assert run.report.reason == "ConfigError" and "no_such_pkg" in run.report.message


@pytest.mark.process
def test_a_factory_that_raises_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "bad_task.py").write_text("def make_task(args):\n    raise RuntimeError('boom: no data')\n")
    run = run_trainer(tmp_path, spec(task={"module": "bad_task:make_task"}), extra={"PYTHONPATH": str(tmp_path)})
    assert run.code == ExitCode.CONFIG_ERROR
    assert "boom: no data" in run.report.message and "bad_task:make_task" in run.report.message


@pytest.mark.process
def test_a_factory_returning_the_wrong_shape_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "odd_task.py").write_text("def make_task(args):\n    return 42\n")
    run = run_trainer(tmp_path, spec(task={"module": "odd_task:make_task"}), extra={"PYTHONPATH": str(tmp_path)})
    assert run.code == ExitCode.CONFIG_ERROR and "model" in run.report.message


@pytest.mark.process
def test_unknown_builtin_args_are_a_config_error(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(task={"builtin": "mlp", "args": {"hiden": 3}}))
    assert run.code == ExitCode.CONFIG_ERROR and "hiden" in run.report.message


def _ddp(tmp: Path, steps: int, attempt: int) -> list[subprocess.CompletedProcess[str]]:
    with rendezvous(2) as meet:
        return _ddp_ranks(tmp, steps, attempt, meet)


def _ddp_ranks(tmp: Path, steps: int, attempt: int, meet: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    job = spec(training={"steps": steps, "logEvery": 5}, checkpoint={"everySteps": 10})
    procs = []
    for rank in (0, 1):
        env = launch_env(
            tmp,
            job,
            "fp32",
            attempt=attempt,
            ckpt=tmp / "ckpt",
            name=f"r{attempt}-{rank}.json",
            extra={
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(rank),
                **meet,
            },
        )
        procs.append(
            warm.Popen(
                [sys.executable, "-m", "mpjob_trainer"],
                env=env,
                text=True,
                stdout=warm.PIPE,
                stderr=warm.PIPE,
            )
        )
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=240), *p.communicate()) for p in procs]


@pytest.mark.process
def test_two_process_ddp_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    first = _ddp(tmp_path, 20, 0)
    assert [p.returncode for p in first] == [0, 0], first[1].stderr[-2000:]
    assert (tmp_path / "ckpt" / "step-000000020" / "manifest.json").exists()
    start = next(e for e in parse(first[0].stdout) if e["event"] == "start")
    assert start["worldSize"] == 2
    second = _ddp(tmp_path, 30, 1)
    assert [p.returncode for p in second] == [0, 0], second[1].stderr[-2000:]
    resume = [e for e in parse(second[0].stdout) if e["event"] == "resume"]
    assert resume and resume[0]["step"] == 20
    assert (tmp_path / "ckpt" / "step-000000030").exists()


@pytest.mark.process
def test_metrics_endpoint_serves_the_contract_names(tmp_path: Path) -> None:
    port = free_port()
    env = launch_env(
        tmp_path,
        # 100 ms a step: the endpoint serves for 40 s (the test kills the run once it has read it),
        # where 400 unpaced steps could end before a starved test's first scrape.
        paced_spec(0.1, training={"steps": 400, "logEvery": 5}),
        "fp32",
        extra={"MPJOB_METRICS_PORT": str(port), "MPJOB_METRICS_HOST": "127.0.0.1"},
    )
    proc = warm.Popen([sys.executable, "-m", "mpjob_trainer"], env=env, stdout=warm.DEVNULL)
    try:

        def scrape() -> str | None:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
            return text if f"{names.STEP}{{" in text and "samples_per_second{" in text else None

        text = wait_for(scrape, 60, message="metrics with a step")
        for name in (
            names.STEP,
            names.LOSS,
            names.GRAD_NORM,
            names.SAMPLES_PER_SECOND,
            names.TOTAL_STEPS,
            names.OVERFLOW_STEPS + "_total",
            names.STEP_SECONDS + "_bucket",
            names.INFO,
        ):
            assert name in text, name
        assert 'job="t"' in text and 'precision="fp32"' in text and 'attempt="0"' in text
    finally:
        proc.kill()
        proc.wait()
