"""Ctrl-C on `mpjob run`: the first press asks the trainers to checkpoint and stop, a second kills
them, and what the run records of a killed attempt is what it saw: where its lines put it, the
newest checkpoint known committed (or none), and a rerun that says where it really starts. The
trainers are stood in for by scripted event lines (no process starts)."""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest

from mpjob.localrun import stops
from mpjob.localrun.readings import reached
from mpjob.localrun.runner import LocalRun
from mpjob.localrun.stops import CtrlC, Stop
from mpjob.localrun.workers import LONGEST_LINE, WAKE_SECONDS, lines
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import CheckpointStatus, MixedPrecisionJob, MixedPrecisionJobStatus
from mpjob_contract.report import TerminationReport
from tests.helpers import wait_for
from tests.unit.localrun.scripted_run import JOB, Killed, Shown, Signalled, checkpoint, line, started, step

pytestmark = pytest.mark.unit


def test_the_first_ctrl_c_asks_and_every_later_one_kills_each_said_at_once() -> None:
    view, workers = Shown(), Signalled()
    ctrl_c = CtrlC(view)  # type: ignore[arg-type]
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c.caught(workers):  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next line
        assert (ctrl_c.stop, workers.sent) == (Stop.ASKED, [signal.SIGTERM])
        wait_for(lambda: view.lines == [stops.ASKED_LINE], 30, 0.01, "the press's line")  # the relay's thread says it
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    assert ctrl_c.stop is Stop.KILLED and workers.sent == [signal.SIGTERM, signal.SIGKILL, signal.SIGKILL]
    assert view.lines[1] == "second Ctrl-C: killing the trainers; no checkpoint is written now"


def test_sigterm_stops_the_run_as_ctrl_c_does_and_names_itself() -> None:
    """`kill PID`, `timeout` or `docker stop` on `mpjob run`: it died at once without a word, its
    trainers with it, losing the steps since their last checkpoint, and `mpjob status` said Running."""
    view, workers = Shown(), Signalled()
    ctrl_c = CtrlC(view)  # type: ignore[arg-type]
    before = signal.getsignal(signal.SIGTERM)
    with ctrl_c.caught(workers):  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGTERM)
        assert (ctrl_c.stop, workers.sent) == (Stop.ASKED, [signal.SIGTERM])
        wait_for(lambda: view.lines == [stops.TERMINATED_LINE], 30, 0.01, "the stop's line")
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    assert ctrl_c.stop is Stop.KILLED and workers.sent == [signal.SIGTERM, signal.SIGKILL]
    assert view.lines[1] == "second SIGTERM: killing the trainers; no checkpoint is written now"
    ck = CheckpointStatus(step=40, sha256="ab", precision="bf16", path="/c/step-000000040")
    assert stops.stop_message(Stop.KILLED, None, ck, by=ctrl_c.by) == (
        "killed by a second SIGTERM before the trainers finished stopping; "
        "a rerun with the same --out resumes from checkpoint step 40"
    )


def test_the_step_an_attempts_lines_reach() -> None:
    assert reached(None, started(20)) is None
    assert reached(40, checkpoint(43)) == 43  # the save on SIGTERM, between step lines
    assert reached(43, line("preempted", step=43)) == 43
    assert reached(60, checkpoint(50)) == 60  # an asynchronous save reported after later steps
    assert reached(60, step(41)) == 41  # a replay after a rollback goes back
    change = {"attempt": 1, "startStep": 40, "fromPrecision": "fp16", "toPrecision": "bf16", "rule": "F1"}
    changed = line("precisionChanged", step=60, **change, message="overflow", recoverySeconds=1.0)
    assert reached(60, changed) is None  # the next attempt begins: no line of its own named a step yet


def test_a_rerun_names_the_checkpoint_it_resumes_from_or_says_it_starts_over() -> None:
    ck = CheckpointStatus(step=40, sha256="ab", precision="bf16", path="/c/step-000000040")
    assert stops.resume_line("job", Path("/o"), ck) == "resuming job in /o from checkpoint step 40"
    assert stops.resume_line("job", Path("/o"), None) == "resuming job in /o, starting over: no checkpoint"
    killed, asked = stops.Stop.KILLED, stops.Stop.ASKED
    assert stops.stop_message(killed, None, ck) == (
        "killed by a second Ctrl-C before the trainers finished stopping; "
        "a rerun with the same --out resumes from checkpoint step 40"
    )
    assert stops.stop_message(killed, None, None).endswith("a rerun with the same --out starts over: no checkpoint")
    assert stops.stop_message(asked, None, ck).startswith("stopped by Ctrl-C; the trainers ended without a report")


