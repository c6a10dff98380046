"""The attempt's precision state machine (session.modes) and the interval cadence
(session.interval): every mode is entered from TRAIN through one method and leaves TRAIN's
whole state as it found it; PROBE applies no update; intervals fall where the spec says."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mpjob_contract.api import Guard, MixedPrecisionJobSpec, PrecisionSpec
from mpjob_trainer.distributed import World
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.session.interval import Cadence
from mpjob_trainer.session.modes import AttemptPrecision, Mode
from mpjob_trainer.session.steps import StepNumerics
from tests.unit.trainer.conftest import spec

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def amp(precision: str, device: torch.device = CPU, **spec_over: object) -> AttemptPrecision:
    return AttemptPrecision(precision, device, PrecisionSpec.model_validate({"mode": precision, **spec_over}))  # type: ignore[arg-type]


def test_every_mode_gives_back_trains_whole_state_even_when_its_block_raises() -> None:
    state = amp("fp16")
    policy, scaler = state.policy, state.scaler
    assert scaler is not None
    for mode, precision in ((Mode.PROBE, "bf16"), (Mode.PROBE, "fp16"), (Mode.REPLAY, "fp32"), (Mode.EVAL, "fp32")):
        with pytest.raises(ValueError, match="inside"), state.entered(mode, precision):
            assert state.mode is mode and state.precision == precision
            assert state.scaler is not scaler  # a probe's fp16 scaler is its own, fresh
            raise ValueError("inside")
        assert state.mode is Mode.TRAIN and state.policy is policy and state.scaler is scaler
        assert state.precision == "fp16"


def test_eval_and_replay_run_without_autocast_or_scaler() -> None:
    state = amp("bf16")
    with state.autocast():
        assert torch.is_autocast_enabled("cpu")
    for mode in (Mode.EVAL, Mode.REPLAY):
        with state.entered(mode), state.autocast():
            assert not torch.is_autocast_enabled("cpu") and state.scaler is None and state.precision == "fp32"


def test_modes_do_not_nest_and_only_train_settles() -> None:
    state = amp("bf16")
    with state.entered(Mode.EVAL):
        with pytest.raises(RuntimeError, match="cannot enter probe in eval mode"), state.entered(Mode.PROBE, "bf16"):
            pass
        with pytest.raises(RuntimeError, match="cannot settle in eval mode"):
            state.settle("fp32")
    with pytest.raises(RuntimeError, match="settle"), state.entered(Mode.TRAIN):
        pass
    state.settle("fp16")
    assert state.precision == "fp16" and state.scaler is not None and state.mode is Mode.TRAIN


def test_tf32_follows_the_mode_except_evals_plain_fp32_reference() -> None:
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        state = amp("bf16", torch.device("cuda"), tf32=True)  # flags only: no CUDA device needed
        assert not matmul.allow_tf32
        with state.entered(Mode.REPLAY):
            assert matmul.allow_tf32  # fp32 as the spec says (tf32: true)
        assert not matmul.allow_tf32
        with state.entered(Mode.EVAL):
            assert not matmul.allow_tf32  # the reference pass: plain fp32 matmuls
        assert not matmul.allow_tf32
    finally:
        matmul.allow_tf32 = before


def test_a_probe_step_zeroes_the_gradients_and_applies_nothing() -> None:
    state = amp("bf16")
    guard = NumericGuard(Guard(), CPU, World(rank=0, size=1, local_rank=0))
    numerics = StepNumerics(state, guard)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]

    def one_step() -> None:
        numerics.backward(model(torch.ones(2, 4)).sum())
        numerics.step(optimizer, clip_norm=None)

    with state.entered(Mode.PROBE, "fp32"):
        one_step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters()) and numerics.applied.count == 0
    one_step()
    assert not torch.equal(before[0], model.weight) and numerics.applied.count == 1


def test_an_optimizer_made_where_a_freed_one_lay_is_watched_too() -> None:
    """A model wrapped anew in place makes a new optimizer after the old one is freed, often at
    the old one's address: it is hooked all the same, so its fp16 steps count as applied, not as
    overflows (which on one rank only made it skip a checkpoint the others took, and wait)."""
    state = amp("fp16")
    numerics = StepNumerics(state, NumericGuard(Guard(), CPU, World(rank=0, size=1, local_rank=0)))
    model = nn.Linear(4, 1)
    addresses = set()
    for step in range(1, 11):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        addresses.add(id(optimizer))
        numerics.backward(model(torch.ones(2, 4)).sum())
        numerics.step(optimizer, clip_norm=None)
        assert numerics.close(step, None) is None
        del optimizer
    assert len(addresses) < 10  # the case in question: an address was used again
    assert numerics.applied.count == 10 and numerics.guard.consecutive_overflows == 0


def test_the_interval_reads_the_loss_scale_through_gradscalers_public_api() -> None:
    state = amp("fp16", lossScale={"init": 1024.0})
    numerics = StepNumerics(state, NumericGuard(Guard(), CPU, World(rank=0, size=1, local_rank=0)))
    model = nn.Linear(4, 1)
    numerics.backward(model(torch.ones(2, 4)).sum() * float("inf"))  # inf gradients: skipped, the scale backs off
    numerics.step(torch.optim.SGD(model.parameters(), lr=0.1), clip_norm=None)
    numerics.close(1, None)  # end_step: the scaler updates once the step's optimizers have stepped
    assert state.scaler is not None
    assert numerics.read(flag=0.0).guard.loss_scale == state.scaler.get_scale() == 512.0


def test_intervals_fall_on_log_checkpoint_and_last_steps() -> None:
    job = MixedPrecisionJobSpec.model_validate(spec(training={"steps": 30, "logEvery": 5}))
    cadence = Cadence(job, repromote_after=12, training_in=lambda: "bf16")
    assert not cadence.due(3, evaluate=False, stop_alone=False).any
    assert cadence.due(3, evaluate=False, stop_alone=True).stop
    five, ten, last = (cadence.due(s, evaluate=False, stop_alone=False) for s in (5, 10, 30))
    assert (five.log, five.checkpoint) == (True, False) and (ten.log, ten.checkpoint) == (True, True)
    assert last.log and last.checkpoint
    cadence.trouble(4)
    assert not cadence.repromote_due(15) and cadence.repromote_due(16) and not cadence.repromote_due(30)
