"""The trainer SDK (mpjob_trainer.session) under a user's own loop: the same guard, exit
codes, reports, checkpoints and exact resume the builtin trainer gets.

Subprocess tests run tests/unit/trainer/sdk_script.py (and the example in docs/sdk.md) as
`task.command` jobs; in-process tests drive a Session directly where no process is needed.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests import warm
from tests.helpers import wait_for
from tests.unit.trainer.conftest import Run, in_process_launch, launch_env, parse, run_trainer, spec, train_squares

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).with_name("sdk_script.py")
DOCS = Path(__file__).parents[3] / "docs" / "sdk.md"


def own(args: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    return spec(task={"command": ["python", "sdk_script.py"], "args": args or {}}, **over)


def run_script(tmp: Path, job: dict[str, Any], precision: str, **kw: Any) -> Run:
    return run_trainer(tmp, job, precision, argv=[str(SCRIPT)], **kw)


def _state(ckpt: Path, step: int) -> dict[str, Any]:
    return torch.load(ckpt / f"step-{step:09d}" / "state.pt", weights_only=True)


# ---------------------------------------------------------------- subprocesses


@pytest.mark.process
def test_an_own_loop_trains_checkpoints_and_reports_like_the_builtin(tmp_path: Path) -> None:
    run = run_script(tmp_path, own(), "fp32")
    assert run.code == ExitCode.SUCCESS, run.stderr
    assert run.report is not None and run.report.reason == "Succeeded"
    assert run.report.last_good_checkpoint is not None and run.report.last_good_checkpoint.step == 30
    steps = run.of("step")
    assert [s["step"] for s in steps] == [5, 10, 15, 20, 25, 30]
    assert steps[-1]["appliedSteps"] == 30 and steps[-1]["samplesPerSecond"] > 0
    assert run.report.counters.loss == steps[-1]["loss"]  # the final loss, for the status on success
    assert run.of("done")[0] == {**run.of("done")[0], "step": 30, "appliedSteps": 30}
    state = _state(tmp_path / "ckpt", 30)
    assert {"model", "optimizer", "scheduler", "data", "rng", "scaler", "step", "appliedSteps"} <= set(state)
    assert state["data"] == {"batches": 30} and state["scheduler"]["last_epoch"] == 30


@pytest.mark.process
def test_fp16_overflow_in_an_own_loop_is_a_numeric_fault_naming_the_rule(tmp_path: Path) -> None:
    job = own(
        {"overflowAtStep": 12},
        precision={"mode": "fp16", "lossScale": {"init": 2.0**20}, "guard": {"maxConsecutiveOverflows": 8}},
    )
    run = run_script(tmp_path, job, "fp16")
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
    report = run.report
    assert report is not None and report.reason == "NumericFault"
    assert report.message.startswith("MaxConsecutiveOverflows: 8 consecutive overflow-skipped steps")
    assert run.of("fault")[0]["rule"] == "MaxConsecutiveOverflows"
    assert report.step == 20 and report.precision == "fp16"
    assert report.counters.overflow_steps >= 8 and report.counters.loss_scale is not None
    assert report.counters.loss_scale < 2.0**20
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 10
    assert not (tmp_path / "ckpt" / "step-000000020").exists(), "no checkpoint from the faulted window"
    steps = run.of("step")
    assert steps[0]["overflowSteps"] > 0, "calibration from 2^20 skips some steps"
    for line in steps:  # skipped steps are not applied, and the scale is on every fp16 line
        assert line["appliedSteps"] == line["step"] - line["overflowSteps"]
        assert line["lossScale"] > 0


@pytest.mark.process
def test_sigterm_checkpoints_exits_44_and_the_resumed_run_is_bit_identical(tmp_path: Path) -> None:
    job = own(training={"steps": 40, "logEvery": 5}, checkpoint={"everySteps": 10, "keep": 10})
    straight_env = launch_env(tmp_path / "straight", job, "bf16")
    straight = warm.Popen([sys.executable, str(SCRIPT)], env=straight_env, stdout=warm.DEVNULL)

    cut = tmp_path / "cut"
    # 120 ms a step (the resumed run is not paced): the 30 steps after checkpoint 10 last 3.6 s, so
    # SIGTERM lands inside the run however late this test, starved on a busy machine, sends it.
    env = launch_env(cut, job, "bf16", extra={"SDK_SCRIPT_STEP_SECONDS": "0.12"})
    cut.mkdir()
    proc = warm.Popen([sys.executable, str(SCRIPT)], env=env, stdout=warm.PIPE, text=True)
    wait_for(lambda: (cut / "ckpt" / "step-000000010" / "manifest.json").exists(), 120, interval=0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.PREEMPTED
    stopped = next(e for e in parse(out) if e["event"] == "preempted")["step"]
    assert 10 <= stopped < 40
    report = TerminationReport.model_validate_json((cut / "report.json").read_text())
    assert report.reason == "Preempted" and report.step == stopped
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == stopped

    assert straight.wait(timeout=120) == ExitCode.SUCCESS
    resumed = run_script(cut, job, "bf16", attempt=1, name="report2.json")
    assert resumed.code == ExitCode.SUCCESS, resumed.stderr
    assert resumed.of("resume")[0]["step"] == stopped and resumed.of("start")[0]["startStep"] == stopped
    a, b = _state(tmp_path / "straight" / "ckpt", 40), _state(cut / "ckpt", 40)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for pid, slots in a["optimizer"]["state"].items():
        for name, value in slots.items():
            assert torch.equal(value, b["optimizer"]["state"][pid][name]), (pid, name)
    assert a["scheduler"] == b["scheduler"] and a["data"] == b["data"] == {"batches": 40}
    assert a["appliedSteps"] == b["appliedSteps"] == 40


@pytest.mark.process
def test_the_builtin_trainer_refuses_a_command_task(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, own(), "fp32")
    assert run.code == ExitCode.CONFIG_ERROR
    assert run.report is not None and run.report.reason == "ConfigError"
    assert run.report.message.startswith("task.command jobs run your own command under mpjob-launch")


@pytest.mark.process
def test_the_docs_example_runs_as_written(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    (tmp_path / "train.py").write_text(next(b for b in blocks if "__main__" in b))
    job = spec(task={"command": ["python", "train.py"], "args": {"batch": 16}}, training={"steps": 20})
    run = run_trainer(tmp_path, job, "bf16", argv=[str(tmp_path / "train.py")])
    assert run.code == ExitCode.SUCCESS, run.stderr
    assert _state(tmp_path / "ckpt", 20)["data"] == {"position": 20 * 16}


# ---------------------------------------------------------------- in process


@pytest.fixture
def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    """An attempt for a Session in this process (metrics off, report in tmp_path)."""
    job = spec(training={"steps": 6, "logEvery": 3}, checkpoint={"everySteps": 3})
    return in_process_launch(tmp_path, monkeypatch, job)


class Position:
    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def _objects() -> dict[str, Any]:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "data": Position()}


def _sgd() -> torch.optim.SGD:
    return torch.optim.SGD(nn.Linear(4, 1).parameters(), lr=0.1)


def _close_one(run: mpjob.Session, step: Any = 1, **end: Any) -> None:
    """Train and close step 1 (end_step with `end`; `step`: the number the loop gives it)."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run.resume(model=model, optimizer=optimizer)
    run.backward(model(torch.randn(8, 4)).pow(2).mean())
    run.step(optimizer)
    run.end_step(step, **end)


