"""A script's own autocast around a registered model is a ConfigError naming what to remove; a
registered module's non-finite buffer (BatchNorm's running statistics) keeps a checkpoint from
being taken as good, as a non-finite weight does."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mpjob_contract.api import PrecisionSpec
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.own_autocast import check_forwards
from mpjob_trainer.session.state import TrainingState

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")


def hooked(precision: str) -> tuple[nn.Module, AttemptPrecision]:
    amp = AttemptPrecision(precision, CPU, PrecisionSpec())  # type: ignore[arg-type]
    model = nn.Linear(4, 2)
    check_forwards([model], amp)
    return model, amp


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_an_fp16_autocast_of_the_script_around_the_model_is_refused_in_another_precision(precision: str) -> None:
    model, _ = hooked(precision)
    refused = pytest.raises(ConfigError, match=r"Linear: .*autocast of torch.float16 .* trains in " + precision)
    with refused, torch.autocast("cpu", dtype=torch.float16):
        model(torch.ones(1, 4))


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_the_sessions_autocast_and_none_at_all_pass(precision: str) -> None:
    model, amp = hooked(precision)
    with amp.autocast():
        model(torch.ones(1, 4))
    model(torch.ones(1, 4))  # an evaluation without autocast


def test_a_non_finite_buffer_makes_the_state_non_finite() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    state = TrainingState({"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})
    assert state.finite()
    model[1].running_mean[0] = float("nan")
    assert not state.finite()


@pytest.mark.parametrize(("precision", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_the_scripts_own_autocast_of_the_attempts_dtype_is_refused_at_the_first_forward(
    precision: str, dtype: torch.dtype
) -> None:
    """Of the same dtype it changes nothing yet, but it would pin the precision at the first
    fallback: told at once, not after the rung is spent."""
    model, _ = hooked(precision)
    refused = pytest.raises(ConfigError, match=r"Linear: .*autocast of .* the script entered itself, not run.autocast")
    with refused, torch.autocast("cpu", dtype=dtype):
        model(torch.ones(1, 4))


def test_a_forward_recomputed_in_the_sessions_backward_passes() -> None:
    """Activation checkpointing recomputes the forward in backward, under the autocast it saw:
    inside run.backward() that is the session's own."""
    model, amp = hooked("bf16")
    with amp.autocast():
        loss = checkpoint(model, torch.ones(1, 4, requires_grad=True), use_reentrant=False).float().sum()
    with amp.ours():
        loss.backward()
    assert model.weight.grad is not None


def test_the_check_costs_a_compiled_model_no_graph_break_and_still_tells() -> None:
    model, amp = hooked("bf16")
    with amp.autocast():  # fullgraph: a graph break would raise
        assert torch.compile(model, fullgraph=True, backend="eager")(torch.ones(1, 4)).dtype == torch.bfloat16
    refused = pytest.raises(ConfigError, match=r"the script entered itself")
    with refused, torch.autocast("cpu", dtype=torch.bfloat16):
        torch.compile(model, backend="eager")(torch.ones(1, 4))
