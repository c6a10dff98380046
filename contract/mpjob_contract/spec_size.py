"""How large a spec a trainer pod can be started with.

Every trainer process gets its attempt, the whole spec in it, as one environment variable
(`MPJOB_LAUNCH`, launch.AttemptLaunch), and Linux's execve takes no `NAME=value` string longer
than MAX_ARG_STRLEN: past it the container cannot start (`argument list too long`), nor can
`mpjob run` start its processes. The API server stores a spec up to its object limit, and
task.args, a template's env and keepFp32 take values of any length, so a spec past the bound is
refused where it is validated, naming its largest part, instead of failing every attempt's pods.

The bound is certain, never a guess: the launch's own fields (its job, namespace, precision,
checkpoint folder) take more than LAUNCH_FIELDS_BYTES beside the spec, so a spec past
MAX_SPEC_BYTES never started a pod, and refusing it fails no running job after an upgrade.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from mpjob_contract.environment import LAUNCH_ENV

#: Linux's MAX_ARG_STRLEN (32 pages of 4 KiB): the longest string execve takes, its NUL included.
MAX_ARG_STRLEN = 32 * 4096
#: Less than what an AttemptLaunch's own fields take beside its spec (about 350 bytes at least).
LAUNCH_FIELDS_BYTES = 256
#: The largest spec, as JSON, whose launch may still start a trainer process.
MAX_SPEC_BYTES = MAX_ARG_STRLEN - 1 - len(f"{LAUNCH_ENV}=") - LAUNCH_FIELDS_BYTES
#: How deep the refusal looks for the part to name (task.args.<name>, template.env[<i>]).
NAMED_DEPTH = 4


def oversized(spec: BaseModel) -> tuple[str, str] | None:
    """(field below spec, why) when the spec, as the launch carries it, is too large to start a
    trainer process with; the field is its largest part."""
    size = len(spec.model_dump_json(by_alias=True).encode())
    if size <= MAX_SPEC_BYTES:
        return None
    field, part = _largest(spec.model_dump(by_alias=True, mode="json"))
    return field, (
        f"the spec is {size} bytes as JSON, past the {MAX_SPEC_BYTES} a trainer process can be started with "
        f"(it travels in one environment variable, {LAUNCH_ENV}, and Linux takes at most {MAX_ARG_STRLEN} "
        f"bytes in one); this part is {part} bytes of it: pass large data in a file (the image, a volume) "
        "and name the file here"
    )


def _largest(wire: Any) -> tuple[str, int]:
    """The largest part of `wire` (the spec) and its size as JSON: its largest field, then at most
    NAMED_DEPTH levels down along the largest part of each level, while that holds most of it."""
    path, size = "", len(_json(wire))
    for _ in range(NAMED_DEPTH):
        if isinstance(wire, dict) and wire:
            parts = [(f".{key}", value) for key, value in wire.items()]
        elif isinstance(wire, list) and wire:
            parts = [(f"[{index}]", value) for index, value in enumerate(wire)]
        else:
            break
        sized = [(len(_json(value)), step, value) for step, value in parts]
        largest, step, wire = max(sized, key=lambda entry: entry[0])
        if path and largest * 2 < size:  # no part holds most of it: the whole is what to shorten
            break
        path, size = path + step, largest
    return path.lstrip("."), size


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
