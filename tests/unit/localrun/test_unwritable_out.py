"""A run folder `mpjob run` cannot write (made read-only, a full disk) stops the run with one line
naming the path and what to do, not a traceback; one it cannot write at all is refused before
any attempt starts. Root passes over file permissions: the runs drop that pass (`unprivileged`)."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.unit.localrun.test_run import mpjob_run
from tests.unit.localrun.tiny import tiny_job
from tests.unit.trainer.conftest import binds_permissions, unprivileged

pytestmark = [pytest.mark.unit, binds_permissions]

RUN = "import sys; from mpjob.cli import main; sys.exit(main(sys.argv[1:]))"


def read_only(root: Path) -> None:
    """`root` and everything below it, read-only."""
    for path in [root, *root.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)


@pytest.fixture
def writable_again(tmp_path: Path) -> Iterator[None]:
    """What a test made read-only is writable again for the cleanup."""
    yield
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)


def said(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.process
@pytest.mark.usefixtures("writable_again")
def test_a_read_only_run_folder_is_refused_naming_the_file_it_cannot_write(tmp_path: Path) -> None:
    job, out = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(tiny_job()))
    assert mpjob_run(str(job), "--out", str(out), "--plain").returncode == 0
    read_only(out)  # archived as it ended
    done = unprivileged(RUN, "run", str(job), "--out", str(out), "--plain", "--no-plot")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert said(done) == f"error: --out {out}: cannot use it as the run's folder (Permission denied: {out}/job.tmp)\n"


@pytest.mark.usefixtures("writable_again")
def test_a_folder_of_the_run_it_cannot_write_stops_the_run_naming_it(tmp_path: Path) -> None:
    job, out = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(tiny_job()))
    (out / "attempts").mkdir(parents=True)
    read_only(out / "attempts")
    done = unprivileged(RUN, "run", str(job), "--out", str(out), "--plain", "--no-plot")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert said(done).endswith(
        f"error: --out {out}: the run stopped: Permission denied: {out}/attempts/a0; free some space or mend "
        "the permissions, then run the same command again: it resumes from its newest checkpoint\n"
    )
    assert not list((out / "attempts").iterdir())
