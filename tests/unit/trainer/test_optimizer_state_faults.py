"""A current-format checkpoint's optimizer state is checked before anything is loaded, by the rule
a format-1 one is (checkpoint.optimizer_state): a state no optimizer writes, or one that disagrees
with the checkpoint's own weights, is the checkpoint's fault (CorruptCheckpoint: the resume passes
it over for the one before it), never a ConfigError that ends the job nor a load that passes and a
first step that fails in every attempt; a sound state that does not fit a model the user changed
stays a configuration error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_trainer.checkpoint import CheckpointStore, CorruptCheckpoint, resume
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState
from tests.unit.trainer.test_checkpoint_format_faults import MALFORMED
from tests.unit.trainer.test_sharded_optimizer_faults import PLANTED

pytestmark = pytest.mark.unit


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.1)


def _run(width: int = 4, make: Any = _sgd) -> TrainingState:
    """A model of hidden `width` and its optimizer (`make`: SGD with momentum), one step taken (so
    it holds state)."""
    model = nn.Sequential(nn.Linear(3, width), nn.Linear(width, 2))
    optimizer = make(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    return TrainingState({"model": model, "optimizer": optimizer})


def _written(store: CheckpointStore, step: int, malformed: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint of `step` whose optimizer state is overlaid with `malformed` before it is
    written (its sha256 is the manifest's), as verified on reading."""
    state = _run().capture(step, step, "fp32", None)
    state["optimizer"] = {**state["optimizer"], **(malformed or {})}
    _, read = store.verify(Path(store.write(step, "fp32", state).ref.path))
    return read


@pytest.mark.parametrize("malformed", MALFORMED.values(), ids=MALFORMED.keys())
def test_an_optimizer_state_of_no_optimizers_shape_is_the_checkpoints_fault(
    tmp_path: Path, malformed: dict[str, Any]
) -> None:
    state = _written(CheckpointStore(tmp_path, keep=5, config_digest="d"), 5, malformed)
    with pytest.raises(CorruptCheckpoint, match=r"the checkpoint of step 5: its 'optimizer' is no optimizer state: "):
        _run().restore(state, "fp32", None)


def test_a_resume_passes_a_malformed_optimizer_state_over_for_the_checkpoint_before_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    _written(store, 5)
    _written(store, 10, MALFORMED["state-a-list"])
    rejected: list[dict[str, Any]] = []
    store.log = lambda event, **f: rejected.append({"event": event, **f})
    run = _run()
    loaded = resume.load(store, restore=lambda found: run.restore(found[1], "fp32", None))
    assert loaded is not None and loaded[0].step == 5
    assert [(r["event"], Path(r["path"]).name) for r in rejected] == [("checkpointRejected", "step-000000010")]


def test_a_state_the_checkpoints_own_weights_disagree_with_is_its_fault_before_anything_loads(tmp_path: Path) -> None:
    """torch's load takes a state of any shape: the first step would fail, in every attempt."""
    state = _written(CheckpointStore(tmp_path, keep=5, config_digest="d"), 5)
    state["optimizer"]["state"][0]["momentum_buffer"] = torch.zeros(3, 3)
    run = _run()
    before = [p.detach().clone() for p in run.parameters()]
    with pytest.raises(
        CorruptCheckpoint, match=r"state 'momentum_buffer' has shape \(3, 3\) where the checkpoint's own"
    ):
        run.restore(state, "fp32", None)
    assert all(torch.equal(a, b) for a, b in zip(before, run.parameters(), strict=True))


def test_a_checkpoint_of_a_model_the_user_changed_stays_a_configuration_error(tmp_path: Path) -> None:
    state = _written(CheckpointStore(tmp_path, keep=5, config_digest="d"), 5)
    with pytest.raises(ConfigError, match=r"the model changed since it was written"):
        _run(width=8).restore(state, "fp32", None)


def test_an_optimizer_registered_alone_whose_state_does_not_fit_is_a_configuration_error(tmp_path: Path) -> None:
    """No weights of the checkpoint's own to compare with: the state fits no parameter of this run."""
    written = _run()
    state = TrainingState({"optimizer": written.optimizers()[0]}).capture(5, 5, "fp32", None)
    other = _run(width=8)
    with pytest.raises(ConfigError, match=r"where this run's parameter has \(8, 3\)"):
        TrainingState({"optimizer": other.optimizers()[0]}).restore(state, "fp32", None)


