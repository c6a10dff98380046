"""How an attempt's processes share the model (spec.parallelism): DDP replicas or FSDP2 shards.

`wrap` is what `run.wrap(model, blocks=...)` does:
- activation checkpointing per block (spec.parallelism.activationCheckpointing): `full` every
  block, `selective` every selectiveEvery-th (blocks 0, N, 2N, ...). The block's forward is
  replaced on the instance by one run through `torch.utils.checkpoint.checkpoint` (non-reentrant),
  so the module's class and state_dict keys stay as they were (a checkpoint written with one
  setting loads under another, which torch's checkpoint_wrapper's key prefix would prevent);
- `ddp`: DistributedDataParallel when the attempt has several processes (as before);
- `fsdp`: FSDP2's `fully_shard` bottom-up: every module of a keepFp32 type with its own fp32
  policy (gathered and run in fp32; LayerNorm gains are not rounded to bf16), then each block,
  then the root. The MixedPrecisionPolicy comes from the attempt's precision (`policy`): gather
  and compute in fp16/bf16, reduce-scatter in fp32, fp32 sharded masters; fp32 attempts cast
  nothing. A world of one is legal (a process group of one is made for it).

The rest of a step needs nothing FSDP-specific, by design:
- GradScaler (fp16): `unscale_` runs `_amp_foreach_non_finite_check_and_unscale_` on the
  sharded DTensor gradients, and DTensor dispatches that op to a handler that all-reduces
  (max) found_inf over the mesh. So every rank skips the same overflowing step, with no
  collective of ours (tests/unit/trainer/test_sharding.py proves it on gloo; FSDP1's
  ShardedGradScaler is not needed).
- clipping (`clip_gradients`): the norm of DTensor gradients is a Partial DTensor; it is made
  whole with one all-reduce (no host sync: it stays a device tensor), and that global norm
  clips and is what the guard reads at its intervals, as under DDP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from mpjob_contract.api import Guard as GuardSpec
from mpjob_contract.api import MixedPrecisionJobSpec, Precision
from mpjob_contract.parallelism import Parallelism
from mpjob_trainer.distributed import World, is_dtensor
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.events import EventLog
from mpjob_trainer.precision import DTYPES

#: The model's repeated blocks, as run.wrap takes them.
Blocks = Sequence[nn.Module] | None


def policy(precision: Precision, parallelism: Parallelism) -> Any:
    """The MixedPrecisionPolicy of an attempt in `precision` (fp32 attempts: none, no cast)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    low = DTYPES[precision]
    if low == torch.float32:
        return MixedPrecisionPolicy()
    settings = parallelism.fsdp
    param = low if settings.mixed_precision_param == "attempt" else torch.float32
    reduce = low if settings.mixed_precision_reduce == "attempt" else torch.float32
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


