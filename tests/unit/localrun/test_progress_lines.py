"""What `mpjob run`'s plain and rich views say of a change of precision: where the next attempt
resumes, named as a checkpoint's step (it said 'fp16 -> bf16 at step 100' of a fault seen at step
130: the step was the checkpoint resumed from, not where it fell back)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from mpjob.localrun.progress import PlainView, RichView

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("step", "reason", "said"),
    [
        (100, "NumericFault", "precision fallback: fp16 -> bf16 (NumericFault), resuming from checkpoint step 100"),
        (0, "NumericFault", "precision fallback: fp16 -> bf16 (NumericFault), starting over: no checkpoint"),
        (100, "Repromote", "precision re-promotion: fp16 -> bf16 (Repromote), resuming from checkpoint step 100"),
    ],
)
def test_a_change_of_precision_says_the_checkpoint_the_next_attempt_resumes_from(
    step: int, reason: str, said: str
) -> None:
    plain = io.StringIO()
    PlainView(300, plain).fallback("fp16", "bf16", step, reason)
    assert plain.getvalue() == said + "\n"
    shown = io.StringIO()
    view = RichView(300, Console(file=shown, width=200, color_system=None))
    view.fallback("fp16", "bf16", step, reason)
    view.close()
    assert said in shown.getvalue()
