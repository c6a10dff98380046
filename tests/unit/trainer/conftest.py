"""Run the real trainer (or a script on its SDK) as a subprocess, the way the operator and
`mpjob run` do.

The quick tier (`make test-fast`: unit and not process) starts no trainer: a test here that
starts a trainer process (`starts_trainer`: the trainer, or a script of torch ranks) without the
`process` (or `gpu`) marker fails, naming the marker, as tests/unit/localrun/conftest.py does for
a local run's launchers. The launcher over stand-in ranks (launcher_scripts/rank.py, standard
library only) stays in the quick tier: it starts in milliseconds."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mpjob_contract import events
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from tests import warm
from tests.helpers import paced
from tests.warm import client as warm_client

if TYPE_CHECKING:  # launcher_pods reads the trainer's events with `parse`, below
    import torch

    from mpjob_trainer.session import Session
    from tests.unit.trainer.launcher_pods import Pod


#: Marks a test that needs a process file permissions bind (root passes over them: `unprivileged`).
binds_permissions = pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root, and no setpriv to drop its pass"
)


def unprivileged(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -c script args` as a pod's trainer runs, bound by file permissions (under root,
    setpriv drops the capabilities that pass over them)."""
    bound = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]
    command = [*(bound if os.geteuid() == 0 else []), sys.executable, "-c", script, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task": {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 512}},
        "training": {"steps": 30, "batchSize": 8, "logEvery": 5, "learningRate": 1e-2, "seed": 3},
        "precision": {"mode": "fp32"},
        "checkpoint": {"everySteps": 10, "keep": 5},
        "resources": {"gpusPerWorker": 0},
    }
    for key, value in over.items():
        if key != "task" and isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def paced_spec(seconds: float, **over: Any) -> dict[str, Any]:
    """spec(**over) whose builtin task's forward passes each take `seconds` longer in every precision
    (task.args.stepDelay: an identity without parameters, so it trains an unpaced run's weights). A
    run a test stops after seeing a step lasts on by the clock however late the test acts."""
    job = spec(**over)
    job["task"] = {**job["task"], "args": {**job["task"]["args"], "stepDelay": paced(seconds)}}
    return job


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    report: TerminationReport | None
    stderr: str

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


def launch_env(
    tmp: Path,
    job_spec: dict[str, Any],
    precision: str,
    attempt: int = 0,
    resume_from: str | None = None,
    ckpt: Path | None = None,
    extra: dict[str, str] | None = None,
    name: str = "report.json",
    shape: tuple[int, int] | None = None,
    in_place_to: list[str] | None = None,
    splits: list[tuple[int, int]] | None = None,
    lineage: dict[int, list[str]] | None = None,
) -> dict[str, str]:
    """The env of one trainer process; `shape` is the attempt's (microBatch, gradAccumulation),
    `in_place_to` the precisions it may fall back to in place, `splits` the (microBatch,
    gradAccumulation) it may go on in after running out of device memory, `lineage` the Jobs each
    earlier attempt ran in (AttemptLaunch.lineage)."""
    launch = {
        "jobName": "t",
        "attempt": attempt,
        "precision": precision,
        "resumeFrom": resume_from,
        "checkpointDir": str(ckpt or tmp / "ckpt"),
        "spec": job_spec,
    }
    if shape is not None:
        launch["microBatch"], launch["gradAccumulation"] = shape
    if in_place_to is not None:
        launch["inPlaceTo"] = [{"precision": p} for p in in_place_to]
    if lineage is not None:
        launch["lineage"] = lineage
    if splits is not None:
        launch["inPlaceSplits"] = [{"microBatch": m, "gradAccumulation": a} for m, a in splits]
    env = {
        **os.environ,
        "MPJOB_LAUNCH": json.dumps(launch),
        "MPJOB_TERMINATION_LOG": str(tmp / name),
        "MPJOB_METRICS_PORT": "off",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    env.update(extra or {})
    if extra and "PYTHONPATH" in extra:  # a test's own modules first, then this checkout's parts
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra["PYTHONPATH"], os.environ.get("PYTHONPATH")) if p)
    return warm.for_ranks(env)  # a launcher's ranks start warm too


