"""The handler of `mpjob run`'s Ctrl-C and SIGTERM runs in the main thread between two of its
bytecodes, wherever it stood: holding the lock of the wait between attempts, or inside a write to
the stream the run's lines go to. It neither hangs nor crashes the run there, and its line is still
shown at once while the runner waits on a silent trainer."""

from __future__ import annotations

import io
import os
import select
import signal
import sys
import threading
from types import FrameType
from typing import Any

import pytest

from mpjob.localrun import stops
from mpjob.localrun.progress import PlainView
from mpjob.localrun.stops import CtrlC, Stop
from tests.unit.localrun.scripted_run import Shown, Signalled

pytestmark = pytest.mark.unit


def test_a_press_at_any_line_of_the_wait_between_attempts_ends_the_wait() -> None:
    """The handler set the wait's threading.Event, whose lock the wait itself holds for a few
    bytecodes: a press landing there hung the run for good (only SIGKILL ended it). Here the
    handler runs at every line the wait executes, its own and threading's."""
    view = Shown()
    ctrl_c = CtrlC(view)  # type: ignore[arg-type]
    ended = threading.Event()
    with ctrl_c.caught():
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler)

        def pressing(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                handler(signal.SIGINT, frame)
            return pressing

        def waiting() -> None:
            sys.settrace(pressing)
            try:
                ctrl_c.pause(600)
            finally:
                sys.settrace(None)
            ended.set()

        threading.Thread(target=waiting, daemon=True).start()
        assert ended.wait(30), "the wait hung: the handler waited for a lock the wait held"
    assert ctrl_c.stop is Stop.KILLED and view.lines[0] == stops.BETWEEN_LINE


class Terminal(io.RawIOBase):
    """The terminal behind the view's stream: keeps what is written. The user presses Ctrl-C
    during the first write, so the press's handler runs inside it."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.pressed = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if not self.pressed:
            self.pressed = True
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs before the next line, in this write
        self.written += bytes(data)
        return len(data)


def test_a_press_inside_a_write_to_the_views_stream_is_shown_after_that_line() -> None:
    """The handler printed its line itself: landing in the runner's own write to the same stream,
    it raised "RuntimeError: reentrant call inside <_io.BufferedWriter>" there, ending the run
    mid-attempt, its trainers unstopped."""
    terminal, workers = Terminal(), Signalled()
    view = PlainView(300, io.TextIOWrapper(io.BufferedWriter(terminal), encoding="utf-8"))
    ctrl_c = CtrlC(view)
    with ctrl_c.caught(workers):  # type: ignore[arg-type]
        view.info("step 10/300 bf16 a0")
        assert terminal.pressed and (ctrl_c.stop, workers.sent) == (Stop.ASKED, [signal.SIGTERM])
    assert terminal.written.decode().splitlines() == ["step 10/300 bf16 a0", stops.ASKED_LINE]


class Told(Shown):
    """A view whose every line also writes a byte to a pipe (`told`)."""

    def __init__(self) -> None:
        super().__init__()
        self.told, self._tell = os.pipe()

    def info(self, text: str, **fields: Any) -> None:
        super().info(text)
        os.write(self._tell, b"\n")


def test_a_press_is_shown_while_the_runner_waits_on_a_silent_trainer() -> None:
    """The line is not left for the main thread's next point: blocked reading worker 0's silent
    output, it has none for minutes."""
    view, workers = Told(), Signalled()
    ctrl_c = CtrlC(view)  # type: ignore[arg-type]
    with ctrl_c.caught():  # the runner's, around the attempt's
        with ctrl_c.caught(workers):  # type: ignore[arg-type]
            os.kill(os.getpid(), signal.SIGINT)
            ready, _, _ = select.select([view.told], [], [], 60)  # the runner, blocked as in readline
            assert ready == [view.told] and view.lines == [stops.ASKED_LINE]
            os.kill(os.getpid(), signal.SIGINT)
        # The attempt's block has shown its second press: the attempt's ending is said after it.
        assert view.lines == [stops.ASKED_LINE, "second Ctrl-C: killing the trainers; no checkpoint is written now"]
