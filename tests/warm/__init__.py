"""Warm starts of the trainer processes the tests run: see client.py, server.py and standin.py.

The client's names are loaded on first use: a rank's interpreter imports this package for its
stand-in (hook/sitecustomize.py), and must not pay for the client's imports on its way."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DEVNULL", "PIPE", "STDOUT", "Popen", "for_ranks", "forked_for", "own_servers", "run", "share_with_workers"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("tests.warm.client"), name)
    raise AttributeError(f"module 'tests.warm' has no attribute {name!r}")
