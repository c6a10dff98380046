"""Where a local run keeps its files: --out's folder.

--out is the user's word, so it is checked before anything starts (`prepare`): a file, a folder
that cannot be made, or one holding what no run wrote is refused with what to do, and `--fresh`
empties a folder only when it is a run's own (`mpjob run job.yaml --out . --fresh` from a
project's folder must not take the project with it). A run holds its folder (a lock on it) until
it ends: a second `mpjob run` of it meanwhile would take the running attempt for a killed one and
train beside it, or with `--fresh` delete its checkpoints. What an earlier run left is read back the
same way: a report.json or series.json it cannot read ends the run with that said, not a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mpjob.localrun.files import read_regular, write_replacing
from mpjob_contract import binding, formats
from mpjob_contract.api import MixedPrecisionJobStatus

#: The job whose run --out holds, written as it starts: {"name": metadata.name, "binds": the
#: settings its checkpoints hold to (mpjob_contract.binding), "run": the run's key (`_new_run`)}.
JOB_FILE = "job.json"
#: A run's key: what names its checkpoints' folder in a bucket (localrun.launching.checkpoint_dir).
_RUN_KEY = re.compile(r"[0-9a-f]{16}")
#: Everything `mpjob run` writes in --out (the .tmp files: a report, series or job file being
#: replaced, the plot being drawn: a runner killed meanwhile leaves them).
RUN_ENTRIES = frozenset(
    {
        *(JOB_FILE, "job.tmp"),
        *("report.json", "report.tmp", "series.json", "series.tmp", "training.png", "training.png.tmp"),
        *("attempts", "checkpoints"),
    }
)
#: More than a job file ever needs: a name of at most 253 characters and a spec's task, which
#: the API server stores in an object of at most 1.5 MiB.
_JOB_FILE_BYTES = 2 << 20
#: What a refusal of an earlier run's files suggests.
START_OVER = "start over with --fresh, or pick another --out"
#: Where `mpjob run` keeps a job's run without --out: runs/<metadata.name>, below the current folder.
RUNS = Path("runs")


def default_out(name: str) -> Path:
    """`mpjob run`'s --out when none is given, for the job named `name`."""
    return RUNS / name


#: The most of a report.json read back: a job's status (its lists bounded: attempts[], the
#: timeline, skipped; its messages cut) is far smaller, so a bigger file is no run's report.
MAX_REPORT_BYTES = 4 << 20


class UnusableOut(Exception):
    """--out cannot hold this run; the message names the folder, what is wrong and what to do."""


class Unreadable(Exception):
    """A run's file (report.json, job.json) that is not what a run writes; the message says why."""


@dataclass
class Paths:
    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    @property
    def series(self) -> Path:
        return self.root / "series.json"

    @property
    def plot(self) -> Path:
        return self.root / "training.png"

    def attempt(self, index: int) -> Path:
        return self.root / "attempts" / f"a{index}"

    def save_report(self, status: MixedPrecisionJobStatus) -> None:
        """report.json holds `status` (as the CR's status would be), replaced whole."""
        write_replacing(self.report, json.dumps(status.to_api(), indent=2) + "\n")

    def earlier_status(self) -> MixedPrecisionJobStatus | None:
        """The status an earlier `mpjob run` of this folder left (None: it left no report)."""
        if not self.report.exists():
            return None
        try:
            status = read_report(self.report)
        except Unreadable as exc:
            raise UnusableOut(f"{self.root}: report.json is not a run's report ({exc}): {START_OVER}") from exc
        if not status.attempts and status.phase != "Suspended":  # runPolicy.suspend starts none
            raise UnusableOut(f"{self.root}: report.json names no attempt to resume from: {START_OVER}")
        return status


def read_report(path: Path) -> MixedPrecisionJobStatus:
    """The status a run's report.json holds, read as untrusted: a regular file (not a FIFO, which
    would hang the read, nor a link) of at most MAX_REPORT_BYTES, validated with the model the
    runner writes it with; Unreadable says why not."""
    data = read_bounded(path, MAX_REPORT_BYTES)
    try:
        return MixedPrecisionJobStatus.model_validate_json(data)
    except ValidationError as exc:
        raise Unreadable(first_problem(exc)) from exc


def read_bounded(path: Path, most: int) -> bytes:
    """The bytes of the run's file `path`, read as untrusted: a regular file (not a FIFO, which
    would hang the read, nor a link) of at most `most` bytes; Unreadable says why not."""
    data = read_regular(path, most + 1)
    if data is None:
        raise Unreadable("missing, a link or not a regular file")
    if len(data) > most:
        raise Unreadable(f"over {most} bytes")
    return data


def first_problem(exc: ValidationError) -> str:
    """The first problem of a check, where it is and what: '0.step: Input should be a valid integer'."""
    first = exc.errors()[0]
    return f"{'.'.join(map(str, first['loc'])) or 'its top'}: {first['msg']}"[:300]


def recorded_job(root: Path) -> str | None:
    """The name of the job whose run `root` holds, as its job.json says (None: it has none, a run
    from before job.json was written); Unreadable when it names no job."""
    found = _job_file(root)
    return None if found is None else found[0]


def recorded_run(root: Path) -> str | None:
    """The key of the run `root` holds, as its job.json says (None: it has none, a run from before
    keys were written); Unreadable when job.json is not one a run writes."""
    found = _job_file(root)
    return None if found is None else found[2]


