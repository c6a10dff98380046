"""keepFp32: the table of types autocast already runs in fp32 tells the truth on each device,
everything else kept runs in fp32 through one compile-friendly forward, and nothing a
checkpoint or DistributedDataParallel sees changes."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import precision, session
from mpjob_trainer.precision import AUTOCAST_FP32, autocast_fp32_types, keep_fp32, keep_module_in_fp32, kept_in_fp32
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
LOW = [torch.bfloat16, torch.float16]
Probe = tuple[nn.Module, tuple[torch.Tensor, ...]]


def _x() -> torch.Tensor:
    return torch.randn(4, 8, 16)


def _classes() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(32, 10), torch.randint(0, 10, (32,))


#: A module of each type and fp32 inputs for it: every type in a table needs one here.
PROBES: dict[str, Callable[[], Probe]] = {
    "LayerNorm": lambda: (nn.LayerNorm(16), (_x(),)),
    "GroupNorm": lambda: (nn.GroupNorm(2, 8), (_x(),)),
    "RMSNorm": lambda: (nn.RMSNorm(16), (_x(),)),
    "Softmax": lambda: (nn.Softmax(-1), (_x(),)),
    "LogSoftmax": lambda: (nn.LogSoftmax(-1), (_x(),)),
    "Softplus": lambda: (nn.Softplus(), (_x(),)),
    "CosineSimilarity": lambda: (nn.CosineSimilarity(-1), (_x(), _x())),
    "Linear": lambda: (nn.Linear(16, 16), (_x(),)),
    "MSELoss": lambda: (nn.MSELoss(), (_x(), _x())),
    "L1Loss": lambda: (nn.L1Loss(), (_x(), _x())),
    "SmoothL1Loss": lambda: (nn.SmoothL1Loss(), (_x(), _x())),
    "HuberLoss": lambda: (nn.HuberLoss(), (_x(), _x())),
    "NLLLoss": lambda: (nn.NLLLoss(), (_classes()[0].log_softmax(-1), _classes()[1])),
    "CrossEntropyLoss": lambda: (nn.CrossEntropyLoss(label_smoothing=0.1), _classes()),
    "KLDivLoss": lambda: (nn.KLDivLoss(reduction="batchmean"), (_x().log_softmax(-1), _x().softmax(-1))),
    "BCEWithLogitsLoss": lambda: (nn.BCEWithLogitsLoss(), (_x(), torch.rand(4, 8, 16))),
    "PoissonNLLLoss": lambda: (nn.PoissonNLLLoss(), (_x(), torch.rand(4, 8, 16))),
    "CosineEmbeddingLoss": lambda: (nn.CosineEmbeddingLoss(), (_x()[0], _x()[0], torch.ones(8))),
    "HingeEmbeddingLoss": lambda: (nn.HingeEmbeddingLoss(), (_x(), torch.ones(4, 8, 16))),
    "MarginRankingLoss": lambda: (nn.MarginRankingLoss(), (torch.randn(8), torch.randn(8), torch.ones(8))),
    "SoftMarginLoss": lambda: (nn.SoftMarginLoss(), (_x(), torch.ones(4, 8, 16))),
    "TripletMarginLoss": lambda: (nn.TripletMarginLoss(), (_x()[0], _x()[0], _x()[0])),
    "MultiMarginLoss": lambda: (nn.MultiMarginLoss(), _classes()),
}
#: Ops that move or relabel data: they compute nothing, so their input dtype says nothing.
NO_MATH = {"device", "_to_copy", "detach", "view", "_unsafe_view", "t", "expand", "unsqueeze", "lift_fresh", "alias"}


class LowPrecisionMath(TorchDispatchMode):
    """Records the ops that compute on a floating input other than fp32, below autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        half_to_float = name in ("_softmax", "_log_softmax") and args[2]  # reads fp16, computes in fp32
        low = {t.dtype for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()}
        if name not in NO_MATH and not half_to_float and low - {torch.float32}:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextmanager
