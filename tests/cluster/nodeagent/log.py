"""The agent's clock and log: timestamps as the API writes them (RFC 3339, whole seconds)
and one stamped line per event on stdout, which `up` sends to logs/node-agent.log."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(msg: str) -> None:
    print(f"{now()} {msg}", flush=True)
