"""A checkpoint that does not fit one of the objects handed to resume() is refused before any of
them loads: the objects that come before it keep what they held, so a refusal changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState

pytestmark = pytest.mark.unit

Objects = dict[str, Any]


def _trained(objects: Objects) -> dict[str, Any]:
    """A checkpoint of `objects` after one optimizer step (the optimizer holds state)."""
    model, optimizer = objects["encoder"], objects["optimizer"]
    nn.init.constant_(model.weight, 0.5)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return TrainingState(objects).capture(1, 1, "fp32", None)


def _objects(head: nn.Module, kind: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW) -> Objects:
    encoder = nn.Linear(4, 4)
    return {"encoder": encoder, "head": head, "optimizer": kind(encoder.parameters(), lr=0.1)}


def _held(objects: Objects) -> list[torch.Tensor]:
    tensors = [t.detach().clone() for m in ("encoder", "head") for t in objects[m].state_dict().values()]
    return tensors + [t.clone() for s in objects["optimizer"].state.values() for t in s.values()]


@pytest.mark.parametrize(
    ("saved", "head", "kind", "named"),
    [
        (_objects(nn.Linear(4, 3)), nn.Linear(4, 2), torch.optim.AdamW, r"(?s)'head'.*size mismatch"),
        (
            _objects(nn.Linear(4, 2)),
            nn.Linear(4, 2, bias=False),
            torch.optim.AdamW,
            r"(?s)'head'.*Unexpected key.*bias",
        ),
        (_objects(nn.Linear(4, 2), torch.optim.SGD), nn.Linear(4, 2), torch.optim.AdamW, r"(?s)'optimizer'.*AdamW"),
        (_objects(nn.Linear(4, 2), torch.optim.Adam), nn.Linear(4, 2), torch.optim.Adamax, r"(?s)'optimizer'.*exp_inf"),
    ],
    ids=["shape", "keys", "optimizer-groups", "optimizer-state"],
)
def test_a_checkpoint_one_object_refuses_loads_into_none(
    saved: Objects, head: nn.Module, kind: Callable[..., torch.optim.Optimizer], named: str
) -> None:
    checkpoint = _trained(saved)
    live = _objects(head, kind)
    before = _held(live)
    with pytest.raises(ConfigError, match=named):
        TrainingState(live).restore(checkpoint, "fp32", None)
    after = _held(live)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert not live["optimizer"].state  # nothing loaded into the optimizer either


def test_a_fitting_checkpoint_loads_every_object() -> None:
    saved = _objects(nn.Linear(4, 2))
    checkpoint = _trained(saved)
    live = _objects(nn.Linear(4, 2))
    TrainingState(live).restore(checkpoint, "fp32", None)
    assert torch.equal(live["encoder"].weight, saved["encoder"].weight)
    assert torch.equal(live["head"].bias, saved["head"].bias)
    assert set(live["optimizer"].state[live["encoder"].weight]) == {"step", "exp_avg", "exp_avg_sq"}
