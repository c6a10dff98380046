"""keepFp32's inputs: a kept module computes in fp32 whatever shape its forward's arguments
take (tensors in tuples, lists, dicts, keywords), and what is not a floating tensor reaches it
as it was passed (the same object, no copy)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from mpjob_trainer.precision import keep_fp32

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")
LOW = [torch.bfloat16, torch.float16]


class Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


class Mixer(nn.Module):
    """A type of our own taking nested inputs; records the dtype of each floating tensor it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.seen: list[torch.dtype] = []

    def _see(self, *tensors: torch.Tensor) -> None:
        self.seen += [t.dtype for t in tensors]

    def forward(self, batch: dict[str, Any], pair: tuple[torch.Tensor, ...], *, extra: list[torch.Tensor]) -> Any:
        self._see(batch["x"], batch["inner"]["y"], *pair, *extra)
        out = self.proj(batch["x"]) + self.proj(batch["inner"]["y"]) + pair[0] * pair[1] + extra[0]
        return out.sum(-1) + batch["ids"].float()


def _inputs(dtype: torch.dtype) -> tuple[dict[str, Any], tuple[torch.Tensor, ...], list[torch.Tensor]]:
    def low() -> torch.Tensor:
        return torch.randn(4, 8).to(dtype)

    batch = {"x": low(), "inner": {"y": low()}, "ids": torch.arange(4), "name": "batch"}
    return batch, Pair(low(), low()), [low()]


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_floating_tensors_nested_in_a_kept_forwards_arguments_reach_it_in_fp32(dtype: torch.dtype) -> None:
    mixer = Mixer()
    assert keep_fp32(mixer, ["Mixer"], CPU) == [""]
    batch, pair, extra = _inputs(dtype)
    with torch.autocast("cpu", dtype=dtype):
        out = mixer(batch, pair, extra=extra)
    assert mixer.seen == [torch.float32] * 5
    assert out.dtype == torch.float32
    reference = Mixer()
    reference.load_state_dict(mixer.state_dict())
    fp32_batch = {**batch, "x": batch["x"].float(), "inner": {"y": batch["inner"]["y"].float()}}
    expected = reference(fp32_batch, Pair(*(t.float() for t in pair)), extra=[extra[0].float()])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_what_is_not_a_floating_tensor_is_passed_as_it_was() -> None:
    received: list[Any] = []

    class Probe(nn.Module):
        def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            received.extend([args, kwargs])
            return torch.zeros(())

    probe = Probe()
    keep_fp32(probe, ["Probe"], CPU)
    ids, steps, names = torch.arange(3), [torch.arange(2), 4], {"a": "x", "b": (torch.arange(1),)}
    low = torch.ones(2, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probe(ids, steps, names, (low, ids), flag=names)
    args, kwargs = received
    assert args[0] is ids and args[1] is steps and args[2] is names and kwargs["flag"] is names
    converted = args[3]
    assert type(converted) is tuple and converted[0].dtype == torch.float32 and converted[1] is ids


@pytest.mark.process
def test_nested_inputs_compile_without_graph_breaks_and_stay_fp32() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.mixer = nn.Linear(8, 8), Mixer()

        def forward(self, x: torch.Tensor) -> Any:
            h = self.inp(x)
            return self.mixer({"x": h, "inner": {"y": h}, "ids": torch.arange(4)}, (h, h), extra=[h])

    outer = Outer()
    keep_fp32(outer, ["Mixer"], CPU)
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(outer)(x)
        compiled = torch.compile(outer, backend="aot_eager", fullgraph=True)(x)
    assert explained.graph_break_count == 0
    assert compiled.dtype == torch.float32
