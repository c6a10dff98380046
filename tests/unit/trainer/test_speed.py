"""The trainer's speed options: compile, AdamW's decay groups and fused kernel, DataLoader workers
that keep the step-addressed sample order (exact resume included)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.utils.data import default_collate

from mpjob_contract.codes import ExitCode
from mpjob_trainer import speed
from mpjob_trainer.data import StepLoader, StepSampler, data_workers, micro_batch, to_device
from mpjob_trainer.session.ending import Standing, classify
from mpjob_trainer.tasks.mlp import make_task
from tests import warm
from tests.helpers import wait_for
from tests.unit.trainer.conftest import in_process_launch, launch_env, paced_spec, parse, run_trainer, spec

pytestmark = pytest.mark.unit

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10)
        self.head.weight = self.emb.weight
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def test_decay_only_on_parameters_of_two_or_more_dimensions() -> None:
    model = Tied()
    groups = speed.decay_groups(model.named_parameters(), 0.1)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [p is model.emb.weight for p in decay["params"]] == [True]  # tied: once; frozen: left out
    assert {id(p) for p in no_decay["params"]} == {id(model.norm.weight), id(model.norm.bias), id(model.head.bias)}


def test_decay_groups_drop_an_empty_group() -> None:
    groups = speed.decay_groups(nn.Linear(3, 3, bias=False).named_parameters(), 0.1)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1


def test_adamw_is_not_fused_on_cpu_and_keeps_its_settings() -> None:
    opt = speed.adamw(Tied(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.99))
    assert not opt.defaults["fused"]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert all(g["lr"] == 3e-4 and g["betas"] == (0.9, 0.99) for g in opt.param_groups)


@pytest.mark.gpu
def test_adamw_is_fused_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    opt = speed.adamw(Tied().to(CUDA), lr=3e-4, weight_decay=0.1)
    assert opt.defaults["fused"] is True


@pytest.mark.parametrize(
    ("mode", "device", "expected"),
    [("auto", CPU, False), ("auto", CUDA, True), ("always", CPU, True), ("never", CUDA, False)],
)
def test_compile_modes(mode: str, device: torch.device, expected: bool) -> None:
    assert speed.compiles(mode, device) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("version", "cache"), [("2.11.0+cu130", False), ("2.15.0+cu132", True), ("3.0.0", True)])
def test_a_torch_whose_autograd_cache_ignores_autocast_compiles_without_it(
    monkeypatch: pytest.MonkeyPatch, version: str, cache: bool
) -> None:
    import torch._functorch.config

    monkeypatch.setattr(torch, "__version__", version)
    with torch._functorch.config.patch(enable_autograd_cache=True), torch._dynamo.config.patch(suppress_errors=False):
        assert speed.prepare_compile("always", CPU) is True
        assert torch._functorch.config.enable_autograd_cache is cache
    assert speed.torch_release(version) == tuple(int(n) for n in version.split("+")[0].split(".")[:2])


def test_data_workers_default_by_device_unless_set() -> None:
    assert (data_workers(None, CPU), data_workers(None, CUDA), data_workers(3, CPU)) == (0, 2, 3)


def test_a_failed_compile_is_a_configuration_error_naming_the_field() -> None:
    import torch._dynamo.exc

    ending = classify(torch._dynamo.exc.InternalTorchDynamoError("no C compiler"), Standing())
    assert ending.code == ExitCode.CONFIG_ERROR
    assert "training.compile" in ending.message and "no C compiler" in ending.message
    assert classify(RuntimeError("boom"), Standing()).code == ExitCode.INFRA_ERROR


def _same(a: object, b: object) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[call-overload]


def test_step_loader_gives_each_step_its_own_samples_in_any_order() -> None:
    dataset = make_task({"inputs": 4, "samples": 50}).dataset
    sampler = StepSampler(50, batch=4, accumulation=2, world=1, rank=0, seed=7)
    loader = StepLoader(dataset, sampler, span=range(3, 12), workers=2, pin=False)
    try:
        asked = [3, 3, 4, 5, 2, 6, 7, 8, 11, 9]  # a probe runs step 3 twice, a replay goes back
        for step in asked:
            got = loader.micro_batches(step)
            want = [micro_batch(dataset, sampler, step, micro) for micro in range(2)]
            assert len(got) == 2 and all(_same(g, w) for g, w in zip(got, want, strict=True)), step
    finally:
        loader.close()


LONG = {"training": {"steps": 40, "logEvery": 5, "gradAccumulation": 2}, "checkpoint": {"everySteps": 10, "keep": 10}}


def _final(tmp: Path, step: int) -> dict:
    return torch.load(tmp / "ckpt" / f"step-{step:09d}" / "state.pt", weights_only=True)


@pytest.mark.process
class Inputs(NamedTuple):
    tokens: torch.Tensor
    mask: torch.Tensor


def test_a_batch_goes_to_the_device_in_the_shape_the_dataset_gave_it_namedtuples_too() -> None:
    """A task's input may be a namedtuple (default_collate keeps one): the builtin loop hands the
    model the same type, each field on the device."""
    items = [(Inputs(torch.ones(3), torch.zeros(3, dtype=torch.bool)), {"y": torch.ones(1)}) for _ in range(2)]
    inputs, targets = to_device(default_collate(items), torch.device("cpu"))
    assert isinstance(inputs, Inputs) and inputs.tokens.shape == (2, 3) and inputs.mask.dtype == torch.bool
    assert set(targets) == {"y"} and targets["y"].shape == (2, 1)


@pytest.mark.process
def test_data_workers_train_bit_identically_to_the_training_process(tmp_path: Path) -> None:
    runs = {}
    for workers in (0, 2):
        job = spec(precision={"mode": "bf16"}, **{**LONG, "training": {**LONG["training"], "dataWorkers": workers}})
        run = run_trainer(tmp_path / str(workers), job, "bf16")
        assert run.code == 0, run.stderr
        runs[workers] = [e["loss"] for e in run.of("step")]
    assert runs[0] == runs[2]
    a, b = _final(tmp_path / "0", 40), _final(tmp_path / "2", 40)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.process
def test_preempted_with_data_workers_and_resumed_is_bit_identical(tmp_path: Path) -> None:
    settings = {**LONG, "training": {**LONG["training"], "dataWorkers": 2, "steps": 80}}
    straight = run_trainer(tmp_path / "straight", spec(**settings))
    assert straight.code == 0, straight.stderr
    # 30 ms a forward pass, two a step: the 70 steps after checkpoint 10 last 4 s, so SIGTERM
    # lands inside the run however late this test, starved on a busy machine, sends it.
    job = paced_spec(0.03, **settings)
    cut = tmp_path / "cut"
    cut.mkdir()
    env = launch_env(cut, job, "fp32")
    proc = warm.Popen(
        [sys.executable, "-m", "mpjob_trainer"], env=env, stdout=warm.PIPE, text=True, start_new_session=True
    )
    done = cut / "ckpt" / "step-000000010" / "manifest.json"
    wait_for(done.exists, 120, interval=0.02, message="checkpoint 10")
    os.killpg(proc.pid, signal.SIGTERM)  # the trainer and its DataLoader workers, as a pod's stop does
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.PREEMPTED, out  # the workers left SIGTERM to the trainer
    assert [e for e in parse(out) if e["event"] == "preempted"]
    resumed = run_trainer(cut, job, attempt=1, name="report2.json")
    assert resumed.code == 0, resumed.stderr
    a, b = _final(tmp_path / "straight", 80), _final(cut, 80)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.process
def test_compile_always_trains_on_cpu_like_eager(tmp_path: Path) -> None:
    losses = {}
    for mode in ("never", "always"):
        run = run_trainer(tmp_path / mode, spec(training={"compile": mode}, precision={"mode": "bf16"}), "bf16", 600)
        assert run.code == 0, run.stderr
        assert run.of("compile")[0]["compiled"] is (mode == "always")
        losses[mode] = [e["loss"] for e in run.of("step")]
    assert len(losses["always"]) == len(losses["never"])
    torch.testing.assert_close(losses["always"], losses["never"], rtol=0.05, atol=1e-3)


@pytest.mark.parametrize(
    ("training", "compiled", "workers"), [({}, False, 0), ({"compile": "always", "dataWorkers": 3}, True, 3)]
)
@pytest.mark.process
def test_hf_training_arguments_take_the_speed_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, training: dict, compiled: bool, workers: int
) -> None:
    pytest.importorskip("transformers")
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf

    job = spec(task={"command": ["python", "train.py"]}, training=training)
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job))
    try:
        args = hf.training_arguments(run)
        assert (args.torch_compile, args.dataloader_num_workers) == (compiled, workers)
        assert not hf.training_arguments(run, torch_compile=False).torch_compile  # the script may say no
    finally:
        run.close()