def test_a_stop_the_trainers_reported_names_the_checkpoint_they_stopped_after_or_none() -> None:
    """Their report, not an assumption: a stop before their first save resumes from an earlier one."""
    ref = {"step": 30, "path": "/c/step-000000030", "sha256": "ab", "precision": "fp16"}
    after = TerminationReport.model_validate({"reason": "Preempted", "step": 31, "lastGoodCheckpoint": ref})
    before = TerminationReport.model_validate({"reason": "Preempted", "step": 3})
    for stop in (stops.Stop.ASKED, stops.Stop.KILLED):  # a report came: it says what was written
        assert stops.stop_message(stop, after, None) == (
            "stopped by Ctrl-C after the checkpoint of step 30; a rerun with the same --out resumes"
        )
        assert stops.stop_message(stop, before, None) == (
            "stopped by Ctrl-C before any checkpoint; a rerun with the same --out starts over"
        )
        earlier = CheckpointStatus(step=20, sha256="cd", precision="fp16", path="/c/step-000000020")
        assert stops.stop_message(stop, before, earlier) == (  # a resumed attempt stopped before its own save
            "stopped by Ctrl-C before a checkpoint of its own; "
            "a rerun with the same --out resumes from checkpoint step 20"
        )


def test_a_killed_attempt_ends_at_the_checkpoint_its_sigterm_save_reported(tmp_path: Path) -> None:
    """The save the first Ctrl-C asked for committed (its line came) before the kill: the attempt
    ended there, not at the last step line, and the summary's step and checkpoint agree."""
    run = Killed(tmp_path, [step(10), step(20), step(30), step(40), checkpoint(43), line("preempted", step=43)])
    status = run.run()
    (attempt,) = status.attempts
    assert status.phase == "Suspended" and (status.step, attempt.end_step) == (43, 43)
    assert status.last_checkpoint is not None and status.last_checkpoint.step == 43
    assert attempt.message is not None and "killed by a second Ctrl-C" in attempt.message
    assert attempt.message.endswith("resumes from checkpoint step 43") and not attempt.charged


