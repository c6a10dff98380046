"""Pod DNS names without a DNS server: `hostname.subdomain.namespace.svc` lines for the
pods of this node, in one marked block of /etc/hosts ($MPJOB_AGENT_HOSTS_FILE to use
another file). The block is tagged with the cluster's state directory, so two test
clusters on one machine each own their block and never erase the other's.

Two agents (a private cluster beside the shared one) rewrite the file at once, and a
resolver reads it at any instant: a rewrite holds an exclusive lock across processes (else
one agent's block is lost to the other's read-modify-write), and writes the new text
before it cuts the old tail (truncating first left an empty file for a lookup to find)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.cluster.nodeagent.log import log


def hosts_file() -> Path:
    return Path(os.environ.get("MPJOB_AGENT_HOSTS_FILE", "/etc/hosts"))


def markers(state_dir: Path) -> tuple[str, str]:
    """The first and last line of this cluster's block."""
    tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return f"# BEGIN mpjob test cluster {tag}", f"# END mpjob test cluster {tag}"


@contextlib.contextmanager
def _hosts_lock(path: Path) -> Iterator[None]:
    """Exclusive across processes, for every agent on this machine that writes `path`."""
    tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    with open(Path(tempfile.gettempdir()) / f"mpjob-hosts-{tag}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write_hosts(state_dir: Path, entries: dict[str, list[str]]) -> None:
    """Replace the agent's block (in place: /etc/hosts may be a bind mount)."""
    path = hosts_file()
    try:
        with _hosts_lock(path), path.open("r+") as f:
            text = _with_block(f.read(), state_dir, entries)
            f.seek(0)
            f.write(text)
            f.truncate()
    except OSError as exc:
        log(f"cannot write {path} ({exc.strerror}): pod DNS names will not resolve")


def _with_block(text: str, state_dir: Path, entries: dict[str, list[str]]) -> str:
    """`text` with this cluster's block replaced by `entries` (dropped when empty)."""
    begin, end_mark = markers(state_dir)
    lines = text.splitlines()
    if begin in lines and end_mark in lines:
        start, end = lines.index(begin), lines.index(end_mark)
        lines = lines[:start] + lines[end + 1 :]
    block = [line for lines_ in entries.values() for line in lines_]
    if block:
        lines += [begin, *block, end_mark]
    return "\n".join(lines) + "\n"


def pod_hosts(pod: Any, ip: str) -> list[str]:
    """The pod's lines: `hostname.subdomain.namespace.svc` (and `.cluster.local`) when it has both."""
    if not (pod.spec.hostname and pod.spec.subdomain):
        return []
    fqdn = f"{pod.spec.hostname}.{pod.spec.subdomain}.{pod.metadata.namespace}.svc"
    return [f"{ip} {fqdn} {fqdn}.cluster.local"]
