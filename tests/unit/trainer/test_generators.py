"""A checkpoint's generators on a process that sees fewer (or more) CUDA devices than the one
that wrote it: the devices there are get theirs, the rest are left, never an error after the
objects were loaded."""

from __future__ import annotations

import pytest
import torch

from mpjob_trainer.session.generators import cuda_states_for, rng_problem, rng_state, set_rng_state

pytestmark = pytest.mark.unit


def _states(count: int) -> list[torch.Tensor]:
    return [torch.full((16,), i, dtype=torch.uint8) for i in range(count)]


def test_a_smaller_node_gets_the_states_of_the_devices_it_has_and_is_told_how_many_were_left() -> None:
    states = _states(8)
    kept, left = cuda_states_for(states, 2)
    assert [int(s[0]) for s in kept] == [0, 1] and left == 6


@pytest.mark.parametrize("devices", [4, 6])
def test_a_node_as_large_or_larger_gets_every_state(devices: int) -> None:
    kept, left = cuda_states_for(_states(4), devices)
    assert [int(s[0]) for s in kept] == [0, 1, 2, 3] and left == 0


def test_cuda_states_not_as_torch_keeps_them_make_the_generators_unusable() -> None:
    good = rng_state()
    assert rng_problem({**good, "cuda": _states(2)}) is None
    for bad in ([1, 2], [torch.zeros(16)], "states", [torch.zeros((2, 8), dtype=torch.uint8)]):
        assert "no CUDA generator states" in (rng_problem({**good, "cuda": bad}) or ""), bad


@pytest.mark.gpu
def test_more_cuda_states_than_devices_restore_those_of_the_devices_there_are() -> None:
    state = rng_state()
    wanted = torch.cuda.get_rng_state(0).clone()
    state["cuda"] = [wanted] * (torch.cuda.device_count() + 3)
    torch.cuda.manual_seed_all(123)
    set_rng_state(state)
    assert torch.equal(torch.cuda.get_rng_state(0), wanted)