def parse(stdout: str) -> list[dict[str, Any]]:
    """The trainer's event lines; each must fit its model in mpjob_contract.events (what
    `mpjob run` reads them with), so every trainer test checks the contract too."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            assert events.parse_line(line) is not None, f"not a trainer event line: {line}"
            out.append(json.loads(line))
    return out


def run_trainer(
    tmp: Path,
    job_spec: dict[str, Any],
    precision: str = "fp32",
    timeout: float = 180,
    argv: list[str] | None = None,
    **kw: Any,
) -> Run:
    """Run `python -m mpjob_trainer` (or `python *argv`, a script on the SDK) for one attempt."""
    env = launch_env(tmp, job_spec, precision, **kw)
    proc = warm.run(
        [sys.executable, *(argv or ["-m", "mpjob_trainer"])], env=env, capture_output=True, text=True, timeout=timeout
    )
    report_path = Path(env["MPJOB_TERMINATION_LOG"])
    report = TerminationReport.parse_message(report_path.read_text()) if report_path.exists() else None
    return Run(proc.returncode, parse(proc.stdout), report, proc.stderr)


def in_process_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_spec: dict[str, Any], precision: str = "fp32"
) -> AttemptLaunch:
    """An attempt for a Session in this process: no rank env, metrics off, report in tmp_path."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MPJOB_LAUNCH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MPJOB_METRICS_PORT", "off")
    monkeypatch.setenv("MPJOB_TERMINATION_LOG", str(tmp_path / "report.json"))
    return AttemptLaunch.model_validate(
        {"jobName": "t", "precision": precision, "checkpointDir": str(tmp_path / "ckpt"), "spec": job_spec}
    )


def train_squares(
    run: Session,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    start: int,
    inputs: Callable[[int], torch.Tensor],
) -> None:
    """The SDK's own loop in this process, from step `start` to the end: step i trains the mean
    square of `model(inputs(i))` (4 samples, registered for replay), then ends the step."""

    def one_step(i: int) -> None:
        x = inputs(i)
        with run.autocast():
            loss = model(x).pow(2).mean()
        run.backward(loss)
        run.step(optimizer)

    run.register_step(one_step, samples=lambda i: [i])
    for i in range(start, run.total_steps):
        one_step(i)
        run.end_step(i + 1, samples=4)


def train_linear(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    job: dict[str, Any],
    precision: str,
    inputs: Callable[[Session, int], torch.Tensor],
) -> TerminationReport:
    """`train_squares` of a seeded linear model through an attempt of `job` in `precision` in this
    process, step i's inputs `inputs(run, i)`; the attempt's report."""
    import torch
    from torch import nn

    from mpjob_trainer import session as mpjob

    with mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, precision)) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)
        train_squares(run, model, optimizer, start, lambda i: inputs(run, i))
    return TerminationReport.model_validate_json((tmp_path / "report.json").read_text())


#: A script that imports these runs as a trainer does: a second or more of imports before its first line.
_TRAINER_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:torch|mpjob_trainer)\b", re.MULTILINE)


def starts_trainer(args: Any) -> bool:
    """Whether a command starts a trainer process: the trainer's entry point (`-m mpjob_trainer`),
    or a Python script that imports torch or the trainer (a script of gloo ranks), directly or
    under a launcher (mpjob-launch ... -- python SCRIPT). A stand-in rank on the standard library
    (launcher_scripts/rank.py: milliseconds), a launcher alone and a `python -c` probe are not."""
    argv = [str(a) for a in args] if isinstance(args, list | tuple) else str(args).split()
    for at, part in enumerate(argv):
        if part == "-m" and argv[at + 1 : at + 2] == ["mpjob_trainer"]:
            return True
        if part.endswith(".py") and Path(part).is_file() and _TRAINER_IMPORT.search(Path(part).read_text()):
            return True
    return False


@pytest.fixture(autouse=True)
def processes_only_in_process_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if any(request.node.get_closest_marker(mark) is not None for mark in ("process", "gpu")):
        return

    def refuse(args: Any) -> None:
        if starts_trainer(args):
            raise AssertionError(f"{request.node.nodeid} starts trainer processes: mark it @pytest.mark.process")

    class Refusing(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, args: Any, *more: Any, **kw: Any) -> None:
            refuse(args)
            super().__init__(args, *more, **kw)

    class RefusingWarm(warm_client.Popen):  # forked by the warm server, not through subprocess
        def __init__(self, args: list[Any], **kw: Any) -> None:
            refuse(args)
            super().__init__(args, **kw)

    monkeypatch.setattr(subprocess, "Popen", Refusing)
    monkeypatch.setattr(warm_client, "Popen", RefusingWarm)


@pytest.fixture
def trainer_spec() -> Any:
    return spec


@pytest.fixture
def pods() -> Iterator[Callable[..., Pod]]:
    """Start launchers (`launcher_pods.launch`); any still running at the end is SIGKILLed (its
    ranks die with it)."""
    from tests.unit.trainer.launcher_pods import launch

    started: list[Pod] = []

    def start(*args: Any, **kw: Any) -> Pod:
        started.append(launch(*args, **kw))
        return started[-1]

    yield start
    for pod in started:
        if pod.proc.poll() is None:
            pod.proc.kill()
            pod.proc.wait()
