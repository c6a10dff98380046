"""What a killed `mpjob run` left of its attempt: the event lines among worker 0's log lines."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mpjob.localrun import leftover
from mpjob_contract import events

pytestmark = pytest.mark.unit


def test_the_event_lines_tell_the_last_step_and_when_it_was_last_heard_of(tmp_path: Path) -> None:
    lines = [
        "mpjob-launch: rank 0 (local 0, world 1) started: pid 1\n",
        events.format_line(
            "resume", {"time": 1000.0, "step": 20, "path": "/c/step-20", "sha256": "ab", "fromPrecision": "bf16"}
        )
        + "\n",
        events.format_line("step", {"time": 1004.0, "step": 25, "loss": 3.5}) + "\n",
        "Traceback (most recent call last): a line of stderr\n",
        events.format_line("step", {"time": 1009.5, "step": 30, "loss": 3.25}) + "\n",
        '{"event": "step", "step": 3',  # cut short by the kill
    ]
    (tmp_path / leftover.EVENT_LOG).write_text("".join(lines))
    logged = leftover.logged_events(tmp_path)
    assert [type(e).__name__ for e in logged] == ["Resume", "Step", "Step"]
    assert leftover.reached_step(logged) == 30 and leftover.reached_step(logged[:1]) is None
    assert leftover.seconds_seen("1970-01-01T00:16:30Z", logged) == 19.5  # started at 990 s
    assert leftover.seconds_seen(None, logged) == 0.0 and leftover.logged_events(tmp_path / "none") == []


def committed(folder: Path, step: int, manifest: str | None = None) -> None:
    (folder / f"step-{step:09d}").mkdir(parents=True)
    doc = manifest or (
        f'{{"step": {step}, "precision": "bf16", "files": {{"state.pt": {{"sha256": "{step:064x}", "bytes": 9}}}}}}'
    )
    (folder / f"step-{step:09d}" / "manifest.json").write_text(doc)


def test_a_checkpoint_committed_after_the_last_logged_one_stands_in_for_its_lost_line(tmp_path: Path) -> None:
    committed(tmp_path, 10)
    committed(tmp_path, 20)
    (tmp_path / "step-000000030").mkdir()  # being written when the kill came: no manifest yet
    found = leftover.committed_after(tmp_path, 10)
    assert found is not None and (found.step, found.sha256) == (20, f"{20:064x}")
    assert found.path == str(tmp_path / "step-000000020")
    assert leftover.committed_after(tmp_path, 20) is None  # the log already had it


def test_an_unreadable_newest_manifest_is_passed_over(tmp_path: Path) -> None:
    committed(tmp_path, 10)
    committed(tmp_path, 20, manifest='{"step": 20, "files": [')  # cut short
    committed(tmp_path, 30, manifest='{"step": 40, "files": {"state.pt": {"sha256": "ab", "bytes": 1}}}')  # misnamed
    found = leftover.committed_after(tmp_path, 0)
    assert found is not None and found.step == 10


def test_what_is_not_a_regular_manifest_in_a_step_folder_is_passed_over_without_waiting(tmp_path: Path) -> None:
    """A FIFO where a manifest should be (opened as a file it waits for a writer, and the rerun
    with it), a link to a manifest, a step folder that links out of the store, a manifest past
    the size any checkpoint writes: none is a committed checkpoint."""
    store, elsewhere = tmp_path / "checkpoints", tmp_path / "elsewhere"
    committed(store, 10)
    committed(elsewhere, 70)
    committed(elsewhere, 80)
    (store / "step-000000099").mkdir()
    os.mkfifo(store / "step-000000099" / "manifest.json")
    (store / "step-000000090").mkdir()
    (store / "step-000000090" / "manifest.json").symlink_to(elsewhere / "step-000000080" / "manifest.json")
    (store / "step-000000070").symlink_to(elsewhere / "step-000000070")
    committed(store, 60, manifest='{"step": 60, "files": {"state.pt": {"sha256": "ab", "bytes": 1}}}' + " " * 65536)
    found: list[object] = []
    reader = threading.Thread(target=lambda: found.append(leftover.committed_after(store, 0)), daemon=True)
    reader.start()
    reader.join(timeout=60)  # a blocked open never returns; a starved one does
    if reader.is_alive():  # let the blocked open go before failing
        os.close(os.open(store / "step-000000099" / "manifest.json", os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), "reading the checkpoints waited on a FIFO"
    (ck,) = found
    assert isinstance(ck, events.Checkpoint) and ck.step == 10


def test_a_log_that_is_not_a_regular_file_is_not_replayed_and_not_waited_on(tmp_path: Path) -> None:
    """A FIFO planted as worker 0's log (opened as a file it waits for a writer, and the rerun with
    it) and a link (which may lead to /dev/zero, a line that never ends) leave nothing to replay."""
    fifo, linked = tmp_path / "fifo", tmp_path / "linked"
    fifo.mkdir()
    linked.mkdir()
    os.mkfifo(fifo / leftover.EVENT_LOG)
    (tmp_path / "elsewhere.log").write_text(events.format_line("step", {"step": 5, "loss": 2.0}) + "\n")
    (linked / leftover.EVENT_LOG).symlink_to(tmp_path / "elsewhere.log")
    assert leftover.logged_events(tmp_path / "none") == []
    found: list[object] = []
    reader = threading.Thread(
        target=lambda: found.extend([leftover.logged_events(fifo), leftover.logged_events(linked)]), daemon=True
    )
    reader.start()
    reader.join(timeout=60)  # a blocked open never returns; a starved one does
    if reader.is_alive():  # let the blocked open go before failing
        os.close(os.open(fifo / leftover.EVENT_LOG, os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), "reading the log waited on a FIFO"
    assert found == [[], []]


def test_an_over_long_line_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    step = events.format_line("step", {"time": 1.0, "step": 5, "loss": 2.0})
    huge = '{"event": "step", "step": 7, "loss": 1.0, "pad": "' + "x" * 5000 + '"}'
    later = [events.format_line("step", {"time": 2.0, "step": n, "loss": 1.5}) for n in (9, 11)]
    (tmp_path / leftover.EVENT_LOG).write_text("\n".join([step, huge, *later]) + "\n")
    monkeypatch.setattr(leftover, "MAX_EVENT_LINE_BYTES", 4096)
    assert leftover.reached_step(leftover.logged_events(tmp_path)) == 11  # step 7's line is skipped whole
    assert [e.step for e in leftover.logged_events(tmp_path) if isinstance(e, events.Step)] == [5, 9, 11]


def long_log(folder: Path, last: int) -> tuple[str, list[str]]:
    """A log whose attempt resumed at step 20 and trained to `last`, a checkpoint at its end."""
    begun = events.format_line("resume", {"step": 20, "path": "/c/step-20", "sha256": "ab", "fromPrecision": "bf16"})
    steps = [events.format_line("step", {"step": n, "loss": 2.0}) for n in range(21, last + 1)]
    saved = events.format_line(
        "checkpoint",
        {"step": last, "path": f"/c/step-{last}", "sha256": "cd", "bytes": 9, "seconds": 0.1, "async": False},
    )
    lines = [begun + "\n", *(line + "\n" for line in steps), saved + "\n"]
    (folder / leftover.EVENT_LOG).write_text("".join(lines))
    return lines[0], lines[-3:]


@pytest.mark.parametrize("cut", [0, 5], ids=["at-a-line-start", "inside-a-line"])
def test_a_log_over_the_bound_is_read_at_its_start_and_its_newest_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    first, newest = long_log(tmp_path, 500)
    monkeypatch.setattr(leftover, "MAX_LOG_HEAD_BYTES", len(first))
    monkeypatch.setattr(leftover, "MAX_LOG_BYTES", len(first) + len("".join(newest)) + cut)
    assert (tmp_path / leftover.EVENT_LOG).stat().st_size > leftover.MAX_LOG_BYTES
    logged = leftover.logged_events(tmp_path)
    assert [type(e).__name__ for e in logged] == ["Resume", "Step", "Step", "Checkpoint"]  # no piece of a line
    assert logged[0].step == 20 and [e.step for e in logged[1:]] == [499, 500, 500]
    assert leftover.reached_step(logged) == 500