@pytest.mark.parametrize("held", [[1.0, 2.0], "weights", None, 3], ids=["list", "str", "none", "int"])
@pytest.mark.parametrize("name", ["model", "optimizer"])
def test_a_state_that_is_no_dict_under_a_modules_or_optimizers_name_is_the_checkpoints_fault(
    tmp_path: Path, name: str, held: Any
) -> None:
    """torch writes them as dicts: before, torch's 'Expected state_dict to be dict-like' was a
    ConfigError that ended the job; the resume now passes it over for the checkpoint before it."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    _written(store, 5)
    state = _run().capture(10, 10, "fp32", None)
    state[name] = held
    store.write(10, "fp32", state)
    run = _run()
    _, read = store.verify(tmp_path / "step-000000010")
    with pytest.raises(CorruptCheckpoint, match=rf"step 10 holds a {type(held).__name__} under '{name}', not the"):
        run.restore(read, "fp32", None)
    loaded = resume.load(store, restore=lambda found: run.restore(found[1], "fp32", None))
    assert loaded is not None and loaded[0].step == 5


class _Net(nn.Module):
    """Two layers whose registration order (so the order `parameters()` lists them in, which the
    optimizer's state follows) is `order`; their names, shapes and forward stay the same."""

    def __init__(self, order: str) -> None:
        super().__init__()
        for name in order:
            setattr(self, name, nn.Linear(3, 4) if name == "a" else nn.Linear(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _net_run(order: str) -> TrainingState:
    torch.manual_seed(0)
    model = _Net(order)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    return TrainingState({"model": model, "optimizer": optimizer})


def test_a_model_whose_layers_were_registered_in_another_order_is_a_configuration_error_not_corruption() -> None:
    """The checkpoint agrees with itself: its states follow the order its own run listed the
    parameters in. Taken for corruption, every checkpoint of the job would be passed over."""
    state = _net_run("ab").capture(5, 5, "fp32", None)
    with pytest.raises(ConfigError, match=r"the model changed since it was written"):
        _net_run("ba").restore(state, "fp32", None)


class _LowRankAdam(torch.optim.Optimizer):
    """An optimizer of another library's kind (GaLore's): it keeps its first moment, under Adam's
    name, in the shape of the gradient projected to rank 1, not in its parameter's shape."""

    def __init__(self, params: Any, lr: float = 0.01) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad.reshape(param.shape[0], -1)
                projected = grad.mean(dim=0, keepdim=True)  # rank 1: (1, columns)
                moment = self.state[param].setdefault("exp_avg", torch.zeros_like(projected))
                moment.mul_(0.9).add_(projected, alpha=0.1)
                param.add_(moment.expand_as(grad).reshape(param.shape), alpha=-group["lr"])


def test_an_optimizer_not_of_torchs_kinds_is_not_held_to_their_state_shapes() -> None:
    def run() -> TrainingState:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
        optimizer = _LowRankAdam(model.parameters())
        model(torch.randn(2, 3)).sum().backward()
        optimizer.step()
        return TrainingState({"model": model, "optimizer": optimizer})

    written = run()
    state = written.capture(5, 5, "fp32", None)
    resumed = run()
    resumed.restore(state, "fp32", None)
    (optimizer,) = resumed.optimizers()
    assert [tuple(s["exp_avg"].shape) for s in optimizer.state.values()] == [(1, 3), (1, 1), (1, 4), (1, 1)]


def _with_settings(store: CheckpointStore, step: int, **group: Any) -> dict[str, Any]:
    """An AdamW run's checkpoint of `step` whose param group holds `group`, as verified on reading."""
    state = _run(make=_adamw).capture(step, step, "fp32", None)
    state["optimizer"]["param_groups"][0].update(group)
    _, read = store.verify(Path(store.write(step, "fp32", state).ref.path))
    return read


@PLANTED
def test_a_setting_of_another_kind_is_the_checkpoints_fault_before_anything_loads(
    tmp_path: Path, planted: dict[str, Any]
) -> None:
    """The sharded rule (test_sharded_optimizer_faults): before, it loaded, and the first step of
    every attempt failed (an InfraError, retried) instead of the previous good one being used."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    _with_settings(store, 5)
    state = _with_settings(store, 10, **planted)
    run = _run(make=_adamw)
    before = [p.detach().clone() for p in run.parameters()]
    with pytest.raises(
        CorruptCheckpoint, match=rf"step 10: its 'optimizer' param group 0's {next(iter(planted))} is a"
    ):
        run.restore(state, "fp32", None)
    assert all(torch.equal(a, b) for a, b in zip(before, run.parameters(), strict=True)), "nothing loaded"
    assert run.optimizers()[0].param_groups[0]["betas"] == (0.9, 0.999)
    loaded = resume.load(store, restore=lambda found: run.restore(found[1], "fp32", None))
    assert loaded is not None and loaded[0].step == 5


def test_settings_a_run_may_have_changed_still_load(tmp_path: Path) -> None:
    """A whole-number lr, a flag set where this run leaves it None, a one-value tensor for a number;
    the flag, how the step runs, stays the run's (checkpoint.optimizer_settings.RUN_FLAGS)."""
    changed = {"lr": 1, "foreach": False, "eps": torch.tensor(2.0**-20), "betas": (0.8, 0.99)}
    state = _with_settings(CheckpointStore(tmp_path, keep=5, config_digest="d"), 5, **changed)
    run = _run(make=_adamw)
    run.restore(state, "fp32", None)
    group = run.optimizers()[0].param_groups[0]
    assert (group["lr"], group["foreach"], float(group["eps"]), group["betas"]) == (1, None, 2.0**-20, (0.8, 0.99))


def _sgd_wrote(store: CheckpointStore) -> dict[str, Any]:
    state = _run().capture(5, 5, "fp32", None)
    _, read = store.verify(Path(store.write(5, "fp32", state).ref.path))
    return read


def _three_betas_wrote(store: CheckpointStore) -> dict[str, Any]:
    """An Adam-like optimizer of three betas (Adan's kind), its other settings AdamW's."""
    return _with_settings(store, 5, betas=(0.9, 0.92, 0.99))


@pytest.mark.parametrize(
    ("wrote", "said"),
    [
        (_sgd_wrote, r"param group 0 lacks betas, eps \(it holds dampening, momentum, nesterov\)"),
        (_three_betas_wrote, r"param group 0 holds betas of 3 items where this run's optimizer holds 2"),
    ],
    ids=["sgd-then-adamw", "three-betas-then-adamw"],
)
def test_a_checkpoint_of_another_optimizer_configuration_stops_naming_the_setting(
    tmp_path: Path, wrote: Any, said: str
) -> None:
    """Before, CorruptCheckpoint: every checkpoint of the run passed over, the job back at step 0."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    read = wrote(store)
    run = _run(make=_adamw)
    with pytest.raises(ConfigError, match=rf"step 5: its 'optimizer' {said}: it was written by another optimizer"):
        run.restore(read, "fp32", None)
    with pytest.raises(ConfigError):  # not passed over for an older one, nor for step 0
        resume.load(store, restore=lambda found: run.restore(found[1], "fp32", None))


@pytest.mark.parametrize(
    "planted",
    [{"lr": float("nan")}, {"lr": -0.1}, {"eps": float("inf")}, {"betas": (0.9, 1.0)}, {"betas": (-0.1, 0.9)}],
    ids=["lr-nan", "lr-negative", "eps-inf", "beta-one", "beta-negative"],
)
def test_a_setting_of_the_right_kind_but_no_value_an_optimizer_runs_with_is_the_checkpoints_fault(
    tmp_path: Path, planted: dict[str, Any]
) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    _with_settings(store, 5)
    state = _with_settings(store, 10, **planted)
    run = _run(make=_adamw)
    key = next(iter(planted))
    with pytest.raises(CorruptCheckpoint, match=rf"step 10: its 'optimizer' param group 0's {key} is .* allowed"):
        run.restore(state, "fp32", None)
    loaded = resume.load(store, restore=lambda found: run.restore(found[1], "fp32", None))
    assert loaded is not None and loaded[0].step == 5
