"""TrainingState: what a checkpoint holds, so that a resumed run continues bit for bit.

A checkpoint is one dict (CheckpointStore writes it; it must load with weights_only=True, so
it holds tensors, numbers, strings, lists and dicts only). Its top level:
    step, appliedSteps, precision   where the run stands
    scaler                          GradScaler state (fp16 attempts; None otherwise)
    rng                             torch, cuda, python and numpy generator states
    <name>                          state_dict() of each object handed to Session.resume
    samples                         the data position: samples consumed by all ranks together
    lastTrouble                     the step re-promotion counts clean steps from (session.interval)
A state loaded from an older checkpoint format also carries `formatVersion` (set by the store,
never written); `restore` brings it forward first (checkpoint.migrate).

Under a sharded model (its parameters are DTensors: FSDP2) the capture is one rank's: the
model and its optimizer go under `shards` as DCP state dicts of this rank's shards (named in
`shardedObjects`), and `rng` is this rank's own generators, so every rank's draws resume
exactly; everything else is as above (checkpoint.shards writes and reads it). A state read
from a sharded checkpoint holds, under `shards`, the folder its shards are read from.
The user's objects sit at the top level under their own names, so the builtin's `model` and
`optimizer` are where earlier checkpoints and tools expect them; the SDK's own keys are
therefore reserved names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from mpjob_trainer.checkpoint import CorruptCheckpoint, shards
from mpjob_trainer.checkpoint.capture_keys import IN_MEMORY, LISTED, SHARDED_OBJECTS, SHARDS, kinds_problem
from mpjob_trainer.checkpoint.dtypes import check_module_dtypes
from mpjob_trainer.checkpoint.extra_state import check_extra_states
from mpjob_trainer.checkpoint.migrate import FORMAT_KEY, upgrade
from mpjob_trainer.checkpoint.peers import Peers, agreed, all_ranks
from mpjob_trainer.distributed import is_dtensor
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.precision import fresh_scaler_state, scaler_state_problem
from mpjob_trainer.session.early_stop import STOPPED_EARLY
from mpjob_trainer.session.fits import load_all
from mpjob_trainer.session.generators import rng_problem, rng_state, seed_everything, set_rng_state

#: The key of the step re-promotion counts clean steps from (session.interval's Cadence).
LAST_TROUBLE = "lastTrouble"
#: Keys the SDK writes itself; a stateful object cannot be registered under them.
RESERVED = frozenset(
    {"step", "appliedSteps", "precision", "scaler", "rng", "quarantine", "spike", "samples", STOPPED_EARLY, FORMAT_KEY}
    | {LAST_TROUBLE}
    | {SHARDS, SHARDED_OBJECTS, LISTED, IN_MEMORY}
)
__all__ = ["TrainingState", "own_fields_problem", "rng_state", "seed_everything"]  # the generators: session.generators


class OwnPart(Protocol):
    """One of the SDK's own stateful parts (the quarantine, the spike window): it says what makes
    a checkpoint's state of it unusable (None: nothing) before anything is loaded."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def state_problem(self, state: Any) -> str | None: ...


def own_fields_problem(state: dict[str, Any], own: dict[str, OwnPart] | None = None) -> str | None:
    """What makes the fields the SDK writes itself unusable (None: nothing): generators not as
    `rng_state` captures them, a count (samples, appliedSteps) that is no count, a GradScaler state
    GradScaler.load_state_dict cannot take, or a state of one of the `own` parts it refuses. A
    weights-only pickle may hold any plain value there, so they are checked before anything is
    loaded: a checkpoint is rejected whole, never loaded in part."""
    problem = rng_problem(state.get("rng"))
    if problem is not None:
        return problem
    for key in ("samples", "appliedSteps"):
        value = state.get(key)
        if value is not None and (type(value) is not int or value < 0):
            return f"holds {key} {value!r:.40}, not a count"
    if (scaler := scaler_state_problem(state.get("scaler"))) is not None:
        return f"holds a GradScaler state {scaler}"
    for name, part in (own or {}).items():
        if name in state and (problem := part.state_problem(state[name])) is not None:
            return f"holds {problem}"
    return None


