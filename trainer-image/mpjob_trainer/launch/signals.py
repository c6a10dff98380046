"""The launcher's signal inbox, installed before anything else the launcher does.

SIGTERM, SIGINT and SIGCHLD land in a pipe (signal.set_wakeup_fd): the handlers only note
the signal, the supervisor's select() loop acts on it. `main` installs them first, before
it parses its flags or imports anything heavy: in a container the launcher is PID 1, and
PID 1 ignores a signal it has no handler for, so a SIGTERM that arrived before the handler
would be lost and the pod would wait out its whole grace period for the SIGKILL. They are
also unblocked: a signal mask is inherited across exec, and a parent that started the launcher
with them blocked would leave it (and every rank it starts) deaf to the stop. One that arrived
while blocked waits, pending, and is handled as soon as they are unblocked, ahead of the ranks.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from collections.abc import Iterator
from types import FrameType

#: Signals passed on to every running rank, as received.
FORWARDED = (signal.SIGTERM, signal.SIGINT)


def say(message: str) -> None:
    """The launcher's own lines go to stderr: stdout carries the trainer's JSON events."""
    print(f"mpjob-launch: {message}", file=sys.stderr, flush=True)


class Inbox:
    """The read end of the signal pipe: one byte per signal, its number."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd


@contextlib.contextmanager
def signal_inbox() -> Iterator[Inbox]:
    """A pipe that receives one byte per signal (its number) for FORWARDED and SIGCHLD."""
    receive, send = os.pipe()  # a pipe, not a socketpair: `socket` is a large import
    os.set_blocking(receive, False)
    os.set_blocking(send, False)
    watched = (*FORWARDED, signal.SIGCHLD)
    previous = {sig: signal.getsignal(sig) for sig in watched}

    def noted(signum: int, frame: FrameType | None) -> None:
        """The byte in the socket is the news; the loop acts on it."""

    old_fd = signal.set_wakeup_fd(send, warn_on_full_buffer=False)
    old_mask: set[int | signal.Signals] | None = None
    try:
        for sig in watched:
            signal.signal(sig, noted)
        old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)  # a pending one lands now
        yield Inbox(receive)
    finally:
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        os.close(receive)
        os.close(send)


def received(inbox: Inbox, extra: list[int], timeout: float | None) -> tuple[list[int], list[int]]:
    """Sleep until a signal arrives, one of the `extra` descriptors is readable, or `timeout`
    passes; the signals that arrived and the descriptors that are readable."""
    ready, _, _ = select.select([inbox.fd, *extra], [], [], timeout)
    signals = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(inbox.fd, 4096):
            signals += chunk
    return list(signals), [fd for fd in ready if fd != inbox.fd]


def stop_received(inbox: Inbox) -> signal.Signals | None:
    """A stop signal already in the inbox (checked before the ranks start), if any."""
    signals, _ = received(inbox, [], 0)
    return next((signal.Signals(s) for s in signals if s in FORWARDED), None)
