"""fp8 training's part of the API: `precision.fp8` and the rules of the fp8 rung.

fp8 is the top rung of the precision ladder (fp8 -> bf16 -> fp32): torchao's float8 linears
(dynamic scaling, the high-precision weights kept, so checkpoints stay plain tensors) with the
rest of the model under bf16 autocast. It needs fp8 tensor cores, compute capability >= 8.9
(Ada, Hopper and later); anywhere else an fp8 attempt is a configuration error, unless
`emulate` (torchao computes the fp8 casts in high precision: for tests and CPUs, never fast).

No heavy imports: the operator, `mpjob validate` and the trainer all read this module.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from mpjob_contract import formats

#: The lowest compute capability with fp8 tensor cores (Ada Lovelace sm_89, Hopper sm_90).
FP8_MIN_CAPABILITY = (8, 9)
#: torchao's float8 recipes (Float8LinearConfig.from_recipe_name): one scale per tensor; one per
#: row (more robust to outliers, slower); per row with the weight gradient kept in bf16.
Fp8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]
#: fp8 kernels (torch._scaled_mm) take only matrices whose dimensions are multiples of 16.
FP8_DIM_MULTIPLE = 16


class Fp8Spec(BaseModel):
    """How an fp8 attempt converts the model (precision.fp8)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True)

    recipe: Fp8Recipe = Field(
        "tensorwise",
        description="torchao float8 recipe: tensorwise (fastest), rowwise (one scale per row: robust to "
        "outliers), rowwise_with_gw_hp (rowwise, weight gradients in bf16).",
    )
    skip: list[Annotated[str, Field(min_length=1, max_length=253, pattern=formats.FP8_SKIP.pattern)]] = Field(
        default_factory=list,
        max_length=256,
        description="Linear modules kept in bf16, by dotted name or fnmatch pattern (`layers.0.*`), besides the "
        "default rules: the first and the last linear of the model and any linear whose dimensions are not "
        f"multiples of {FP8_DIM_MULTIPLE} always stay in bf16.",
    )
    emulate: bool = Field(
        False,
        description="Emulate the fp8 casts in high precision (torchao's emulate): for tests and CPUs, not for "
        "speed. Without it an fp8 attempt needs compute capability >= 8.9 and is a configuration error elsewhere.",
    )


def fp8_capable(capability: tuple[int, int] | None) -> bool:
    """Whether a device of this compute capability (None: a CPU) has fp8 tensor cores."""
    return capability is not None and capability >= FP8_MIN_CAPABILITY