def state_kind_problem(state: dict[str, Any], objects: dict[str, Any]) -> str | None:
    """What `state` holds under the name of a module or an optimizer among `objects` that no
    state_dict() of theirs is (None: nothing): torch writes them as dicts, so anything else there is
    the checkpoint's fault, where torch's load would say "Expected state_dict to be dict-like"."""
    for name, obj in objects.items():
        held = state.get(name)
        if name in state and isinstance(obj, torch.nn.Module | torch.optim.Optimizer) and not isinstance(held, dict):
            return f"holds a {type(held).__name__} under {name!r}, not the state of a {type(obj).__name__} (a dict)"
    return None


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor parameter; any other tensor as it is."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def model_tensors(modules: Iterable[torch.nn.Module], parameters: Iterable[torch.Tensor] = ()) -> list[torch.Tensor]:
    """What a checkpoint holds of a model, the SDK's and a framework's alike: `parameters` (the
    trained ones), and every one of `modules`' parameters and floating-point buffers (BatchNorm's
    running statistics, an EMA copy's), each once. A forward pass changes the buffers even of a
    step GradScaler skips: one fp16 forward overflow leaves running statistics NaN for good."""
    held = [*parameters, *(t for m in modules for t in (*m.parameters(), *m.buffers()) if t.is_floating_point())]
    return list({id(t): t for t in held}.values())


def all_finite(tensors: Iterable[torch.Tensor], *, agree: bool = True) -> bool:
    """Is every one of `tensors` (this rank's shard of a DTensor) finite? One host sync: each one's
    verdict stays on its device, they are gathered (onto a CUDA device if any is there: device-to-
    device copies are stream-ordered, not synced) and read once. With `agree`, true on every rank
    only when true on all (an all-reduce, where there is a process group): a sharded model's rank
    sees its shards only, and under DDP each rank's forward updates its own buffers from its own
    batch, so one rank may hold NaN statistics the others do not until the next broadcast."""
    local = [_local(t) for t in tensors]
    if not local:
        return True
    target = next((t.device for t in local if t.device.type == "cuda"), local[0].device)
    verdict = torch.stack([torch.isfinite(t.detach()).all().to(target) for t in local]).all()
    return bool(all_ranks(verdict) if agree else verdict)


