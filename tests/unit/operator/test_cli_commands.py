"""`mpjob` itself: a mistyped command is named, and Ctrl-C ends any command with one line and
exit code 130 (README: 130 when stopped by Ctrl-C), not a traceback; so does a reader that
stops reading (`mpjob crd | head`), with 141, as a shell reports SIGPIPE."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest
import yaml

from mpjob.cli import main
from mpjob_contract import spelling
from tests.unit.operator.cases import GOOD

pytestmark = pytest.mark.unit


class _CtrlCTerminal(io.TextIOWrapper):
    """A terminal whose user presses Ctrl-C while a command waits for its input."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO())

    @property
    def buffer(self) -> io.BufferedReader:
        raise KeyboardInterrupt


def test_ctrl_c_while_validate_reads_stdin_ends_it_with_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", _CtrlCTerminal())
    assert main(["validate", "-"]) == 130
    assert capsys.readouterr().out == "interrupted\n"


def test_a_mistyped_command_is_named_before_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stauts", "job"]) == 2
    out = capsys.readouterr().out
    assert out.startswith(
        "error: unknown command 'stauts'; did you mean status?\nusage: mpjob {run,status,validate,crd,operator}"
    ), out
    assert main(["xyz"]) == 2
    assert capsys.readouterr().out.startswith("error: unknown command 'xyz'\nusage: ")  # nothing close: none said


def test_a_command_in_capitals_is_told_its_name_as_a_misspelt_field_is(capsys: pytest.CaptureFixture[str]) -> None:
    """One rule for both (spelling.did_you_mean): case, `_` and `-` do not count against a close name."""
    assert main(["RUN"]) == 2
    assert capsys.readouterr().out.startswith("error: unknown command 'RUN'; did you mean run?\n")
    assert spelling.did_you_mean("batch_size", ["batchSize", "steps"]) == "did you mean batchSize?"


def test_help_is_the_usage_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: mpjob {")


def test_run_help_says_stdin_is_read_from_a_dash(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["run", "--help"])
    assert ended.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "`-` reads stdin" in text and "--out DIR run directory (default: runs/<name>)" in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["", "--kubeconfig", "/nonexistent"], "argument NAME|DIR: '': neither a local run's folder"),
        (["a/b", "--kubeconfig", "/nonexistent"], "argument NAME|DIR: 'a/b': neither a local run's folder"),
        (["/", "--kubeconfig", "/nonexistent"], "/ is a path: -n and --kubeconfig are for a job on a cluster"),
        (["job", "-n", "Team/x", "--kubeconfig", "/nonexistent"], "argument -n/--namespace: 'Team/x': must be"),
    ],
    ids=["empty-name", "name-with-a-slash", "a-path", "bad-namespace"],
)
def test_status_refuses_a_name_no_object_can_have_before_any_request(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty name read the whole collection, a `/` another path: neither is a job's name."""
    with pytest.raises(SystemExit) as ended:
        main(["status", *argv])
    assert ended.value.code == 2
    assert said in capsys.readouterr().err


def test_validate_refuses_stdin_named_twice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stdin is read once: a second `-` was reported empty ("no YAML documents found"), failing
    the run for a reason the manifest had no part in."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"kind: MixedPrecisionJob\n")))
    with pytest.raises(SystemExit) as ended:
        main(["validate", "-", "job.yaml", "-"])
    assert ended.value.code == 2
    said = capsys.readouterr()
    assert said.out == "" and "`-` (stdin) is given 2 times; it is read once: name it once" in said.err
    assert sys.stdin.buffer.read() == b"kind: MixedPrecisionJob\n"  # refused before anything was read


@pytest.mark.parametrize("command", [["crd"], ["validate", "ok.yaml"]])
def test_a_reader_that_stopped_reading_ends_the_command_with_141_not_a_traceback(
    command: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`mpjob status runs/x | head -3` ended in a BrokenPipeError traceback on stderr."""
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(GOOD))
    monkeypatch.chdir(tmp_path)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    with io.TextIOWrapper(os.fdopen(write, "wb")) as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(command) == 141


def test_status_of_a_job_no_operator_took_up_says_so_not_pending(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator writes a status at its first reconcile (its first attempt, or Suspended): a job
    without one was never seen by an operator, which waiting will not change."""
    from mpjob import jobstatus

    job = {**GOOD, "metadata": {"name": "gpt", "namespace": "team-a"}}
    monkeypatch.setattr(jobstatus, "read_job", lambda name, namespace, kubeconfig: ("team-a", job))
    assert main(["status", "gpt"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "team-a/gpt: no status yet: no mpjob operator has taken it up (one does within seconds of its creation); "
        "is one running and watching namespace team-a?"
    ]
