"""The failures a tracker tells after its close, when two threads tell at once: the close's
(the training thread's) and another's (the tracking thread's late failure; here a line handed to
the tracker, which tells what is left the same way). The interleaving is made, not hoped for:
the close's first take from `untold` lets the other thread tell first, and waits for it."""

from __future__ import annotations

import collections
import io
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from tests.unit.trainer.test_tracking_in_place import step, told, tracker_for

pytestmark = pytest.mark.unit

#: How long the first take waits for the other thread's: it never comes where the takes are one
#: at a time (the other thread waits for the first to be done), and it comes at once where not.
OTHER_TAKE_SECONDS = 1.0


class TakenBetween(collections.deque[str]):
    """Failures to tell whose first take lets `other` run in a thread of its own and waits
    (bounded) for that thread to take one, between the check that one is there and the take."""

    def __init__(self, items: Iterable[str], other: Callable[[], None]) -> None:
        super().__init__(items)
        self.other = threading.Thread(target=other, name="late-teller")
        self.other_took = threading.Event()

    def popleft(self) -> str:
        if self.other.ident is None:  # the first take
            self.other.start()
            self.other_took.wait(timeout=OTHER_TAKE_SECONDS)
            return super().popleft()
        taken = super().popleft()
        self.other_took.set()
        return taken


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def test_two_threads_telling_at_the_close_tell_each_failure_once_in_order(uri: str) -> None:
    """Before, both threads found a failure left, the other thread took it, and the close's take
    raised IndexError out of `close` (the lines, had it not, could come out of order)."""
    lines = io.StringIO()
    tracker = tracker_for(uri, lines)
    untold = TakenBetween(["OSError: first", "OSError: second"], lambda: step(tracker, 50, "fp16"))
    tracker.untold = untold
    tracker.close(0)
    untold.other.join(timeout=30)
    assert not untold.other.is_alive()
    assert told(lines) == ["OSError: first", "OSError: second"]
    assert not tracker.untold
