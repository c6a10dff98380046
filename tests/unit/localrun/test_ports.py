"""A port another process binds later (mpjob.localrun.ports.free_port): picked below the kernel's
ephemeral range, where the kernel places no socket of its own accord (a connection's local port,
a bind of port 0: a gloo rank's listening sockets), so the seconds between the pick and the
child's bind leave it to nobody but a process binding that very port (a world of one's
MASTER_PORT under `mpjob run`, the tests' servers), and clear of the ports the test cluster fixes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mpjob.localrun import ports
from mpjob.localrun.ports import HOST, bindable, ephemeral_start, free_port, picked_range
from tests.cluster.nodeagent.network import RENDEZVOUS_PORTS

pytestmark = pytest.mark.unit


def ephemeral() -> tuple[int, int]:
    low, high = ports.EPHEMERAL_RANGE.read_text(encoding="ascii").split()
    return int(low), int(high)


def test_a_picked_port_is_outside_the_range_connections_take_theirs_from_and_a_server_binds_it() -> None:
    low, high = ephemeral()
    start, stop = picked_range()
    assert stop <= low and start < stop
    # Connections made meanwhile take local ports of the ephemeral range only.
    with socket.create_server((HOST, 0)) as server:
        clients = [socket.create_connection(server.getsockname()) for _ in range(20)]
        taken = {client.getsockname()[1] for client in clients}
        picked = [free_port() for _ in range(50)]
        for client in clients:
            client.close()
    assert all(low <= port <= high for port in taken)
    assert all(start <= port < stop for port in picked) and not taken & set(picked)
    # Clear of the test cluster's servers (16380 on) and its pods' rendezvous ports.
    assert stop <= 16380 and not set(range(start, stop)) & set(RENDEZVOUS_PORTS)
    with socket.create_server(("", picked[0])) as child:  # as torch's store binds MASTER_PORT
        assert child.getsockname()[1] == picked[0]


def test_a_port_any_socket_holds_is_not_bindable_and_is_once_it_is_let_go() -> None:
    port = free_port()
    with socket.create_server((HOST, port)):
        assert not bindable(port)
    assert bindable(port)
    # A socket bound but not listening (a client's local port, set by hand) holds it too.
    with socket.socket() as held:
        held.bind((HOST, port))
        assert not bindable(port)


def test_where_the_ephemeral_range_leaves_no_room_below_it_the_kernels_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wide = tmp_path / "ip_local_port_range"
    wide.write_text("1024\t65535\n", encoding="ascii")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", wide)
    start, stop = picked_range()
    assert stop <= start
    port = free_port()
    assert 1024 <= port <= 65535 and bindable(port)


def test_an_unreadable_ephemeral_range_is_taken_as_ianas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for text in (None, "", "many ports"):
        where = tmp_path / f"range-{text}"
        if text is not None:
            where.write_text(text, encoding="ascii")
        monkeypatch.setattr(ports, "EPHEMERAL_RANGE", where)
        assert ephemeral_start() == ports.IANA_EPHEMERAL_START
    assert picked_range() == (ports.PICKED_FROM, ports.PICKED_BELOW)