def _report(launch: AttemptLaunch) -> TerminationReport:
    path = Path(launch.checkpoint_dir).parent / "report.json"
    return TerminationReport.model_validate_json(path.read_text())


def test_resume_loads_every_registered_object_and_the_generators(launch: AttemptLaunch) -> None:
    with mpjob.start(launch=launch) as run:
        objs = _objects()
        assert run.resume(**objs) == 0
        for step in range(run.total_steps):
            run.backward(objs["model"](torch.randn(8, 4)).pow(2).mean())
            run.step(objs["optimizer"])
            objs["scheduler"].step()
            objs["data"].seen += 8
            run.end_step(step + 1)
    saved = _state(Path(launch.checkpoint_dir), 6)

    with mpjob.start(launch=launch.model_copy(update={"attempt": 1})) as run:
        fresh = _objects()
        assert run.resume(**fresh) == 6 and run.applied_steps == 6
        assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])
        for key, value in saved["model"].items():
            assert torch.equal(fresh["model"].state_dict()[key], value)
        assert fresh["optimizer"].state_dict()["state"][0]["step"] == 6
        assert fresh["scheduler"].state_dict() == saved["scheduler"] and fresh["scheduler"].last_epoch == 6
        assert fresh["data"].seen == 48
    assert _report(launch).reason == "Succeeded"


