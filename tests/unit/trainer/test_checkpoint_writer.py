"""BackgroundWriter: one write at a time on one long-lived thread; outcomes reported when collected."""

from __future__ import annotations

import threading

import pytest

from mpjob_trainer.checkpoint.writer import BackgroundWriter, WriteFailed

pytestmark = pytest.mark.unit


def test_writes_run_off_the_caller_on_one_thread_that_outlives_them() -> None:
    writer: BackgroundWriter[tuple[int, int]] = BackgroundWriter()
    ran_on = []
    for step in (10, 20, 30):
        writer.submit(step, lambda step=step: (step, threading.get_ident()))
        result = writer.wait()
        assert result is not None and result[0] == step
        ran_on.append(result[1])
    assert len(set(ran_on)) == 1 and ran_on[0] != threading.get_ident()


def test_poll_does_not_block_while_the_write_runs_and_reports_it_once() -> None:
    writer: BackgroundWriter[int] = BackgroundWriter()
    release = threading.Event()
    writer.submit(5, lambda: 5 if release.wait(timeout=30) else -1)
    assert writer.poll() is None  # still writing
    release.set()
    assert writer.wait() == 5
    assert writer.poll() is None and writer.wait() is None  # collected once


def test_a_failed_write_is_raised_by_the_collecting_call_with_its_step() -> None:
    writer: BackgroundWriter[int] = BackgroundWriter()

    def fail() -> int:
        raise OSError("disk full")

    writer.submit(7, fail)
    with pytest.raises(WriteFailed, match="step 7 was not written: OSError: disk full") as raised:
        writer.wait()
    assert raised.value.step == 7
    writer.submit(8, lambda: 8)  # the thread survives a failed write
    assert writer.wait() == 8


def test_a_second_submit_before_collecting_is_a_bug() -> None:
    writer: BackgroundWriter[int] = BackgroundWriter()
    writer.submit(1, lambda: 1)
    with pytest.raises(AssertionError):
        writer.submit(2, lambda: 2)
    assert writer.wait() == 1