def autocast_on(device_type: str, dtype: torch.dtype) -> Iterator[None]:
    """Autocast's own switch: torch.autocast turns itself off for CUDA on a machine without one."""
    before = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device_type, before[0])
        torch.set_autocast_dtype(device_type, before[1])


def _low(inputs: tuple[torch.Tensor, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)


def runs_in_fp32(module: nn.Module, inputs: tuple[torch.Tensor, ...], device_type: str, dtype: torch.dtype) -> bool:
    """Under autocast, on `dtype` inputs: every op computes on fp32 and the output is fp32."""
    with autocast_on(device_type, dtype), LowPrecisionMath() as math:
        out = module(*_low(inputs, dtype))
    return out.dtype == torch.float32 and not math.seen


def matches_fp32(module: nn.Module, inputs: tuple[torch.Tensor, ...], device_type: str, dtype: torch.dtype) -> bool:
    """Real numbers: autocast's result on `dtype` inputs equals fp32 math on the same values."""
    low = _low(inputs, dtype)
    reference = module(*(t.float() if t.is_floating_point() else t for t in low))
    with torch.autocast(device_type, dtype=dtype):
        out = module(*low)
    return out.dtype == torch.float32 and torch.allclose(out, reference, rtol=1e-5, atol=1e-6)


def probe(kind: str, device: str | torch.device = "cpu") -> Probe:
    torch.manual_seed(0)
    with torch.device(device):
        module, inputs = PROBES[kind]()
    return module, tuple(t.to(device) for t in inputs)


# ---------------------------------------------------------------- the table is truthful
@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("kind", sorted(AUTOCAST_FP32["cpu"]))
def test_each_cpu_entry_computes_in_fp32_under_cpu_autocast(kind: str, dtype: torch.dtype) -> None:
    module, inputs = probe(kind)
    assert runs_in_fp32(module, inputs, "cpu", dtype)
    assert matches_fp32(module, inputs, "cpu", dtype)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("kind", sorted(AUTOCAST_FP32["cuda"]))
def test_each_cuda_entry_computes_in_fp32_under_cuda_autocast_on_fake_cuda_tensors(
    kind: str, dtype: torch.dtype
) -> None:
    """CUDA's autocast kernels are in every torch build: fake CUDA tensors run its dispatch here."""
    if kind not in autocast_fp32_types("cuda"):
        pytest.skip(f"{kind} is not autocast's on this torch")
    with FakeTensorMode():
        module, inputs = probe(kind, "cuda")
        assert runs_in_fp32(module, inputs, "cuda", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("kind", sorted(autocast_fp32_types("cuda")))  # this torch's: none skipped on a GPU
def test_each_cuda_entry_computes_in_fp32_on_a_gpu(kind: str, dtype: torch.dtype) -> None:
    """Each entry this torch's CUDA autocast has (an entry from a later torch, RMSNorm before 2.12,
    is not one: `test_rms_norm_counts_on_cuda_from_torch_2_12`); a skip would fail the GPU check."""
    module, inputs = probe(kind, "cuda")
    assert runs_in_fp32(module, inputs, "cuda", dtype)
    assert matches_fp32(module, inputs, "cuda", dtype)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_the_checks_catch_what_autocast_runs_in_low_precision(dtype: torch.dtype) -> None:
    """Linear is autocast's low-precision op on both; LayerNorm keeps its input's dtype on a CPU."""
    for kind in ("Linear", "LayerNorm"):
        module, inputs = probe(kind)
        assert not runs_in_fp32(module, inputs, "cpu", dtype)
        assert not matches_fp32(module, inputs, "cpu", dtype)
    with FakeTensorMode():
        module, inputs = probe("Linear", "cuda")
        assert not runs_in_fp32(module, inputs, "cuda", dtype)


def test_rms_norm_counts_on_cuda_from_torch_2_12(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    assert "RMSNorm" not in autocast_fp32_types("cuda") and "LayerNorm" in autocast_fp32_types("cuda")
    monkeypatch.setattr(torch, "__version__", "2.12.1")
    assert "RMSNorm" in autocast_fp32_types(CUDA)
    assert autocast_fp32_types("mps") == frozenset()


# ---------------------------------------------------------------- what keep_fp32 does
class Gate(nn.Module):
    """A type of our own with a keyword argument."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * scale


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.norm, self.gate = nn.Linear(16, 16), nn.LayerNorm(16), Gate()
        self.loss = nn.MSELoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate(self.norm(self.inp(x)), scale=torch.full((16,), 0.5, dtype=x.dtype))
        return self.loss(h, torch.zeros_like(h))


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def test_a_wrapped_module_computes_in_fp32_under_autocast_and_matches_fp32() -> None:
    gate, x = _net().gate, torch.randn(8, 16, dtype=torch.bfloat16)
    scale = torch.full((16,), 0.5, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gate(x, scale=scale).dtype == torch.bfloat16  # autocast's Linear, unwrapped
    assert keep_fp32(gate, ["Gate"], CPU) == [""]
    reference = gate(x.float(), scale=scale.float())  # no autocast at all
    with torch.autocast("cpu", dtype=torch.bfloat16), LowPrecisionMath() as math:
        out = gate(x, scale=scale)
    assert out.dtype == torch.float32 and not math.seen
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    assert torch.is_autocast_enabled("cpu") is False  # the flag is back as it was


def test_autocast_is_back_on_after_a_wrapped_module_even_when_it_raises() -> None:
    norm = nn.LayerNorm(16)
    keep_fp32(norm, ["LayerNorm"], CPU)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError):
            norm(torch.randn(8, 3))
        assert torch.is_autocast_enabled("cpu")
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16


def test_types_autocast_keeps_in_fp32_are_not_wrapped() -> None:
    net = _net()
    assert keep_fp32(net, ["LayerNorm", "MSELoss", "Gate"], CPU) == ["norm", "gate"]
    assert "forward" not in vars(net.loss)  # MSELoss: fp32 under CPU autocast already
    assert kept_in_fp32(net.norm)  # LayerNorm: not on a CPU
    on_cuda = _net()
    assert keep_fp32(on_cuda, ["LayerNorm", "MSELoss", "Gate"], CUDA) == ["gate"]
    assert "forward" not in vars(on_cuda.norm) and "forward" not in vars(on_cuda.loss)
    assert type(on_cuda.norm).forward is nn.LayerNorm.forward


def test_a_class_of_our_own_named_like_a_skipped_type_is_wrapped() -> None:
    class LayerNorm(nn.Module):  # nanoGPT's: its own forward, whatever autocast does to it
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - x.mean(-1, keepdim=True)

    model = nn.Sequential(LayerNorm(), nn.LayerNorm(4))
    assert keep_fp32(model, ["LayerNorm"], CUDA) == ["0"]


def test_state_dict_keys_and_loading_are_unchanged() -> None:
    plain, kept = _net(), _net()
    keep_fp32(kept, ["LayerNorm", "Gate", "Linear"], CPU)
    assert list(kept.state_dict()) == list(plain.state_dict())
    kept.load_state_dict(plain.state_dict())  # strict: a checkpoint from either loads into either
    plain.load_state_dict(kept.state_dict())


def test_keeping_twice_wraps_once_and_a_deepcopy_runs_its_own_weights() -> None:
    net = _net()
    assert keep_fp32(net, ["LayerNorm"], CPU) == keep_fp32(net, ["LayerNorm"], CPU) == ["norm"]
    forward, _ = vars(net.norm)[precision.KEPT]
    assert forward.__func__ is nn.LayerNorm.forward  # the forward it had, not fp32_forward again
    twin = copy.deepcopy(net)
    assert kept_in_fp32(twin.norm) and vars(twin.norm)["forward"].__self__ is twin.norm
    with torch.no_grad():
        twin.norm.bias.add_(1.0)
    x = torch.randn(2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.allclose(twin.norm(x), net.norm(x) + 1.0)


# ---------------------------------------------------------------- compile and DDP
@pytest.mark.process
def test_no_graph_breaks_and_compiled_matches_eager() -> None:
    """Linear is what CPU autocast would run in bf16: kept, it must stay fp32 compiled too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))
    keep_fp32(model, ["LayerNorm"], CPU)
    keep_module_in_fp32(model[2], "cpu")
    x = torch.randn(8, 16)
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(model)(x)
        eager = model[:3](x)
        compiled = torch.compile(model[:3], backend="aot_eager", fullgraph=True)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert eager.dtype == compiled.dtype == torch.float32
    torch.testing.assert_close(compiled, eager)


@pytest.mark.process
def test_inductor_compiles_a_kept_model_to_the_eager_result() -> None:
    model = _net()
    keep_fp32(model, ["LayerNorm", "Gate"], CPU)
    x = torch.randn(8, 16)
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_a_kept_module_is_not_served_the_graph_compiled_for_a_bare_one() -> None:
    """Dynamo does not guard on module hooks by default: the old pre/post hook pair was served
    the bare model's graph and ran in bf16. An instance `forward` is guarded."""

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16))

    x = torch.randn(8, 16)
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        assert torch.compile(block(), backend="aot_eager")(x).dtype == torch.bfloat16
        kept = block()
        keep_fp32(kept, ["LayerNorm"], CPU)
        assert torch.compile(kept, backend="aot_eager")(x).dtype == torch.float32