@pytest.mark.parametrize(
    ("misuse", "says"),
    [
        (lambda run: run.resume(rng=Position()), "'rng' is reserved"),
        (lambda run: run.resume(model=object()), "no state_dict()"),
        (lambda run: run.end_step(1), "call run.resume(...) before end_step(1): it names what the session"),
        (lambda run: run.register_step(lambda i: None), "call run.resume(...) before register_step()"),
        (lambda run: _close_one(run, loss=torch.ones(8)), "end_step(loss=a tensor of shape (8,)): the loss"),
        (lambda run: _close_one(run, loss=[0.5]), "end_step(loss=a list): the loss"),
        # Read at the next log step only, they ended the attempt an InfraError there, retried.
        (lambda run: _close_one(run, grad_norm=torch.ones(3)), "end_step(grad_norm=a tensor of shape (3,)): the"),
        (lambda run: _close_one(run, lr=[0.1, 0.01]), "end_step(lr=a list): the learning rate to report is one"),
        # A step number that is no int ended the attempt an InfraError from deep inside (a JSON line,
        # a checkpoint's folder name), retried as the platform's fault.
        (lambda run: _close_one(run, 1.0), "end_step(1.0): a step is an int (a float here), "),
        (lambda run: _close_one(run, torch.tensor(1)), "end_step(tensor(1)): a step is an int (a Tensor here)"),
        (lambda run: run.stop_early(5.5), "stop_early(5.5): a step is an int (a float here)"),
        # A checkpoint holding a data position that is no count is refused by every resume.
        (lambda run: _close_one(run, samples=12.5), "end_step(samples=12.5): samples is the number of samples"),
        (lambda run: _close_one(run, samples=-8), "end_step(samples=-8): samples is the number of samples"),
        (lambda run: _close_one(run, samples=torch.tensor(8)), "end_step(samples=tensor(8)): samples is the"),
        (lambda run: run.adamw(nn.ReLU(), lr=0.1, weight_decay=0.0), "adamw(ReLU): the model has no trainable"),
        (lambda run: run.step(nn.Linear(4, 1)), "step(Linear): step() takes the torch.optim.Optimizer to step"),
        (lambda run: run.step(_sgd(), clip_norm=-1.0), "step(clip_norm=-1.0): clip_norm is a gradient norm"),
        (lambda run: run.step(_sgd(), clip_norm=math.nan), "step(clip_norm=nan): clip_norm is a gradient norm"),
        (lambda run: run.set_sample_cost(flops=-1), "set_sample_cost(flops=-1): flops is the training FLOPs of one"),
        (lambda run: run.set_sample_cost(flops=math.nan), "set_sample_cost(flops=nan): flops is the training FLOPs"),
        (lambda run: run.set_sample_cost(flops=math.inf), "set_sample_cost(flops=inf): flops is the training FLOPs"),
        (lambda run: run.set_sample_cost(tokens=0), "set_sample_cost(tokens=0): tokens is the number of tokens"),
        (lambda run: run.set_sample_cost(tokens=2.5), "set_sample_cost(tokens=2.5): tokens is the number of tokens"),
    ],
)
def test_misusing_the_sdk_is_a_config_error(launch: AttemptLaunch, misuse: Any, says: str) -> None:
    with pytest.raises(SystemExit) as ended, mpjob.start(launch=launch) as run:
        misuse(run)
    assert ended.value.code == ExitCode.CONFIG_ERROR
    report = _report(launch)
    assert report.reason == "ConfigError" and says in report.message