class TrainingState:
    """The named stateful objects of a run (anything with state_dict/load_state_dict)."""

    def __init__(self, objects: dict[str, Any], own: dict[str, OwnPart] | None = None) -> None:
        for name, obj in objects.items():
            if name in RESERVED:
                raise ConfigError(f"resume({name}=...): {name!r} is reserved; reserved: {', '.join(sorted(RESERVED))}")
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise ConfigError(
                    f"resume({name}=...): a {type(obj).__name__} has no state_dict()/load_state_dict(); "
                    "checkpoints can only hold objects that have both"
                )
        self.objects = dict(objects)
        #: The SDK's own stateful parts (the quarantine, the spike window), under reserved keys;
        #: a checkpoint written before them has none, and they keep what they hold.
        self.own: dict[str, OwnPart] = dict(own or {})
        #: The sharded model and optimizer among the objects (checkpoint.shards), if any.
        self.sharded = shards.shard_names(self.objects) if any(map(shards.is_sharded, objects.values())) else None
        #: The data position: samples all ranks consumed so far (end_step adds each step's).
        self.samples = 0
        self._shard_dicts = shards.ShardDicts(self.objects, self.sharded) if self.sharded else None

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in self.objects.values() if isinstance(o, torch.optim.Optimizer)]

    @property
    def modules(self) -> list[torch.nn.Module]:
        return [o for o in self.objects.values() if isinstance(o, torch.nn.Module)]

    def parameters(self) -> list[torch.Tensor]:
        """What is trained: the optimizers' parameters, else the modules'."""
        params = [p for opt in self.optimizers() for group in opt.param_groups for p in group["params"]]
        if params:
            return params
        return [p for o in self.objects.values() if isinstance(o, torch.nn.Module) for p in o.parameters()]

    def tensors(self) -> list[torch.Tensor]:
        """What a checkpoint holds of the model (`model_tensors`): the trained parameters, and
        every registered module's parameters and floating-point buffers."""
        return model_tensors(self.modules, self.parameters())

    def finite(self) -> bool:
        """May these weights be checkpointed as good? (`all_finite` of `tensors()`: one host sync,
        one all-reduce where there is a process group: every rank takes the same decision.)"""
        return all_finite(self.tensors())

    def capture(
        self, step: int, applied_steps: int, precision: str, scaler: Any, *, in_memory: bool = False
    ) -> dict[str, Any]:
        """The whole checkpoint, or this rank's share of a sharded one (live tensors: the caller
        stages a copy before training goes on). `in_memory`: a rollback target that is never
        written, every object by its own state_dict(); a sharded pair is not asked for DCP's
        state dicts, whose first call steps an optimizer that holds no state yet (lr 0, but its
        step count moves, and with it AdamW's bias correction)."""
        state: dict[str, Any] = {
            "step": step,
            "appliedSteps": applied_steps,
            "precision": precision,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng_state(),
            "samples": self.samples,
        }
        through_dcp = bool(self.sharded) and not in_memory
        in_shards = set(self.sharded.values()) if self.sharded and through_dcp else set()
        for name, obj in {**self.objects, **self.own}.items():
            if name not in in_shards:
                state[name] = obj.state_dict()
        if in_memory:
            state[IN_MEMORY] = True
        if self.sharded and through_dcp:
            state[SHARDED_OBJECTS] = dict(self.sharded)
            assert self._shard_dicts is not None
            state[SHARDS] = self._shard_dicts()
        return state

    def _usable(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` in the current format, what it holds under a module's or an optimizer's name a
        dict (`state_kind_problem`, else CorruptCheckpoint), its optimizer states checked before
        anything loads (`upgrade`, by checkpoint.optimizer_state's rule: CorruptCheckpoint when one disagrees with
        itself, a ConfigError when it does not fit this run's objects), its modules' tensors of their
        dtypes (checkpoint.dtypes: else a ConfigError), with its own fields usable
        (else CorruptCheckpoint)."""
        if (problem := state_kind_problem(state, self.objects)) is not None:
            raise CorruptCheckpoint(f"the checkpoint of step {state.get('step')} {problem}")
        if SHARDS in state and SHARDED_OBJECTS not in state:
            raise CorruptCheckpoint(f"the sharded checkpoint of step {state.get('step')} names no sharded objects")
        if SHARDS in state and (problem := kinds_problem(state[SHARDED_OBJECTS], self.objects)) is not None:
            raise CorruptCheckpoint(f"the sharded checkpoint of step {state.get('step')} {problem}")
        state = upgrade(state, self.objects)
        check_module_dtypes(state, self.objects, f"the checkpoint of step {state.get('step')}")
        for name, module in self.objects.items():  # the script's own code: a ConfigError, whatever the checkpoint
            if isinstance(module, torch.nn.Module):
                check_extra_states(module, name)
        problem = own_fields_problem(state, self.own)
        if problem is not None:
            raise CorruptCheckpoint(f"the checkpoint of step {state.get('step')} {problem}")
        return state

    def told_stop(self) -> Callable[[], None]:
        """What puts back the early stop the loop has told (session.early_stop): a rollback in place loads a
        checkpoint's record of it, written before the loop told it, and the step the data rung closes again
        once caught up (session.skipping) must stay the run's last, checkpointed as such."""
        stop = self.own.get(STOPPED_EARLY)
        told = stop.state_dict() if stop is not None else None

        def put_back() -> None:
            if stop is not None and told is not None:
                stop.load_state_dict(told)

        return put_back

    def restore(self, state: dict[str, Any], precision: str, scaler: Any) -> int:
        """Load a checkpoint into the objects and generators; returns its applied-step count.
        CorruptCheckpoint when its own fields are unusable (`own_fields_problem`): the previous
        good checkpoint is used; a sharded one's on every rank when they are on any, and on every
        rank the error of one that cannot bring it to this format (`upgrade`) before the shards."""
        folder = state.get(SHARDS)
        peers = Peers.current() if isinstance(folder, str) else Peers(0, 1)  # a single file: resume agrees
        state = agreed(lambda: self._usable(state), peers)
        if isinstance(folder, str):  # a sharded checkpoint: its pair is read from the shards
            names: dict[str, str] = state[SHARDED_OBJECTS]
            shards.restore_shards(Path(folder), self.objects, names, state.get(LISTED))
            state = {**state, **{name: None for name in names.values()}}
        elif self.sharded and not state.get(IN_MEMORY):
            raise ConfigError(
                f"the checkpoint of step {state.get('step')} is a single-file checkpoint and this run's model is "
                "sharded: resume it with parallelism.strategy ddp, or start the sharded run in a new checkpoint folder"
            )
        missing = [name for name in self.objects if name not in state]
        if missing:
            held = sorted(set(state) - RESERVED)
            raise ConfigError(
                f"the checkpoint of step {state.get('step')} holds no state for {', '.join(missing)} "
                f"(it holds {', '.join(held) or 'nothing else'}): resume() must name what the run that wrote it named"
            )
        loaded = {
            name: obj for name, obj in self.objects.items() if not (state[name] is None and isinstance(folder, str))
        }
        load_all(loaded, state)  # all or nothing (those read from the shards above are not in `loaded`)
        if scaler is not None and state.get("scaler") and state.get("precision") == precision == "fp16":
            scaler.load_state_dict(state["scaler"])  # fp16 -> fp16 keeps its calibrated scale
        elif scaler is not None and (fresh := fresh_scaler_state(scaler)) is not None:
            scaler.load_state_dict(fresh)  # as a restarted attempt's: a rollback in place drops what came after
        for name, obj in self.own.items():
            if name in state:
                obj.load_state_dict(state[name])
        set_rng_state(state["rng"])
        self.samples = int(state.get("samples") or 0)
        return int(state.get("appliedSteps", state["step"]))
