"""An optimizer's state restored into another kind of optimizer is a configuration error naming
what differs, found when it is restored, not a KeyError at its first step (retried as an
infrastructure failure); optimizers of the same kind restore as they did."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState

pytestmark = pytest.mark.unit

Make = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def _trained(make: Make) -> tuple[nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = make(list(model.parameters()))
    for i in range(2):

        def loss(i: int = i) -> torch.Tensor:
            optimizer.zero_grad()
            value = model(torch.full((3, 4), float(i + 1))).pow(2).mean()
            value.backward()
            return value

        optimizer.step(loss)
    return model, optimizer


def _restored(saved_with: Make, resumed_with: Make, times: int = 1) -> torch.optim.Optimizer:
    """An optimizer `resumed_with` builds, restored `times` (a recovery in place restores again)."""
    model, optimizer = _trained(saved_with)
    state = TrainingState({"model": model, "optimizer": optimizer}).capture(2, 2, "fp32", None)
    torch.manual_seed(0)
    fresh = nn.Linear(4, 2)
    resumed = resumed_with(list(fresh.parameters()))
    for _ in range(times):
        TrainingState({"model": fresh, "optimizer": resumed}).restore(state, "fp32", None)
    return resumed


@pytest.mark.parametrize(
    ("saved_with", "resumed_with", "lacking"),
    [
        (lambda p: torch.optim.Adam(p), lambda p: torch.optim.Adamax(p), "exp_inf"),
        (lambda p: torch.optim.AdamW(p, amsgrad=True), lambda p: torch.optim.Adamax(p), "exp_inf"),
    ],
    ids=["adam-into-adamax", "amsgrad-adamw-into-adamax"],
)
def test_a_per_parameter_state_another_kind_wrote_is_a_configuration_error(
    saved_with: Make, resumed_with: Make, lacking: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        _restored(saved_with, resumed_with)
    message = str(raised.value)
    assert "'optimizer'" in message and lacking in message and "parameter 0" in message, message


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.Adam(p, amsgrad=True),
        lambda p: torch.optim.AdamW(p, foreach=True),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.SGD(p, lr=0.1),
        lambda p: torch.optim.Adagrad(p),
        lambda p: torch.optim.LBFGS(p),  # its step needs a closure: nothing to compare, nothing refused
    ],
    ids=["amsgrad", "foreach-adamw", "sgd-momentum", "sgd", "adagrad", "lbfgs"],
)
def test_an_optimizer_of_the_same_kind_restores_and_steps(make: Make) -> None:
    resumed = _restored(make, make, times=2)
    saved = _trained(make)[1].state_dict()["state"]
    assert resumed.state_dict()["state"].keys() == saved.keys(), "the per-parameter state was restored"
    params = [p for group in resumed.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.ones_like(p)
    resumed.step(lambda: torch.tensor(1.0))
