"""A trainer's private local spool folder, on the pod's scratch disk, that outlives no process.

A job whose checkpoints (and profiles) go to a bucket writes them into a local folder first.
It lies where the pod gives the trainer scratch room (`$MPJOB_SCRATCH_DIR`: the checkpoint
volume's emptyDir, which such a job leaves unused, removed with the pod), else in the system's
temporary folder (a local run): not the container's own writable layer, which a read-only root
filesystem refuses.

A process removes its spool when it ends; a killed one (SIGKILL, OOM, a node's kill) cannot, so
each spool holds a lock file (`.owner`, flock) for as long as its process lives: the kernel
drops the lock with the process, whatever killed it. A new spool first removes the spools of
its kind whose lock it can take (`sweep`): only folders of its own prefix, of this user, that
hold an `.owner` nobody holds. A live process's spool (another rank, another trainer on the
node) is never touched, nor a folder without the mark (one being made, or not ours to judge).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import weakref
from pathlib import Path

from mpjob_contract.environment import SCRATCH_ENV

#: The lock file in every spool, held (flock) by the process that uses it.
OWNER = ".owner"
#: How many fresh folders a spool tries when a sweeper took the one it was making.
CLAIM_TRIES = 8


def scratch_place() -> Path:
    """Where spools go: the pod's scratch folder (SCRATCH_ENV), else the system's temporary one."""
    named = os.environ.get(SCRATCH_ENV)
    return Path(named) if named else Path(tempfile.gettempdir())


class Spool:
    """A private folder `<place>/<prefix><random>/` of this process, removed when it is
    collected or the interpreter exits; left by a killed process, removed by the next spool of
    its kind that starts in the same place."""

    def __init__(self, prefix: str, place: Path | None = None) -> None:
        where = place if place is not None else scratch_place()
        where.mkdir(parents=True, exist_ok=True)
        sweep(where, prefix)
        self.path, lock = _claim(where, prefix)
        self._finalizer = weakref.finalize(self, _release, self.path, lock)

    def remove(self) -> None:
        """Remove the folder and drop its lock (once; what collection does too)."""
        self._finalizer()


def sweep(where: Path, prefix: str) -> None:
    """Remove the spools of `prefix` below `where` whose process is gone (their `.owner` unheld)."""
    for folder in where.glob(f"{prefix}*"):
        try:
            ours = stat.S_ISDIR((found := folder.lstat()).st_mode) and found.st_uid == os.getuid()
        except OSError:  # removed meanwhile (by its process, or another sweeper)
            continue
        if ours:
            _remove_abandoned(folder)


def _remove_abandoned(folder: Path) -> None:
    """`folder`, when its owner lock can be taken: held through the removal, so a spool being
    made there (which takes the lock next) finds its folder gone and makes another."""
    try:
        lock = os.open(folder / OWNER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # no mark: being made, or not a spool of ours
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its process lives
        os.close(lock)
        return
    try:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(lock)


def _claim(where: Path, prefix: str) -> tuple[Path, int]:
    """A new folder and its held owner lock. A sweeper may take the lock between the file's
    making and ours (and remove the folder): the lock is ours only while its file is still there."""
    for _ in range(CLAIM_TRIES):
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
        try:
            lock = os.open(folder / OWNER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:  # swept already
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(lock), os.stat(folder / OWNER)):
                return folder, lock
        except OSError:  # a sweeper holds it, or removed it
            pass
        os.close(lock)
    raise OSError(f"no spool folder of {prefix!r} could be kept in {where}: each was removed as it was made")


def _release(folder: Path, lock: int) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os.close(lock)