def test_a_new_kept_model_reuses_the_graph_compiled_for_the_one_before() -> None:
    """An object per kept module was guarded by identity: each new model in a process
    recompiled, and past dynamo's cache limit ran eagerly (the GPU benchmark's runs)."""
    from torch._dynamo.utils import counters

    def kept() -> nn.Module:
        model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16))
        keep_fp32(model, ["LayerNorm"], CPU)
        return model

    x = torch.randn(8, 16)
    torch._dynamo.reset()
    graphs = []
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        for _ in range(3):
            before = counters["stats"]["unique_graphs"]
            assert torch.compile(kept(), backend="aot_eager")(x).dtype == torch.float32
            graphs.append(counters["stats"]["unique_graphs"] - before)
    assert graphs == [1, 0, 0]


def test_distributed_data_parallel_trains_a_kept_model() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = _net()
        keep_fp32(model, ["LayerNorm", "Gate"], CPU)
        ddp = DistributedDataParallel(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ddp(torch.randn(8, 16))
        loss.backward()
        assert loss.dtype == torch.float32
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
        assert list(ddp.module.state_dict()) == list(_net().state_dict())
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the session
@pytest.fixture
def bf16_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    job = spec(precision={"mode": "bf16", "keepFp32": ["LayerNorm", "MSELoss", "Gate"]})
    return in_process_launch(tmp_path, monkeypatch, job, "bf16")


def test_the_session_logs_what_it_wrapped_and_what_autocast_keeps(
    bf16_launch: AttemptLaunch, capsys: pytest.CaptureFixture[str]
) -> None:
    with session.start(launch=bf16_launch) as run:
        assert run.keep_fp32(_net()) == ["norm", "gate"]
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (kept,) = [e for e in events if e["event"] == "keepFp32"]
    assert kept["wrapped"] == ["norm", "gate"] and kept["skipped"] == ["MSELoss"]
    assert precision.autocast_fp32_types(run.device) >= {"MSELoss"}


@pytest.mark.parametrize("mode", ["bf16", "fp32"])
def test_a_kept_type_named_in_another_case_than_the_models_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """`keepFp32: [layernorm]` for a model of LayerNorms matched nothing and kept nothing in fp32,
    silently (`wrapped: []`). A listed type the model lacks stays fine (a shared spec, the default
    LayerNorm, MSELoss above); one that differs from a type of the model only in case is refused."""
    job = spec(precision={"mode": mode, "keepFp32": ["layernorm", "MSELoss", "Gate"]})
    launch = in_process_launch(tmp_path, monkeypatch, job, mode)
    with pytest.raises(SystemExit) as ended, session.start(launch=launch) as run:
        run.keep_fp32(_net())
    assert ended.value.code == 43
    message = json.loads((tmp_path / "report.json").read_text())["message"]
    assert message.startswith("spec.precision.keepFp32: 'layernorm' names no module type of the model"), message
    assert "did you mean 'LayerNorm'?" in message
