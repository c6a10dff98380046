"""Reading the API server's JSON bodies however deep they nest.

The API server stores a document nested up to 10,000 levels (its JSON decoder's limit,
k8s.io/apimachinery/pkg/util/json), wherever a schema leaves a field free-form: the
metadata.managedFields of any object (the server keeps what a client sends there), and a job
stored before the CRD bounded task.args or under an older CRD. Python's json parser
recurses once a level under the interpreter's recursion limit (1,000 by default), so one such
object in a listing or a watch event ended kopf's watch, and with it the process, and every
restart met it again in its first listing. `allow_deep_documents` raises the limit above the
deepest document the server holds before any watch starts: kopf's decoding (aiohttp's and its
watch stream's json.loads) and ours both run under it. Our decode points also turn a
RecursionError into `Undecodable`, a ValueError, which a watch skips with a log line rather
than stop, should a body ever go deeper than that.

What is decoded is then read through the models, which stop at their own bounds: a job whose
spec nests too deep fails once with the field named (the reconciler's invalid-spec path).
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: Nesting levels the API server decodes at most (k8s.io/apimachinery/pkg/util/json maxDepth).
DEEPEST_DOCUMENT = 10_000
#: Frames a reader may spend on each level: the parser one, the consumers that walk a body (a
#: deep copy, a repr) up to three.
FRAMES_PER_LEVEL = 3
RECURSION_LIMIT = DEEPEST_DOCUMENT * FRAMES_PER_LEVEL


class Undecodable(ValueError):
    """A body this interpreter cannot decode (nested past its recursion limit)."""


def allow_deep_documents() -> None:
    """Let this process decode every document the API server can store. The parser's C frames
    are small (a 10,000-level document takes about 1.5 MB of an 8 MB thread stack)."""
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)


def loads(data: str | bytes) -> Any:
    """json.loads, raising Undecodable (a ValueError) where the parser runs out of depth."""
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise Undecodable(f"a {len(data)}-byte body nested deeper than this process decodes") from exc
