"""A reader that stopped reading (`mpjob ... | head`): what is left to print goes nowhere."""

from __future__ import annotations

import os
from typing import Any


def to_nowhere(stream: Any) -> None:
    """Point `stream`'s file descriptor at /dev/null, so later writes, and the flush of its buffer
    at exit, raise no BrokenPipeError."""
    nowhere = os.open(os.devnull, os.O_WRONLY)
    os.dup2(nowhere, stream.fileno())
    os.close(nowhere)
