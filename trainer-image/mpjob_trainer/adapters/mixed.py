"""The mixed precision a framework runs for an attempt: one rule for every adapter.

A framework (Hugging Face Trainer, Lightning) knows fp16, bf16 and fp32 mixed precision, not
fp8. An fp8 attempt is bf16 to the framework: `run.keep_fp32(model)` has already converted the
eligible linears to torchao's float8 ones, which compute in fp8 whatever autocast says, and
everything else (the linears kept, attention, activations) runs under bf16 autocast, as in the
builtin loop (mpjob_trainer.precision.DTYPES).
"""

from __future__ import annotations

from typing import Literal

from mpjob_contract.api import Precision

FrameworkPrecision = Literal["fp16", "bf16", "fp32"]

#: Attempt precision -> the framework's mixed precision.
FRAMEWORK_PRECISION: dict[Precision, FrameworkPrecision] = {
    "fp8": "bf16",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp32": "fp32",
}


def framework_precision(precision: Precision) -> FrameworkPrecision:
    """The framework's mixed precision for an attempt in `precision`."""
    return FRAMEWORK_PRECISION[precision]
