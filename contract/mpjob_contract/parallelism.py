"""spec.parallelism: how an attempt's processes share the model (DDP replicas or FSDP2 shards).

How many processes there are stays where it was (spec.workers x resources.processesPerWorker,
`mpjob_contract.api.world_size`); this block says only what each process holds:

- `ddp` (the default, as before this block existed): every process keeps a full replica of the
  model, gradients and optimizer state; gradients are all-reduced.
- `fsdp`: PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`), applied per block (the SDK's
  `run.wrap(model, blocks=...)`) and at the root. Parameters, gradients and optimizer state are
  sharded across all processes (fp32 masters), a block's parameters are all-gathered for its
  forward and backward only, and gradients are reduce-scattered. A world of one is legal.

The FSDP2 settings carry torchtitan's names (`reshard_after_forward`, `mixed_precision_param`,
`mixed_precision_reduce` of its job config), in this API's camelCase.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Strategy = Literal["ddp", "fsdp"]
ActivationCheckpointing = Literal["none", "full", "selective"]
#: The dtype FSDP2 all-gathers parameters in: the attempt's compute precision (fp16/bf16; fp32
#: in fp32 attempts) or always fp32 (autocast then casts per op).
ParamDtype = Literal["attempt", "fp32"]
#: The dtype gradients are reduce-scattered in.
ReduceDtype = Literal["fp32", "attempt"]


class _Model(BaseModel):
    # The same wire conventions as mpjob_contract.wire.ApiModel (mpjob_contract.spec imports this module).
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True)


class Fsdp(_Model):
    """FSDP2 settings (used when strategy is fsdp)."""

    reshard_after_forward: bool = Field(
        True,
        description="Free each block's gathered parameters after its forward and gather them again for the "
        "backward (FSDP2's reshard_after_forward): the least memory for one more all-gather per block. The root "
        "module is never resharded after forward (its parameters are needed at once by the backward).",
    )
    mixed_precision_param: ParamDtype = Field(
        "attempt",
        description="Dtype parameters are all-gathered and computed in (MixedPrecisionPolicy.param_dtype): "
        "attempt = the attempt's precision (fp16/bf16: half the gather traffic and unsharded memory; fp32 "
        "attempts gather fp32), fp32 = always fp32, autocast casting per op. The gather dtype is fixed when "
        "the model is wrapped, so with `attempt` a low-precision attempt cannot recompute in fp32: its fp32 "
        "replay (guard.replaySteps) is skipped and the quality gate's reference uses the same gathered "
        "weights. Sharded master weights and optimizer state are fp32 either way.",
    )
    mixed_precision_reduce: ReduceDtype = Field(
        "fp32",
        description="Dtype gradients are reduce-scattered in (MixedPrecisionPolicy.reduce_dtype): fp32, or "
        "the attempt's precision (half the traffic, less exact sums).",
    )


class Parallelism(_Model):
    """How an attempt's processes share the model; see docs/sdk.md (Sharded models)."""

    strategy: Strategy = Field(
        "ddp",
        description="ddp: a full replica per process, gradients all-reduced. fsdp: parameters, gradients and "
        "optimizer state sharded across every process of the attempt (FSDP2 fully_shard per block and at the root).",
    )
    fsdp: Fsdp = Field(default_factory=Fsdp)
    activation_checkpointing: ActivationCheckpointing = Field(
        "none",
        description="Recompute blocks' activations in the backward instead of keeping them (per block, the blocks "
        "named to run.wrap): none; full = every block; selective = every selectiveEvery-th block (1st, "
        "(1+N)th, ...), trading part of the memory saving for less recompute.",
    )
    selective_every: int = Field(
        2, ge=2, le=64, description="selective activation checkpointing: checkpoint one block in this many."
    )