def _job_file(root: Path) -> tuple[str, dict[str, Any] | None, str | None] | None:
    """What `root`'s job.json says, read as untrusted: the job's name, the settings its run's
    checkpoints hold to and the run's key (None: a job.json from before they were written); None
    when there is no job.json; Unreadable when it is not one a run writes."""
    data = read_regular(root / JOB_FILE, _JOB_FILE_BYTES + 1)
    if data is None:
        return None
    try:
        found = json.loads(data) if len(data) <= _JOB_FILE_BYTES else None
    except (ValueError, RecursionError):
        found = None
    name = found.get("name") if isinstance(found, dict) else None
    if not isinstance(name, str) or not re.fullmatch(formats.JOB_NAME.pattern, name):
        raise Unreadable(f"{JOB_FILE} does not name the job its run was of")
    binds = found.get("binds")  # type: ignore[union-attr]
    if binds is not None and not (isinstance(binds, dict) and set(binds) == set(binding.FIELDS)):
        raise Unreadable(f"{JOB_FILE} binds: not the settings a run's checkpoints hold to")
    run = found.get("run")  # type: ignore[union-attr]
    if run is not None and not (isinstance(run, str) and _RUN_KEY.fullmatch(run)):
        raise Unreadable(f"{JOB_FILE} run: not a run's key")
    return name, binds, run


def held_by_a_run(root: Path) -> bool | None:
    """Whether an `mpjob run` holds the folder `root` now (its runner alive: `prepare`); None when
    that cannot be told (a filesystem that keeps no locks). The probe's own shared lock is let go
    at once."""
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise
    finally:
        os.close(fd)  # closing it lets go of the lock
    return False


@contextlib.contextmanager
def prepare(root: Path, *, fresh: bool, job: str, binds: dict[str, Any]) -> Iterator[None]:
    """--out made ready for the run of the job named `job`, whose checkpoints hold to the settings
    `binds` (mpjob_contract.binding), and held while the block runs: a folder, emptied first with
    `fresh` when it is a run's; refused when it holds another job's run or a run of other
    settings `binds` names, or another `mpjob run` holds it."""
    with contextlib.ExitStack() as held:
        try:
            if root.exists() and not root.is_dir():
                raise UnusableOut(f"{root}: not a folder; pick a folder for the run's files")
            root.mkdir(parents=True, exist_ok=True)
            held.callback(os.close, _held(root))  # closed when the block ends: the folder is free again
            if fresh:
                _emptied(root)
            _claim(root, job, binds)
        except OSError as exc:
            raise UnusableOut(f"{root}: cannot use it as the run's folder ({said(exc)})") from exc
        yield


def said(exc: OSError) -> str:
    """An OSError in words that name its path: 'Permission denied: runs/x/job.tmp'."""
    return f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc)


def _held(root: Path) -> int:
    """A descriptor of the folder `root` that holds it (an exclusive lock, not passed to the
    trainers); UnusableOut when another `mpjob run` holds it. A filesystem that keeps no locks
    (an NFS mount without its lock service) leaves the folder unheld, not unusable."""
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UnusableOut(
            f"{root}: another `mpjob run` is using it until it ends; wait for it, or pick another --out"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            os.close(fd)
            raise
    return fd


def _emptied(root: Path) -> None:
    """`--fresh`: the run's entries of `root` deleted (the folder itself stays: it is held);
    UnusableOut when it holds anything else."""
    entries = sorted(root.iterdir())
    foreign = [entry.name for entry in entries if entry.name not in RUN_ENTRIES]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UnusableOut(
            f"{root}: --fresh deletes the folder, and it holds what no run wrote ({shown}); "
            "pick another --out, or delete it yourself"
        )
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _claim(root: Path, job: str, binds: dict[str, Any]) -> None:
    """The folder's run is the job `job`'s, of the settings `binds`, from now on; UnusableOut when
    an earlier run there was another job's (its report would be taken for this one's, its
    checkpoints resumed) or of other settings (its checkpoints would not resume: the trainers
    would start over at step 0 and set them aside as they saved theirs). A folder of a run from
    before job.json, or its settings, was written is taken as it is."""
    try:
        found = _job_file(root)
    except Unreadable as exc:
        raise UnusableOut(f"{root}: {exc}: {START_OVER}") from exc
    if found is not None and found[0] != job:
        other = (
            f"pick another --out ({default_out(job)} is this job's own), or --fresh to delete the run of {found[0]!r}"
        )
        raise UnusableOut(f"{root}: it holds a run of the job {found[0]!r}, not {job!r}: {other}")
    if found is not None and found[1] is not None and (changed := binding.changed_fields(found[1], binds)):
        raise UnusableOut(
            f"{root}: its run was of other settings than this manifest's, which its checkpoints "
            f"hold to: {'; '.join(changed)}. Nothing was started: --fresh to delete that run and "
            "start over, another --out to keep it (a run with its settings goes on from its checkpoints)"
        )
    run = found[2] if found is not None else _new_run(root)
    # Written again by every run, so a folder it cannot write is refused here, before any attempt.
    write_replacing(root / JOB_FILE, json.dumps({"name": job, "binds": binds, **({"run": run} if run else {})}) + "\n")


def _new_run(root: Path) -> str | None:
    """The key of a run that begins in `root`, which holds no job.json: a new one when no run has
    been there (a new folder, or one --fresh emptied), so its checkpoints in a bucket start over
    (the bucket keeps the earlier run's, which its trainers would resume from); none for a run from
    before job.json was written, whose checkpoints there are found by --out's path."""
    if any(entry.name in RUN_ENTRIES for entry in root.iterdir()):
        return None
    return secrets.token_hex(8)
