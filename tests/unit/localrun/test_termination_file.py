"""A worker's termination file is read as the operator gets a pod's termination message: its
last bytes, bounded (the kubelet keeps 4096; `mpjob run` keeps the contract's MAX_REPORT_BYTES),
from a regular file only; what runs in a worker can write anything there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpjob.localrun.workers import Workers, termination_message
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.report import MAX_REPORT_BYTES, TerminationReport

pytestmark = pytest.mark.unit

REPORT = TerminationReport.model_validate({"reason": "NumericFault", "step": 30, "precision": "fp16"}).to_message()


def huge(path: Path, tail: bytes) -> None:
    """64 MiB of nothing (a sparse file, cheap to write) and then `tail`."""
    with path.open("wb") as file:
        file.truncate(64 << 20)
        file.seek(0, os.SEEK_END)
        file.write(tail)


def test_a_huge_termination_file_is_read_to_its_last_bytes_only(tmp_path: Path) -> None:
    huge(tmp_path / "termination", b" " * 4000 + REPORT.encode())
    message = termination_message(tmp_path / "termination")
    assert message is not None and len(message.encode()) == MAX_REPORT_BYTES
    assert message.endswith(REPORT) and TerminationReport.parse_message(message) is not None


def test_what_is_not_a_regular_file_is_no_message(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # read as a file, it would wait for a writer for good
    (tmp_path / "elsewhere").write_text(REPORT)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    assert [termination_message(tmp_path / name) for name in ("fifo", "link", "none")] == [None, None, None]
    assert termination_message(tmp_path / "elsewhere") == REPORT


@pytest.mark.parametrize(("before", "reported"), [(b" " * 4000, "NumericFault"), (b"\xff not UTF-8\n" * 500, None)])
def test_a_worker_that_left_a_huge_file_is_judged_by_its_last_bytes(
    tmp_path: Path, before: bytes, reported: str | None
) -> None:
    """As the operator judges the kubelet's tail of it: a report when its last bytes are one,
    else the tail of a log (a crash's ending), never the whole file read."""
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": 0}})
    workers = Workers(spec, folder=tmp_path, cwd=tmp_path, python=sys.executable)
    workers.procs = [subprocess.Popen([sys.executable, "-c", "raise SystemExit(42)"], text=True)]
    huge(tmp_path / "termination-worker0.json", before + REPORT.encode())
    outcome = workers.wait(0)
    assert (outcome.exit_code, outcome.report and outcome.report.reason) == (42, reported)
    assert reported is not None or outcome.message.endswith(REPORT)
