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


@pytest.mark.parametrize(
    ("start", "resumed", "said"),
    [
        (0, None, "attempt 0: fp16, start step 0"),
        (40, None, "attempt 0: fp16, start step 40"),
        (40, "step 40 in place", "attempt 0: fp16, start step 40, resuming from step 40 in place"),
    ],
)
def test_an_attempt_start_says_its_start_step_on_a_terminal_as_in_plain_lines(
    start: int, resumed: str | None, said: str
) -> None:
    """On a terminal a fresh run's first line said 'from the newest valid checkpoint, if any', where
    the plain lines say the step the attempt starts from."""
    plain = io.StringIO()
    PlainView(300, plain).attempt_started(0, "fp16", start, resumed)
    assert plain.getvalue() == said + "\n"
    shown = io.StringIO()
    view = RichView(300, Console(file=shown, width=200, color_system=None))
    view.attempt_started(0, "fp16", start, resumed)
    view.close()
    assert said + "\n" in shown.getvalue()


#: What a trainer's message may quote: torch.distributed's stderr prefix, the launcher's own
#: bracketed ending, a script's exception naming a path in brackets.
QUOTED = (
    "local rank 0 (rank 0) exited 1 without a termination report; its stderr ended: | "
    "[rank0]: FileNotFoundError: no shards in [/data/train] [rank 0 exited 1, rank 1 exited 1]"
)


def test_a_terminal_shows_a_trainers_message_as_written_not_as_markup() -> None:
    """On a terminal an ended attempt's message and the summary were read as rich markup: the
    bracketed parts that look like tags (`[rank0]:`, the ranks' exit codes) were left out, and a
    path in brackets (`[/data/train]`, a closing tag) ended `mpjob run` with a MarkupError."""
    shown = io.StringIO()
    view = RichView(300, Console(file=shown, width=1000, color_system=None))
    view.attempt_started(1, "bf16", 40, "runs/[exp]/checkpoints/step-000000040")
    view.attempt_ended(0, "fp16", "InfraError", QUOTED)
    view.info(f"job: Failed\n  attempt 0: fp16 steps 0-0 InfraError ({QUOTED})")
    view.close()
    text = shown.getvalue()
    assert "attempt 1: bf16, start step 40, resuming from runs/[exp]/checkpoints/step-000000040\n" in text
    assert f"attempt 0 (fp16) ended: InfraError: {QUOTED}\n" in text
    assert f"  attempt 0: fp16 steps 0-0 InfraError ({QUOTED})\n" in text
