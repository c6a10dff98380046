"""Where a bucket checkpoint's objects lie: the keys below a job's prefix, made and read here only.

    <job>/step-000000200/manifest.json          the commit (the manifest, put last)
    <job>/step-000000200/w-<12 hex>/state.pt    the files of the writer that manifest names
    <job>/.corrupt/step-000000200-<ns>-<hex>/manifest.json
                                                a checkpoint set aside (its manifest, moved)
    <job>/.unloadable/step-000000200             the mark of one that did not load
                                                (checkpoint.unloadable)

Every save uploads into a folder of its own below the step's prefix (`new_writer`; a sharded
save's ranks agree on rank 0's), and its manifest names that folder (`writer`): two writers of
one step (an attempt's pod still saving beside the next attempt's) never upload to the same
key, so a manifest only ever names objects its own writer uploaded. The manifest is read from
the bucket as untrusted input: `writer` is checked (checkpoint.document) to be one plain
segment, and a file's name to stay inside its folder, so a key made here stays below the
step's own prefix. A manifest without `writer` (written before writers had folders) names files
directly below the step's prefix, where those writers put them: it is read as before.

A set-aside checkpoint keeps its objects where they were and its manifest moves below
`.corrupt/`, under a name that sorts by step, then by when it was set aside (`aside_name`).
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from mpjob_trainer.checkpoint.manifest import Manifest, folder_name, step_of

#: The folder below a job's prefix holding the manifests of the checkpoints it set aside.
ASIDE = ".corrupt"
#: The folder below a job's prefix holding the marks of the checkpoints that did not load.
UNLOADABLE = ".unloadable"
_ASIDE_NAME = re.compile(r"(step-[0-9]{9})-[0-9]{20}-[0-9a-f]{6}")


@dataclass(frozen=True)
class Published:
    """Files uploaded into `writer`'s folder below a step's prefix that no manifest names yet (the
    other ranks' own of a framework's save: checkpoint.rank_files): each one's sha256 and size."""

    writer: str
    files: dict[str, dict[str, Any]]


def new_writer() -> str:
    """A writer's own folder below a step's prefix: no other writer's (checkpoint.document.WRITER)."""
    return f"w-{secrets.token_hex(6)}"


def files_prefix(step_prefix: str, manifest: Manifest) -> str:
    """Where the files of `manifest` (read from `step_prefix`, its step's) lie."""
    return f"{step_prefix}/{manifest.writer}" if manifest.writer else step_prefix


def file_keys(step_prefix: str, manifest: Manifest) -> list[str]:
    """The keys of the files `manifest` lists (its names checked on reading: inside the folder)."""
    prefix = files_prefix(step_prefix, manifest)
    return [f"{prefix}/{name}" for name in manifest.files]


def aside_name(step: int) -> str:
    """The name a checkpoint of `step` set aside now takes below ASIDE (no other's: a random tail)."""
    return f"{folder_name(step)}-{time.time_ns():020d}-{secrets.token_hex(3)}"


def aside_step(name: str) -> int | None:
    """The step of a set-aside checkpoint's name (as `aside_name` makes it); None for any other name."""
    m = _ASIDE_NAME.fullmatch(name)
    return step_of(m.group(1)) if m else None


def place_prefix(key: str, where: str) -> str:
    """The prefix below the job's `key` of the place `where` names: its step folder, or its folder
    below ASIDE."""
    path = PurePosixPath(where)
    if path.parent.name == ASIDE and aside_step(path.name) is not None:
        return f"{key}/{ASIDE}/{path.name}"
    return f"{key}/{path.name}"


def mark_key(key: str, where: str) -> str:
    """The key of the mark of the step folder `where` names (below the job's `key`)."""
    return f"{key}/{UNLOADABLE}/{PurePosixPath(where).name}"


def unshared(step_prefix: str, aside: Manifest, committed: Manifest | None) -> list[str]:
    """The keys of the files of `aside`, set aside from `step_prefix`, that `committed` (the step's
    checkpoint now) does not name: what deleting the set-aside one may delete. None when `aside`
    is of another step than the prefix's (a copy: it names nothing of this step's)."""
    if aside.step != step_of(PurePosixPath(step_prefix).name):
        return []
    named = set(file_keys(step_prefix, committed)) if committed is not None else set()
    return [key for key in file_keys(step_prefix, aside) if key not in named]