def test_a_sample_cost_start_cannot_use_is_a_config_error_naming_its_argument(launch: AttemptLaunch) -> None:
    with pytest.raises(SystemExit) as ended:
        mpjob.start(flops_per_sample=-6.0, launch=launch)
    assert ended.value.code == ExitCode.CONFIG_ERROR
    message = _report(launch).message
    assert message.startswith("start(flops_per_sample=-6.0): flops_per_sample is the training FLOPs"), message
    assert "a finite number above 0, or None" in message


@pytest.mark.parametrize("port", ["abc", "70000", "-5", "80.5"])
def test_a_metrics_port_that_is_no_port_is_a_config_error_naming_the_variable(
    launch: AttemptLaunch, monkeypatch: pytest.MonkeyPatch, port: str
) -> None:
    monkeypatch.setenv("MPJOB_METRICS_PORT", port)
    with pytest.raises(SystemExit) as ended:
        mpjob.start(launch=launch)
    assert ended.value.code == ExitCode.CONFIG_ERROR
    message = _report(launch).message
    assert message.startswith(f"MPJOB_METRICS_PORT={port!r}: "), message
    assert "an integer port from 0 to 65535 (0: any free port), or off" in message


def test_an_unexpected_exception_is_an_infra_error_with_its_traceback(
    launch: AttemptLaunch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended, mpjob.start(launch=launch):
        raise RuntimeError("disk on fire")
    assert ended.value.code == ExitCode.INFRA_ERROR
    message = _report(launch).message
    assert message.startswith("RuntimeError: disk on fire (raised at tests/unit/trainer/test_session.py:"), message
    out, err = capsys.readouterr()
    assert "Traceback" in err and json.loads(out.splitlines()[-1])["kind"] == "RuntimeError"


@pytest.mark.parametrize(
    ("steps", "says"),
    [
        ([0], "end_step(0): optimizer steps are numbered from 1"),  # a loop that counts from 0
        ([1, 2, 2], "end_step(2): optimizer steps are numbered from 1"),
        ([1, 2, 1], "end_step(1): optimizer steps are numbered from 1"),
        ([1, 2, 3, 4, 5, 6, 7], "end_step(7): optimizer steps are numbered from 1"),  # past training.steps
        # A loop that numbers its steps by micro-batch (accumulating 2) closed step 6, the run's last,
        # after 3 optimizer steps, and checkpointed the weights of step 2 as step 4's.
        ([2], "end_step(2): optimizer steps are numbered from 1"),
        ([1, 2, 4], "end_step(4): optimizer steps are numbered from 1"),
    ],
)
def test_closing_a_step_out_of_order_is_a_config_error_before_it_is_checkpointed(
    launch: AttemptLaunch, steps: list[int], says: str
) -> None:
    """Every step closes once, counting up to training.steps: a loop that numbers its steps
    otherwise would checkpoint weights under another step's number and never write the last."""
    with pytest.raises(SystemExit) as ended, mpjob.start(launch=launch) as run:
        objs = _objects()
        run.resume(**objs)
        for step in steps:
            run.backward(objs["model"](torch.randn(8, 4)).pow(2).mean())
            run.step(objs["optimizer"])
            run.end_step(step)
    assert ended.value.code == ExitCode.CONFIG_ERROR
    report = _report(launch)
    assert report.message.startswith(says), report.message
    assert f"after step {steps[-2] if len(steps) > 1 else 0}" in report.message
    written = sorted(p.name for p in Path(launch.checkpoint_dir).glob("step-*"))
    assert written == [f"step-{s:09d}" for s in sorted(set(steps[:-1])) if s % 3 == 0]


def test_an_fp16_step_that_asks_for_no_update_is_no_overflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step closed without run.step (a model with no parameters, a step that only evaluates)
    had no gradients to overflow: fp16 counts no overflow-skipped step for it, as bf16 does not."""
    guard = {"maxConsecutiveOverflows": 3}
    job = spec(training={"steps": 6, "logEvery": 3}, precision={"mode": "fp16", "guard": guard})
    launch = in_process_launch(tmp_path, monkeypatch, job, "fp16")
    with mpjob.start(launch=launch) as run:
        model = nn.ReLU()
        run.resume(model=model)
        for step in range(run.total_steps):
            with run.autocast():
                loss = model(torch.randn(2, 4)).sum()
            run.end_step(step + 1, loss=loss, samples=2)
    report = _report(launch)
    assert report.reason == "Succeeded", report.message
    assert report.counters.overflow_steps == 0


def _two_optimizers(run: mpjob.Session) -> list[tuple[nn.Linear, torch.optim.SGD]]:
    """Two one-weight models, each with its own SGD, resumed in `run`."""
    models = (nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False))
    pairs = [(model, torch.optim.SGD(model.parameters(), lr=0.1)) for model in models]
    (a, first), (b, second) = pairs
    run.resume(a=a, b=b, first=first, second=second)
    return pairs


def test_fp16_steps_each_of_several_optimizers_with_its_true_gradients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One loss, two optimizers (GradScaler's multi-optimizer use): the first one's gradients
    overflow and it skips its step; the second still steps with its own gradients unscaled by the
    scale they were scaled with, and the scale backs off once for the step, not once per optimizer."""
    job = spec(training={"steps": 1, "logEvery": 1}, checkpoint={"everySteps": 1}, precision={"mode": "fp16"})
    launch = in_process_launch(tmp_path, monkeypatch, job, "fp16")
    with mpjob.start(launch=launch) as run:
        (a, first), (b, second) = _two_optimizers(run)
        before_a, before_b = a.weight.detach().clone(), b.weight.detach().clone()
        x = torch.ones(1, 1)
        run.backward(a(x).sum() * 1e35 + b(x).sum())  # a's gradient overflows once scaled; b's is 1
        run.step(first)
        run.step(second)
        run.end_step(1, samples=1)
        assert run.scaler is not None and run.scaler.get_scale() == 32768.0
    assert torch.equal(a.weight, before_a)  # skipped
    assert torch.allclose(b.weight, before_b - 0.1)  # its true gradient, 1


def test_an_fp16_optimizer_without_gradients_steps_as_it_does_in_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An optimizer none of whose parameters got a gradient this step (frozen ones, the idle half of
    an alternating loop, a first step with nothing to train) changes nothing, in fp16 as in bf16,
    instead of ending the attempt in GradScaler's "no inf checks were recorded"."""
    job = spec(training={"steps": 3, "logEvery": 1}, checkpoint={"everySteps": 3}, precision={"mode": "fp16"})
    launch = in_process_launch(tmp_path, monkeypatch, job, "fp16")
    with mpjob.start(launch=launch) as run:
        (a, first), (b, second) = _two_optimizers(run)
        before_a, before_b = a.weight.detach().clone(), b.weight.detach().clone()
        for step in range(run.total_steps):
            if step:  # step 1 trains nothing: no backward at all
                run.backward(a(torch.ones(1, 1)).sum())
            run.step(first)
            run.step(second)
            run.end_step(step + 1, samples=1)
    assert _report(launch).reason == "Succeeded"
    assert torch.equal(b.weight, before_b) and not torch.equal(a.weight, before_a)


def test_start_without_an_attempt_is_a_config_error(launch: AttemptLaunch) -> None:
    with pytest.raises(SystemExit) as ended:
        mpjob.start()
    assert ended.value.code == ExitCode.CONFIG_ERROR
    assert "MPJOB_LAUNCH" in _report(launch).message


def test_generators_are_kept_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy is not a dependency: without it the torch and Python generators still round-trip."""
    import random

    from mpjob_trainer.session import generators

    monkeypatch.setattr(generators, "np", None)
    generators.seed_everything(5)
    saved = generators.rng_state()
    assert "numpy" not in saved
    first = (torch.rand(3), random.random())
    generators.set_rng_state(saved)
    assert torch.equal(first[0], torch.rand(3)) and first[1] == random.random()


def _ends_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, last: torch.Tensor, **guard: Any) -> Any:
    """Six steps of the SDK's loop (checkpoints at 3 and 6) whose last step's inputs are `last`:
    the report, the checkpoints written and the weights the run ended on."""
    job = spec(
        training={"steps": 6, "logEvery": 3},
        checkpoint={"everySteps": 3},
        precision={"mode": precision, "guard": guard},
    )
    launch = in_process_launch(tmp_path, monkeypatch, job, precision)
    model = nn.Linear(4, 1)
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        run.resume(model=model, optimizer=optimizer)
        train_squares(run, model, optimizer, 0, lambda i: last if i == 5 else torch.ones(4, 4))
    saved = sorted(p.name for p in Path(launch.checkpoint_dir).glob("step-*"))
    return _report(launch), saved, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_an_fp16_run_that_ends_in_an_overflow_skipped_step_writes_its_final_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last step overflowed and was skipped: the weights are the step before's, finite, and
    the run ends on them; its final checkpoint holds them (not the one of step 3)."""
    report, saved, weights = _ends_on(tmp_path, monkeypatch, "fp16", torch.full((4, 4), 1e6))
    assert report.reason == "Succeeded" and report.counters.overflow_steps >= 1, report.message
    assert saved == ["step-000000003", "step-000000006"] and report.last_good_checkpoint.step == 6
    assert torch.isfinite(weights).all()


def test_a_run_whose_last_step_leaves_non_finite_weights_does_not_end_succeeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no replay to tell data from precision (guard.replaySteps 0), a NaN at the last step
    in bf16 leaves NaN weights: no final checkpoint can hold them, and the run must not end
    Succeeded on them, but as a numeric fault resumed from the last good checkpoint."""
    report, saved, weights = _ends_on(tmp_path, monkeypatch, "bf16", torch.full((4, 4), math.nan), replaySteps=0)
    assert not torch.isfinite(weights).all()
    assert (report.reason, report.last_good_checkpoint.step, saved) == ("NumericFault", 3, ["step-000000003"])
    assert "non-finite" in report.message and "step 6" in report.message, report.message


@pytest.mark.parametrize(("at", "reason"), [(6, "Succeeded"), (5, "Preempted")])
def test_a_sigterm_during_the_last_step_ends_the_run_succeeded_not_preempted(
    launch: AttemptLaunch, at: int, reason: str
) -> None:
    """The stop a SIGTERM asks for is honoured where the step ends; at the last step nothing is left
    to train: the run ends Succeeded on its final checkpoint, and no next attempt is started to
    train nothing (a growth or a drain that lands as an elastic attempt ends). Before it, it stops."""
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(model=model, optimizer=optimizer)
        for step in range(1, run.total_steps + 1):
            run.backward(model(torch.randn(8, 4)).pow(2).mean())
            run.step(optimizer)
            if step == at:
                signal.raise_signal(signal.SIGTERM)  # the session's handler only raises its flag
            run.end_step(step)
    report = _report(launch)
    assert (report.reason, report.step) == (reason, at)
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == at


def test_a_sigterm_in_a_first_step_fp16_skipped_says_no_checkpoint_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16's first step overflows at GradScaler's initial scale and is skipped: the state stands in an
    overflow-skipped step, which is never checkpointed, so the stop it asks for writes none and says so."""
    job = spec(training={"steps": 6, "logEvery": 3}, checkpoint={"everySteps": 3}, precision={"mode": "fp16"})
    launch = in_process_launch(tmp_path, monkeypatch, job, "fp16")
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(model=model, optimizer=optimizer)
        with run.autocast():
            loss = model(torch.full((8, 4), 1e3)).pow(2).mean()  # its scaled gradients overflow fp16
        run.backward(loss)
        run.step(optimizer)
        signal.raise_signal(signal.SIGTERM)
        run.end_step(1)
    report = _report(launch)
    assert (report.reason, report.step, report.last_good_checkpoint) == ("Preempted", 1, None)
    assert "no checkpoint written" in report.message and "checkpoint written" not in report.message.replace(
        "no checkpoint written", ""
    ), report.message
    assert not Path(launch.checkpoint_dir).exists() or list(Path(launch.checkpoint_dir).iterdir()) == []