def fp32_policy() -> Any:
    """keepFp32 modules' policy: gathered, run and reduced in fp32, inputs cast to fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)


def fixes_low_compute(precision: Precision | None, parallelism: Parallelism) -> bool:
    """Does a model wrapped for `precision` (None: not wrapped) gather its weights in a low
    precision for good? Then no mode can recompute it in fp32 (the fp32 replay is skipped; see
    contract parallelism.Fsdp). `auto` attempts are wrapped for fp32 until they settle; fp8 ones
    gather in bf16, the dtype its autocast runs the rest of the model in (`policy`)."""
    fsdp, low = parallelism.strategy == "fsdp", precision is not None and DTYPES[precision] != torch.float32
    return fsdp and low and parallelism.fsdp.mixed_precision_param == "attempt"


def replayable(guard: GuardSpec, precision: Precision | None, parallelism: Parallelism, log: EventLog) -> GuardSpec:
    """The guard settings the fp32 replay runs under: off when the sharded model gathers its
    weights in a low precision for good (a "fp32" replay would compute in fp16 and blame the
    data for the precision's overflow); the precision is then blamed, as with replays off."""
    if not fixes_low_compute(precision, parallelism) or guard.replay_steps == 0:
        return guard
    log("replaySkipped", why="fsdp gathers weights in the attempt's precision (parallelism.fsdp.mixedPrecisionParam)")
    return guard.model_copy(update={"replay_steps": 0})


class CheckpointedForward:
    """A block's `forward` recomputed in the backward instead of keeping its activations."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)


def checkpointed_blocks(blocks: Sequence[nn.Module], parallelism: Parallelism) -> list[int]:
    """Recompute the chosen blocks' activations in the backward; returns their indexes."""
    mode = parallelism.activation_checkpointing
    if mode == "none":
        return []
    every = 1 if mode == "full" else parallelism.selective_every
    chosen = [i for i in range(len(blocks)) if i % every == 0]
    for i in chosen:
        block = blocks[i]
        if not isinstance(vars(block).get("forward"), CheckpointedForward):
            block.forward = CheckpointedForward(block.forward)  # type: ignore[method-assign]
    return chosen


def ensure_process_group(world: World, device: torch.device) -> None:
    """FSDP2 needs a process group even for a world of one: make that one in memory."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)


def shard(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    *,
    precision: Precision,
    parallelism: Parallelism,
    keep_fp32: Iterable[str],
) -> list[str]:
    """fully_shard keepFp32 modules (fp32), then each block, then the root; returns the
    names of the modules sharded on their own, root last ("")."""
    from torch.distributed.fsdp import fully_shard

    mp, reshard = policy(precision, parallelism), parallelism.fsdp.reshard_after_forward
    kept, low = set(keep_fp32), precision != "fp32"
    names = {id(m): name for name, m in model.named_modules()}
    missing = [i for i, block in enumerate(blocks) if id(block) not in names]
    if missing:
        raise ConfigError(f"run.wrap(blocks=...): blocks {missing} are not submodules of the model")
    sharded: list[str] = []
    if low:  # fp32 attempts run everything in fp32 already
        for name, module in model.named_modules():
            if name and type(module).__name__ in kept and any(True for _ in module.parameters(recurse=False)):
                fully_shard(module, mp_policy=fp32_policy(), reshard_after_forward=reshard)
                sharded.append(name)
    for block in blocks:
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
        sharded.append(names[id(block)])
    # The root's parameters are needed at once by the backward: never resharded after forward.
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    sharded.append("")
    return sharded


def wrap(
    model: nn.Module,
    blocks: Sequence[nn.Module] | None,
    *,
    world: World,
    device: torch.device,
    precision: Precision,
    parallelism: Parallelism,
    keep_fp32: Iterable[str],
) -> tuple[nn.Module, dict[str, Any]]:
    """The model as the attempt trains it, and what was done (for the `wrap` event)."""
    blocks = list(blocks or [])
    checkpointed = checkpointed_blocks(blocks, parallelism)
    done: dict[str, Any] = {"strategy": parallelism.strategy, "checkpointedBlocks": checkpointed}
    if parallelism.strategy == "fsdp":
        ensure_process_group(world, device)
        done["sharded"] = shard(model, blocks, precision=precision, parallelism=parallelism, keep_fp32=keep_fp32)
        return model, done
    if not world.distributed:
        return model, done
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids), done


class Wrapper:
    """`run.wrap` for one attempt, and what wrapping decided for the rest of it (the fp32 replay)."""

    def __init__(
        self, world: World, device: torch.device, *, spec: MixedPrecisionJobSpec, requested: str, log: EventLog
    ) -> None:
        self.world, self.device, self.spec, self.requested, self.log = world, device, spec, requested, log
        #: The precision the model was wrapped for (None: not wrapped).
        self.wrapped_for: Precision | None = None

    def wrap(self, model: nn.Module, blocks: Blocks, *, precision: Precision) -> nn.Module:
        """Wrap for `precision`; an `auto` attempt settles its precision later (register_step), so
        it gathers in fp32 meanwhile."""
        self.wrapped_for = "fp32" if self.requested == "auto" else precision
        net, done = wrap(
            model,
            blocks,
            world=self.world,
            device=self.device,
            precision=self.wrapped_for,
            parallelism=self.spec.parallelism,
            keep_fp32=self.spec.precision.keep_fp32,
        )
        self.log("wrap", **done)
        return net

    def replayable(self, guard: GuardSpec) -> GuardSpec:
        """The guard settings the fp32 replay runs under (see `replayable`)."""
        return replayable(guard, self.wrapped_for, self.spec.parallelism, self.log)


def clip_gradients(params: Iterable[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Clip the gradients' global 2-norm to `max_norm` (None/0: measure only, the gradients left
    as they are); returns that norm as a plain device tensor. Sharded gradients' norm is made
    whole with one all-reduce. Measuring does not scale by max_norm/norm: that would be a pass
    over every gradient for nothing, and an inf gradient (a bf16 or fp32 step, which no
    GradScaler skips) would make the factor inf/inf = NaN and every other gradient NaN with it."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if is_dtensor(total):
        total = total.full_tensor()
    if max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def accumulating(net: nn.Module, *, last: bool) -> contextlib.AbstractContextManager[Any]:
    """A micro-batch's context: DDP all-reduces on the last one only (no_sync before it);
    FSDP2 reduce-scatters every micro-batch into its sharded gradients (memory stays sharded)."""
    if last or not isinstance(net, DistributedDataParallel):
        return contextlib.nullcontext()
    return net.no_sync()
