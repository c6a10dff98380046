"""The status's measured figures as people read them: `kubectl get mpj` shows LOSS 4.1715, not
4.171467304229736. A float32 loss carries about 7 significant digits and a throughput reading
far fewer that mean anything, so the status keeps SIGNIFICANT_DIGITS of each; a power of two (a
GradScaler loss scale: 65536, 131072) stays exact, since rounding it would show a scale that
never was.

One rule for every path that writes a reading into a status: the operator's live progress
(`controller/progress.py`), the termination report (`lifecycle.record_report`) and `mpjob run`'s
report.json.
"""

from __future__ import annotations

import math
from typing import Any

from mpjob_contract.api import MixedPrecisionJobStatus

SIGNIFICANT_DIGITS = 5
#: The status fields that hold measured figures (model names; their camelCase aliases in patches).
FIGURES = ("loss", "loss_scale", "samples_per_second", "eval_loss", "eval_loss_delta")
_ALIASES = {MixedPrecisionJobStatus.model_fields[name].alias or name: name for name in FIGURES}


def round_sig(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """`value` to `digits` significant digits (0, inf and NaN as they are)."""
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


def figure(value: float) -> float:
    """A reading as the status keeps it: a power of two exactly, anything else to
    SIGNIFICANT_DIGITS."""
    mantissa, _ = math.frexp(value)
    return value if abs(mantissa) == 0.5 else round_sig(value)


def round_figures(status: MixedPrecisionJobStatus) -> None:
    """The status's figures kept as `figure` says (in place)."""
    for name in FIGURES:
        value = getattr(status, name)
        if value is not None:
            setattr(status, name, figure(value))


def rounded(fields: dict[str, Any]) -> dict[str, Any]:
    """Status fields by their camelCase names (a status patch), the figures among them rounded."""
    return {k: figure(v) if k in _ALIASES and _number(v) else v for k, v in fields.items()}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
