"""A checkpoint that does not fit one of the objects handed to resume() is refused before any of
them loads: the objects that come before it keep what they held, so a refusal changes nothing."""

from __future__ import annotations

import threading
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


class Position:
    """A script's own stateful object whose load sets one field, then reads the next (a KeyError
    when the state lacks it): a failed load of its own leaves it half-loaded."""

    def __init__(self) -> None:
        self.epoch, self.offset = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]
        self.offset = state["offset"]


class Unlocked(nn.Linear):
    """A module no meta twin can be made of (a lock does not deep-copy): only its own load checks it."""

    def __init__(self, out: int) -> None:
        super().__init__(4, out)
        self.lock = threading.Lock()


def _with_others(head: nn.Module) -> Objects:
    objects = _objects(head)
    objects["schedule"] = torch.optim.lr_scheduler.StepLR(objects["optimizer"], step_size=1, gamma=0.5)
    objects["position"] = Position()
    return objects


def _others_held(objects: Objects) -> tuple[Any, ...]:
    schedule, position = objects["schedule"], objects["position"]
    return schedule.last_epoch, schedule.get_last_lr(), position.epoch, position.offset


def _advanced(objects: Objects) -> dict[str, Any]:
    """A checkpoint of `objects` after a step, a scheduler step and a move of the position."""
    checkpoint_of = _trained(objects)  # captures encoder, head and optimizer only
    objects["schedule"].step()
    objects["position"].epoch, objects["position"].offset = 3, 17
    return {**checkpoint_of, **TrainingState(objects).capture(1, 1, "fp32", None)}


def test_an_object_of_the_scripts_own_that_fails_its_load_leaves_every_object_as_it_was() -> None:
    checkpoint = _advanced(_with_others(nn.Linear(4, 2)))
    checkpoint["position"] = {"epoch": 5}  # its load sets epoch, then finds no offset
    live = _with_others(nn.Linear(4, 2))
    before, others = _held(live), _others_held(live)
    with pytest.raises(ConfigError, match=r"(?s)'position'.*offset"):
        TrainingState(live).restore(checkpoint, "fp32", None)
    assert _others_held(live) == others  # the scheduler and the position too, not only the model
    assert all(torch.equal(a, b) for a, b in zip(_held(live), before, strict=True))
    assert not live["optimizer"].state


def test_a_module_refusing_after_the_others_loaded_puts_them_back() -> None:
    checkpoint = _advanced(_with_others(Unlocked(3)))
    registered = _with_others(Unlocked(2))  # no twin: its own load refuses, after the others loaded
    live = {name: registered[name] for name in ("encoder", "schedule", "position", "head", "optimizer")}
    others = _others_held(live)
    with pytest.raises(ConfigError, match=r"(?s)'head'.*size mismatch"):
        TrainingState(live).restore(checkpoint, "fp32", None)
    assert _others_held(live) == others


def test_a_fitting_checkpoint_loads_the_other_objects_too() -> None:
    saved = _with_others(nn.Linear(4, 2))
    checkpoint = _advanced(saved)
    live = _with_others(nn.Linear(4, 2))
    TrainingState(live).restore(checkpoint, "fp32", None)
    assert _others_held(live) == _others_held(saved) == (1, [0.05], 3, 17)