def test_a_checkpoint_committed_without_its_line_counts_and_nothing_past_it(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints" / "step-000000050"
    folder.mkdir(parents=True)
    manifest = f'{{"step": 50, "files": {{"state.pt": {{"sha256": "{50:064x}", "bytes": 9}}}}}}'
    (folder / "manifest.json").write_text(manifest)
    status = Killed(tmp_path, [step(10), step(20), checkpoint(20, tmp_path), step(40)]).run()
    assert status.last_checkpoint is not None and status.last_checkpoint.step == 50
    assert status.step == 50 and status.attempts[0].end_step == 50


def test_killed_before_any_checkpoint_the_rerun_starts_over_and_says_so(tmp_path: Path) -> None:
    status = Killed(tmp_path, [line("freshStart", reason="none"), step(10)]).run()
    (attempt,) = status.attempts
    assert status.last_checkpoint is None and (attempt.start_step, attempt.end_step) == (0, 10)
    assert attempt.message is not None and attempt.message.endswith("starts over: no checkpoint")

    again = Killed(tmp_path, [])
    again.run()
    assert again.view.lines[0] == f"resuming stops in {tmp_path}, starting over: no checkpoint"  # type: ignore[attr-defined]
    assert again.status.attempts[1].start_step == 0


def test_killed_before_any_line_named_a_step_it_ends_where_it_began(tmp_path: Path) -> None:
    status = Killed(tmp_path, [started(0)]).run()
    assert status.step == 0 and status.attempts[0].end_step == 0


class Resumed(LocalRun):
    """A rerun of a stopped run whose attempt keeps what the status said while it ran."""

    def __init__(self, out: Path) -> None:
        super().__init__(MixedPrecisionJob.model_validate(JOB), out, Shown())  # type: ignore[arg-type]
        self.said_while_running: list[str | None] = []

    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        self.said_while_running.append(self.status.message)
        return AttemptOutcome(0, TerminationReport(reason="Succeeded", step=300, precision="bf16"))


def test_a_resumed_run_no_longer_says_it_was_interrupted(tmp_path: Path) -> None:
    """The status of the resumed attempt (report.json, rewritten as it starts) said the run was
    interrupted and asked for the very rerun that was running."""
    assert Killed(tmp_path, [step(10), checkpoint(10)]).run().message is not None
    rerun = Resumed(tmp_path)
    assert rerun.run().phase == "Succeeded"
    assert rerun.said_while_running == [None]


class PressedWhileFallingBack(LocalRun):
    """A local run (fp16, falling back to bf16) whose first attempt ends in a numeric fault, and
    the user presses Ctrl-C as the fallback is shown, between that attempt and the next."""

    def __init__(self, out: Path) -> None:
        spec = {**JOB["spec"], "precision": {"mode": "fp16", "fallback": ["bf16"], "inPlace": False}}
        super().__init__(MixedPrecisionJob.model_validate({**JOB, "spec": spec}), out, Shown())  # type: ignore[arg-type]
        self.started: list[int] = []

    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        self.started.append(start.index)
        ref = {"step": 50, "path": "/c/step-000000050", "sha256": "ab", "precision": "fp16"}
        fields = {"reason": "NumericFault", "step": 60, "precision": "fp16", "message": "overflow"}
        return AttemptOutcome(42, TerminationReport.model_validate({**fields, "lastGoodCheckpoint": ref}))

    def _conclude(self, start: StartAttempt, outcome: AttemptOutcome) -> StartAttempt | None:
        nxt = super()._conclude(start, outcome)
        if start.index == 0:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next line
        return nxt


def test_a_ctrl_c_between_attempts_suspends_the_run_before_the_next_one_starts(tmp_path: Path) -> None:
    """It raised a KeyboardInterrupt wherever the runner stood: report.json was left saying the
    faulted attempt still ran, and the rerun took it for a killed one and ran fp16 again."""
    run = PressedWhileFallingBack(tmp_path)
    status = run.run()
    fault, held = status.attempts
    assert run.started == [0] and status.phase == "Suspended"
    assert (fault.precision, fault.reason) == ("fp16", "NumericFault")
    assert (held.precision, held.reason, held.start_step, held.end_step) == ("bf16", "Suspended", 50, 50)
    assert (
        held.message
        == "stopped by Ctrl-C before it started; a rerun with the same --out resumes from checkpoint step 50"
    )
    assert not held.charged and status.step == 50
    assert MixedPrecisionJobStatus.model_validate_json(run.paths.report.read_text()) == status  # on disk too
    assert stops.BETWEEN_LINE in run.view.lines  # type: ignore[attr-defined]


def test_a_ctrl_c_pressed_as_the_workers_start_reaches_them_once_they_run() -> None:
    """Pressed between the attempt's start and its workers' handler: they would have trained on."""
    view, workers = Shown(), Signalled()
    ctrl_c = CtrlC(view)  # type: ignore[arg-type]
    with ctrl_c.caught():  # the runner's, between attempts
        os.kill(os.getpid(), signal.SIGINT)
        with ctrl_c.caught(workers):  # type: ignore[arg-type]
            assert workers.sent == [signal.SIGTERM]
    assert ctrl_c.stop is Stop.ASKED and view.lines == [stops.BETWEEN_LINE]


def reading_a_pipe() -> bool:
    """Whether a thread of this process waits in a read of a pipe (the kernel's wait channel)."""
    tasks = Path("/proc/self/task")
    return any("pipe_read" in (task / "wchan").read_text() for task in tasks.iterdir())


def test_a_press_caught_while_worker_0_is_silent_is_acted_on_before_its_next_line() -> None:
    """The race a second Ctrl-C lost: a signal caught by the C handler just before the runner's main
    thread blocked in a read of a silent trainer (here: caught by another thread, which leaves the
    main thread's wait as uninterrupted) ran its Python handler only after worker 0's next line. A
    hung trainer never sent one, and the press that should kill it went unheard."""
    read, write = os.pipe()
    heard = threading.Event()

    def press(*_: object) -> None:  # the main thread's handler: the trainer answers it
        heard.set()
        os.write(write, b"after the press\n")

    def silent_then_give_up() -> None:
        wait_for(reading_a_pipe, 30, message="a thread blocked in a read of worker 0's pipe")
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # caught here, handled in the main thread
        if not heard.wait(10 * WAKE_SECONDS):
            os.write(write, b"unheard\n")

    previous = signal.signal(signal.SIGUSR1, press)
    with os.fdopen(read) as stream:
        said = lines(stream)
        try:
            threading.Thread(target=silent_then_give_up, daemon=True).start()
            first = next(said)
        finally:
            signal.signal(signal.SIGUSR1, previous)
            os.close(write)
        assert [first, *said] == ["after the press\n"]  # said until the pipe's end (its reader is done)


def test_a_line_without_end_comes_in_bounded_pieces_in_order() -> None:
    """A trainer that prints without a newline (a dump, a progress bar's carriage returns) never has
    the runner hold more than LONGEST_LINE of it: the pieces come as they are read, in order."""
    endless = "x" * (2 * LONGEST_LINE + 5)
    pieces = list(lines(io.StringIO(endless + "\n" + '{"event": "step"}\n')))
    assert [len(p) for p in pieces] == [LONGEST_LINE, LONGEST_LINE, 6, 18]
    assert "".join(pieces) == endless + "\n" + '{"event": "step"}\n'
