"""fp8 attempts (torchao float8 linears, emulated on the CPU): which linears convert, training,
the fp8-only drift the quality gate catches, plain-tensor checkpoints that resume in any
precision, exact resume after SIGKILL, and the device check."""

from __future__ import annotations

import io
import json
import signal
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mpjob_contract.api import PrecisionSpec
from mpjob_contract.codes import ExitCode
from mpjob_contract.fp8 import Fp8Spec
from mpjob_trainer import float8
from mpjob_trainer import session as mpjob
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.events import EventLog
from mpjob_trainer.precision import keep_fp32
from mpjob_trainer.session.modes import AttemptPrecision, Mode
from mpjob_trainer.tasks.mlp import make_task
from tests import warm
from tests.helpers import wait_for
from tests.unit.trainer.conftest import in_process_launch, launch_env, paced_spec, run_trainer, spec
from tests.unit.trainer.test_resume import _assert_identical, _state

pytestmark = pytest.mark.unit

EMULATED = {"mode": "fp8", "fp8": {"emulate": True}}
MLP = {"inputs": 8, "hidden": 16, "samples": 256}


def is_fp8(module: nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)


def fp8_job(steps: int = 40, **args: object) -> dict:
    return spec(
        task={"builtin": "mlp", "args": {**MLP, **args}},
        training={"steps": steps, "batchSize": 16, "logEvery": 5},
        precision=EMULATED,
        validation={"everySteps": 10, "maxLossDelta": 0.05},
    )


def test_the_default_rules_keep_the_first_last_and_odd_sized_linears_in_bf16() -> None:
    model = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 24), nn.Linear(24, 32), nn.Linear(32, 1))
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert float8.plan(linears, []) == {
        "0": "first linear",
        "1": None,
        "2": float8.DIMS,
        "3": float8.DIMS,
        "4": "last linear",
    }
    assert float8.plan(linears, ["1"])["1"] == "skip"
    assert float8.plan(linears, ["[0-9]"])["1"] == "skip"  # fnmatch patterns


@pytest.mark.process
def test_conversion_switches_with_the_mode_and_keeps_a_plain_state() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(16, 1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    linears = float8.convert(model, Fp8Spec(emulate=True))
    assert linears.names == ["1", "2"] and is_fp8(model[1])
    state = model.state_dict()
    assert state.keys() == before.keys() and all(type(v) is torch.Tensor for v in state.values())
    x = torch.randn(16, 16)  # rows fp8 kernels take
    fp8_out = model(x)
    linears.enable(False)
    assert type(model[1]) is nn.Linear and not torch.equal(model(x), fp8_out)
    linears.enable(True)
    assert torch.equal(model(x), fp8_out)


@pytest.mark.process
def test_a_converted_linear_given_rows_fp8_kernels_cannot_take_computes_as_a_plain_one() -> None:
    """The weight gradient's matmul runs over the input's rows: fp8 kernels take only multiples
    of 16 (a micro-batch of 8 samples failed in the backward on an H200)."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 16))
    linears = float8.convert(model, Fp8Spec(emulate=True))
    layer, plain = model[1], nn.Linear(32, 32)
    plain.load_state_dict(layer.state_dict())
    for rows, fp8 in ((8, False), (3 * 5, False), (16, True), (2 * 8, True)):
        x = torch.randn(rows, 32) if rows != 2 * 8 else torch.randn(2, 8, 32)
        with torch.autocast("cpu", torch.bfloat16):
            same = torch.equal(layer(x), plain(x))
        assert same is not fp8, (rows, fp8)
    x = torch.randn(8, 32, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        layer(x).float().sum().backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    linears.enable(False)
    assert type(layer) is nn.Linear
    linears.enable(True)
    assert is_fp8(layer)


@pytest.mark.process
def test_a_converted_linear_sharded_on_its_own_stays_an_fsdp_unit_both_ways() -> None:
    """A script's blocks may be single linears: FSDP2 makes each its own unit, and a mode change
    (an fp32 replay, the quality gate) must leave its FSDP2 methods and hooks where they were."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 16))
        linears = float8.convert(model, Fp8Spec(emulate=True))
        fully_shard(model[1])
        fully_shard(model)
        sharded_fp8, x = type(model[1]), torch.randn(16, 16)
        linears.enable(False)
        assert isinstance(model[1], FSDPModule) and not is_fp8(model[1]) and isinstance(model[1], nn.Linear)
        model(x).sum().backward()
        model[1].reshard()  # one of FSDP2's methods, on the unit itself
        linears.enable(True)
        assert type(model[1]) is sharded_fp8 and is_fp8(model[1])
        model(x).sum().backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_fp8_needs_an_fp8_device_unless_emulated() -> None:
    with pytest.raises(
        ConfigError, match=r"compute capability >= 8\.9.*this process runs on cpu.*precision\.fp8\.emulate"
    ):
        float8.require_fp8_device(Fp8Spec(), torch.device("cpu"))
    float8.require_fp8_device(Fp8Spec(emulate=True), torch.device("cpu"))


@pytest.mark.process
def test_an_fp8_job_trains_with_its_eligible_linears_in_fp8(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, fp8_job(), "fp8")
    assert run.code == 0, run.stderr
    (converted,) = run.of("fp8")
    assert converted["converted"] == ["6"] and converted["kept"] == {"2": "first linear", "8": "last linear"}
    losses = [s["loss"] for s in run.of("step")]
    assert losses[-1] < losses[0]
    assert max(e["delta"] for e in run.of("eval")) < 0.05  # fp8 stays close to fp32 on a plain workload


@pytest.mark.process
def test_an_fp8_job_on_a_cpu_without_emulate_is_a_configuration_error_naming_the_device(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, {**fp8_job(), "precision": {"mode": "fp8"}}, "fp8")
    assert run.code == ExitCode.CONFIG_ERROR, run.stderr
    assert run.report is not None and "this process runs on cpu" in run.report.message
    assert "precision.fp8.emulate" in run.report.message and not run.of("step")


@pytest.mark.process
def test_the_outlier_drifts_in_fp8_only(tmp_path: Path) -> None:
    drifting = run_trainer(tmp_path / "fp8", fp8_job(fp8OutlierAtStep=15), "fp8")
    assert drifting.code == ExitCode.NUMERIC_FAULT, drifting.stderr
    assert drifting.report is not None and drifting.report.message.startswith("QualityDrift: ")
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in drifting.of("step"))
    bf16 = run_trainer(tmp_path / "bf16", {**fp8_job(fp8OutlierAtStep=15), "precision": {"mode": "bf16"}}, "bf16")
    assert bf16.code == 0, bf16.stderr
    assert max(e["delta"] for e in bf16.of("eval")) < 0.05


