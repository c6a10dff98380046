"""The volume store's checkpoint folder (checkpoint.store) and what lies in it beside the step
folders: whether the trainer can write there at all, the `.corrupt-*` folders of checkpoints set
aside, the `.unloadable-<step folder>` marks of checkpoints that did not load
(checkpoint.unloadable), each written whole under a `.tmp-*` name and renamed into place; and,
inside a step folder, a framework's checkpoint holding nothing its manifest does not list.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Collection
from pathlib import Path

from mpjob_trainer.checkpoint.manifest import FRAMEWORK, fsync_dir, step_of
from mpjob_trainer.errors import ConfigError

SET_ASIDE = ".corrupt-"
UNLOADABLE = ".unloadable-"

#: Why a checkpoint folder cannot be made that no retry fixes: a file in its place or on its
#: path, no permission, a read-only volume.
_NO_FOLDER = frozenset({errno.EEXIST, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EROFS})


def writable_folder(root: Path) -> None:
    """Make `root`, a folder this process writes checkpoints into; a ConfigError naming it when it
    cannot be one (no retry helps: every save would fail, the final one the attempt)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno not in _NO_FOLDER:
            raise
        raise ConfigError(
            f"checkpointDir {root}: not a folder this trainer can create ({exc.strerror}): the job's "
            "checkpoint folder must be a writable folder of the checkpoint volume"
        ) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise ConfigError(
            f"checkpointDir {root}: this trainer may not write into it (uid {os.getuid()}; a read-only "
            "volume, or a folder of another user): the job's checkpoint folder must be writable"
        )


def set_aside_order(folder: Path) -> tuple[int, int]:
    """How new a `.corrupt-<step folder>-<random>` folder is: its step, then when it was set aside."""
    step = step_of(folder.name.removeprefix(SET_ASIDE).rsplit("-", 1)[0])
    with contextlib.suppress(OSError):  # gone meanwhile (another job's, deleted by it): oldest
        return (step if step is not None else -1, folder.stat().st_ctime_ns)
    return (-1, 0)


def write_mark(root: Path, name: str, body: bytes | None) -> None:
    """The mark of the step folder `name` in `root` made `body`, durably (None: removed)."""
    mark = root / f"{UNLOADABLE}{name}"
    if body is None:
        mark.unlink(missing_ok=True)
        fsync_dir(root)
        return
    tmp = root / f".tmp-mark-{secrets.token_hex(6)}"  # a killed write leaves it to clean_stale
    with tmp.open("wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(mark)
    fsync_dir(root)


def read_mark(root: Path, name: str, limit: int) -> bytes | None:
    """The mark of the step folder `name` in `root`, no more than `limit` + 1 bytes of it; None
    when there is none (nor anything a mark could be: a folder, a pipe)."""
    mark = root / f"{UNLOADABLE}{name}"
    if not mark.is_file():
        return None
    try:
        with mark.open("rb") as f:
            return f.read(limit + 1)
    except FileNotFoundError:  # removed since (a save of its step replaced the checkpoint)
        return None


def unlisted(folder: Path, listed: Collection[str]) -> str | None:
    """The first entry of the checkpoint `folder`'s framework/ (named as a manifest names files)
    that is not a folder or a file of `listed` (a link to a folder included); None: none. The
    framework loads every file of its checkpoint it knows of: one the manifest does not list
    would reach it unchecked."""
    for root, folders, files in os.walk(folder / FRAMEWORK):  # a link to a folder is not walked
        links = [name for name in folders if os.path.islink(os.path.join(root, name))]
        for name in sorted(files) + links:
            named = Path(root, name).relative_to(folder).as_posix()
            if named not in listed:
                return named
    return None
