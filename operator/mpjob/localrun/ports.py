"""A port on this machine that another process binds later (`free_port`).

A port the kernel hands out for an address of port 0 comes from its ephemeral range
(net.ipv4.ip_local_port_range), where it places every socket it picks a port for: each outgoing
connection's local port, each other bind of port 0 (a gloo rank's listening sockets among them).
Picked that way, closed, and bound seconds later by a child (once it has imported torch), it
could be placed under any of those in between: the child's bind then failed (EADDRINUSE). So
`free_port` picks from below that range (PICKED_FROM up to PICKED_BELOW or the range's start),
where the kernel never places a socket of its own accord: only a process binding that very port
can take it, and it is checked free when picked. At random: two processes collide only when both
pick one port in the seconds before either binds it, one chance in thousands. Where the kernel's
range leaves no room below it, the port is the kernel's.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

HOST = "127.0.0.1"
#: The lowest port picked: most services' configured ports lie below it.
PICKED_FROM = 10000
#: The port the picks stay below, clear of those the project's test cluster fixes (its servers
#: from 16380, its pods' rendezvous ports 21000-28999: tests/cluster) and of torch's 29500.
PICKED_BELOW = 16000
#: How many random ports are tried before the kernel's is taken.
TRIES = 32
#: Where Linux keeps its ephemeral range ("32768\t60999"); elsewhere IANA's is assumed.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
IANA_EPHEMERAL_START = 49152


def free_port() -> int:
    """A port no process listens on now, none the kernel gives a connection of its own accord."""
    start, stop = picked_range()
    for _ in range(TRIES if stop > start else 0):
        port = start + secrets.randbelow(stop - start)
        if bindable(port):
            return port
    return kernel_port()


def picked_range() -> tuple[int, int]:
    """[start, stop) of the ports `free_port` picks from: below the ephemeral range's start."""
    return PICKED_FROM, min(PICKED_BELOW, ephemeral_start())


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (its own reading, else IANA's)."""
    try:
        return int(EPHEMERAL_RANGE.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return IANA_EPHEMERAL_START


def bindable(port: int) -> bool:
    """Whether a server could bind `port` now, on every address (as torch's store does): no
    socket holds it, in any state (a server without SO_REUSEADDR fails on one in TIME_WAIT)."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def kernel_port() -> int:
    """A port from the kernel's ephemeral range, free when returned."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])