@pytest.mark.parametrize("then", ["bf16", "fp32"])
@pytest.mark.process
def test_a_checkpoint_written_in_fp8_resumes_in_bf16_and_fp32_with_identical_weights(tmp_path: Path, then: str) -> None:
    first = run_trainer(tmp_path, fp8_job(steps=20), "fp8")
    assert first.code == 0, first.stderr
    fp8_state = _state(tmp_path / "ckpt" / "step-000000020")  # weights_only: plain tensors or nothing
    assert fp8_state["precision"] == "fp8" and all(type(v) is torch.Tensor for v in fp8_state["model"].values())
    plain = make_task(dict(MLP)).model
    plain.load_state_dict(fp8_state["model"])  # the plain model a bf16 or fp32 attempt builds takes it as it is
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in fp8_state["model"].items())
    job = {**fp8_job(steps=21), "precision": {"mode": then}}
    second = run_trainer(
        tmp_path, job, then, attempt=1, name="r2.json", resume_from=str(tmp_path / "ckpt" / "step-000000020")
    )
    assert second.code == 0, second.stderr
    resume = second.of("resume")[0]
    assert (resume["step"], resume["fromPrecision"]) == (20, "fp8")
    after = _state(tmp_path / "ckpt" / "step-000000021")
    assert after["precision"] == then and after["appliedSteps"] == fp8_state["appliedSteps"] + 1
    for key, value in fp8_state["model"].items():
        torch.testing.assert_close(after["model"][key], value, atol=0.05, rtol=0)  # one step from the same weights


@pytest.mark.process
def test_an_fp8_run_killed_and_resumed_is_bit_identical(tmp_path: Path) -> None:
    settings = {"precision": EMULATED, "training": {"steps": 60, "logEvery": 5}, "checkpoint": {"everySteps": 10}}
    straight = run_trainer(tmp_path / "straight", spec(**settings), "fp8")
    assert straight.code == 0, straight.stderr
    # 100 ms a step: the 50 steps after checkpoint 10 last 5 s, so the kill lands inside the run
    # however late this test, starved on a busy machine, sends it.
    job = paced_spec(0.1, **settings)
    (tmp_path / "cut").mkdir()
    env = launch_env(tmp_path / "cut", job, "fp8", ckpt=tmp_path / "cut" / "ckpt")
    proc = warm.Popen([sys.executable, "-m", "mpjob_trainer"], env=env, stdout=warm.PIPE, text=True)
    checkpoint = tmp_path / "cut" / "ckpt" / "step-000000010" / "manifest.json"
    wait_for(checkpoint.exists, 120, interval=0.02, message="checkpoint 10")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    resumed = run_trainer(tmp_path / "cut", job, "fp8", attempt=1, ckpt=tmp_path / "cut" / "ckpt", name="r2.json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.of("resume")[0]["step"] >= 10
    _assert_identical(
        _state(tmp_path / "straight" / "ckpt" / "step-000000060"), _state(tmp_path / "cut" / "ckpt" / "step-000000060")
    )


def test_the_fp32_modes_run_the_converted_linears_as_plain_ones() -> None:
    spec = PrecisionSpec.model_validate({"fp8": {"emulate": True}})
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 1))
    amp = AttemptPrecision("fp8", torch.device("cpu"), spec)
    lines = io.StringIO()
    assert amp.convert_fp8(model, auto=False, log=EventLog(stream=lines)) == ["1"]
    assert json.loads(lines.getvalue())["converted"] == ["1"]
    assert is_fp8(model[1])
    for mode, precision in ((Mode.EVAL, "fp32"), (Mode.REPLAY, "fp32"), (Mode.PROBE, "bf16")):
        with amp.entered(mode, precision):
            assert type(model[1]) is nn.Linear, mode
        assert is_fp8(model[1]), mode
    bare = AttemptPrecision("fp8", torch.device("cpu"), spec)
    with pytest.raises(ConfigError, match=r"pass the model to run\.wrap\(model\) .* before the first forward"):
        bare.autocast()


