"""A trainer's exposition costs the operator time in proportion to its size, never more: the
text parser's time grows with the square of a line's length, so a line longer than any the
trainer writes is dropped before it is parsed, and the lines around it are still read."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from mpjob.controller import exposition
from mpjob.controller.exposition import MAX_LINE, parse
from mpjob_contract import metrics as tm
from mpjob_contract.report import MAX_CHANGE_MESSAGE_CHARS

pytestmark = pytest.mark.unit

#: One line of 100,000 labels (~1 MiB, the default read cap): tens of seconds in the parser.
MANY_LABELS = f"{tm.STEP}{{" + ",".join(f'l{i}="x"' for i in range(100_000)) + "} 7\n"
#: One label value of escaped quotes, as long.
ESCAPES = f'{tm.STEP}{{job="' + '\\"' * 500_000 + '"} 7\n'


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts handed to the parser."""
    seen: list[str] = []
    real = exposition.text_string_to_metric_families

    def spy(text: str) -> Any:
        seen.append(text)
        return real(text)

    monkeypatch.setattr(exposition, "text_string_to_metric_families", spy)
    return seen


@pytest.mark.parametrize("hostile", [MANY_LABELS, ESCAPES], ids=["many-labels", "escaped-quotes"])
def test_a_line_longer_than_the_trainer_writes_is_never_parsed(parsed: list[str], hostile: str) -> None:
    found = parse(f"{tm.LOSS} 2.5\n{hostile}{tm.START_STEP} 3\n")
    assert found.values == {tm.LOSS: 2.5, tm.START_STEP: 3.0}
    assert max(len(line) for text in parsed for line in text.split("\n")) <= MAX_LINE


def test_the_trainers_longest_line_is_still_read() -> None:
    """A precision change whose message is all characters the exposition escapes, of a job
    and namespace at the longest names Kubernetes allows."""
    registry = CollectorRegistry()
    labels = ("job", "namespace", "attempt", "precision", *tm.PRECISION_CHANGE_LABELS)
    gauge = Gauge(tm.PRECISION_CHANGE, "in place", labels, registry=registry)
    values = {
        "job": "j" * 253,
        "namespace": "n" * 63,
        "attempt": "1",
        "precision": "bf16",
        "kind": "fallback",
        "step": "120",
        "start_step": "100",
        "from_precision": "fp16",
        "to_precision": "bf16",
        "rule": "MaxNonFiniteLosses",
        "message": '"\\\n' * (MAX_CHANGE_MESSAGE_CHARS // 3),
        "at": "1790000000.25",
    }
    gauge.labels(**values).set(0.25)
    text = generate_latest(registry).decode()
    assert max(len(line) for line in text.split("\n")) <= MAX_LINE // 2
    assert set(parse(text).changes) == {1}
