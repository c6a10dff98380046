"""What a user object's load_state_dict raises while a checkpoint is restored: a state that does
not fit the object (torch's size mismatch or missing keys, an optimizer's group count, another
kind's state) is a ConfigError (exit 43, no retry); a load that failed for another reason (an
I/O error, memory) is not the configuration's and is raised as it is (an InfraError, retried)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState

pytestmark = pytest.mark.unit


class Failing:
    """A stateful object whose load raises `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def state_dict(self) -> dict[str, Any]:
        return {"x": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise self.error


def _written(**objects: Any) -> dict[str, Any]:
    return TrainingState(objects).capture(3, 3, "fp32", None)


@pytest.mark.parametrize(
    "error",
    [OSError(5, "Input/output error"), MemoryError(), RuntimeError("the store went away midway")],
    ids=["OSError", "MemoryError", "RuntimeError"],
)
def test_a_load_that_failed_for_another_reason_is_raised_as_it_is(error: BaseException) -> None:
    state = _written(thing=Failing(error))
    with pytest.raises(type(error)) as raised:
        TrainingState({"thing": Failing(error)}).restore(state, "fp32", None)
    assert raised.value is error


def test_a_model_of_another_size_is_a_configuration_error_naming_the_object() -> None:
    state = _written(model=nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"(?s)'model'.*size mismatch"):
        TrainingState({"model": nn.Linear(4, 3)}).restore(state, "fp32", None)


def test_an_optimizer_of_another_group_count_is_a_configuration_error() -> None:
    model = nn.Linear(4, 2)
    state = _written(optimizer=torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1))
    with pytest.raises(ConfigError, match=r"(?s)'optimizer'.*parameter groups"):
        TrainingState({"optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}).restore(state, "fp32", None)