class Block(nn.Module):
    """A module type of the script's own, holding a linear fp8 would take."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_linears_a_keep_fp32_module_holds_or_is_stay_out_of_fp8() -> None:
    """keepFp32 works as in bf16: a kept Block's linear computes in fp32, as it does there, not
    in fp8 under a wrapper that turns autocast off; a kept Linear is never converted."""
    spec = PrecisionSpec.model_validate({"fp8": {"emulate": True}, "keepFp32": ["Block"]})
    model = nn.Sequential(nn.Linear(16, 32), Block(), nn.Linear(32, 32), nn.Linear(32, 1))
    plain = nn.Sequential(nn.Linear(16, 32), Block(), nn.Linear(32, 32), nn.Linear(32, 1))
    plain.load_state_dict(model.state_dict())
    amp = AttemptPrecision("fp8", torch.device("cpu"), spec)
    lines = io.StringIO()
    assert amp.convert_fp8(model, auto=False, log=EventLog(stream=lines)) == ["2"]
    assert json.loads(lines.getvalue())["kept"]["1.fc"] == float8.KEEP_FP32
    assert keep_fp32(model, spec.keep_fp32, torch.device("cpu")) == ["1"]
    x = torch.randn(16, 32)
    with amp.autocast():
        kept = model[1](x)
    assert torch.equal(kept, plain[1](x))
    linears = [(n, m) for n, m in plain.named_modules() if isinstance(m, nn.Linear)]
    assert set(float8.plan(linears, [], ["0", "1.fc", "2", "3"]).values()) == {float8.KEEP_FP32}


@pytest.mark.parametrize("set_up", ["wrap", "compile"])
def test_an_own_loop_trains_fp8_with_wrap_alone_as_it_does_fp16_and_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, set_up: str
) -> None:
    """No run.keep_fp32(model): the first set-up helper the loop calls converts the linears."""
    job = spec(training={"steps": 4, "batchSize": 16, "logEvery": 2}, checkpoint={"everySteps": 4}, precision=EMULATED)
    launch = in_process_launch(tmp_path, monkeypatch, job, "fp8")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    lines = io.StringIO()
    monkeypatch.setattr("sys.stdout", lines)
    with mpjob.start(launch=launch) as run:
        net = run.wrap(run.compile(model) if set_up == "compile" else model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run.resume(model=model, optimizer=optimizer)
        for step in range(run.total_steps):
            with run.autocast():
                loss = net(torch.randn(16, 16)).float().pow(2).mean()
            run.backward(loss)
            run.step(optimizer)
            run.end_step(step + 1)
    assert is_fp8(model[2]) and type(model[0]) is nn.Linear  # the default rules
    events = [json.loads(line) for line in lines.getvalue().splitlines() if line.startswith("{")]
    assert [e["converted"] for e in events if e["event"] == "fp8"] == [["2"]]  # once
    steps = [e for e in events if e["event"] == "step"]
    assert [e["precision"] for e in steps] == ["fp8", "fp8"] and all(e["loss"] is not None for e in steps)
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["reason"], report["precision"]) == ("Succeeded", "fp8")


def test_an_fp8_attempt_whose_model_has_no_linear_fp8_can_take_is_a_configuration_error() -> None:
    """Its first and last linear stay in bf16 and no other is there: training it would be bf16
    under fp8's name (the status, the metrics and the MLflow runs saying fp8)."""
    spec = PrecisionSpec.model_validate({"fp8": {"emulate": True}})
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 1))
    amp = AttemptPrecision("fp8", torch.device("cpu"), spec)
    assert amp.convert_fp8(model, auto=False, log=EventLog(stream=io.StringIO())) == []
    with pytest.raises(ConfigError, match=r"no linear of the model can run in fp8 \(0: first linear, 1: last linear\)"):
        amp.autocast()
