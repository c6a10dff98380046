"""Where a local attempt's ranks meet: the rendezvous store, held by `mpjob run` as torchrun's
agent holds it.

On a cluster rank 0's pod hosts the TCPStore on the fixed port its Service names, and no other
process shares the pod's network. On one machine a port picked free and bound seconds later by
rank 0 (once it has imported torch) could be taken in between by any connection of any process,
and the attempt ended InfraError (EADDRINUSE) having trained nothing. So `mpjob run` listens on a
port the kernel gives it before any worker starts, hands that socket to a TCPStore of its own
(torch's `master_listen_fd`) and tells every rank, with torch's own switch
(TORCHELASTIC_USE_AGENT_STORE), to be a client of it. Ranks that connect before the store serves
wait in the socket's backlog; the runner imports torch while they import theirs.

A world of one forms no group of ours (a framework may form one: it binds MASTER_PORT itself),
so there the runner names a port that nothing but a bind of that very port can take
(ports.free_port: below the kernel's ephemeral range) and imports nothing."""

from __future__ import annotations

import importlib.util
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

from mpjob.localrun.ports import free_port

if TYPE_CHECKING:
    from torch.distributed import TCPStore

HOST = "127.0.0.1"
#: How long the store waits on an operation of its own (it makes none: its clients set theirs).
STORE_TIMEOUT = timedelta(minutes=30)


class Rendezvous:
    """One attempt's store: made before its workers start (`env`), served once they have
    (`serve`), closed when every one has ended (`close`)."""

    def __init__(self, world_size: int) -> None:
        self._listening: socket.socket | None = None
        self._store: TCPStore | None = None
        #: Whether the runner serves the store (else rank 0 does, on `port`).
        self.hosted = world_size > 1 and importlib.util.find_spec("torch") is not None
        if self.hosted:
            self._listening = socket.create_server((HOST, 0), backlog=max(world_size, 128))
            self.port = int(self._listening.getsockname()[1])
        else:
            self.port = free_port()

    def env(self) -> dict[str, str]:
        """The variables that tell the ranks where to meet."""
        where = {"MASTER_ADDR": HOST, "MASTER_PORT": str(self.port)}
        if not self.hosted:
            return where
        # RESTART_COUNT: older torch prefixes an agent store's keys with it.
        return {**where, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}

    def serve(self) -> None:
        """Start answering the ranks on the socket `env` named."""
        if self._listening is None:
            return
        from torch.distributed import TCPStore  # a second of import, for a group only

        listening, self._listening = self._listening.detach(), None  # the store closes it
        self._store = TCPStore(
            HOST, self.port, None, True, STORE_TIMEOUT, wait_for_workers=False, master_listen_fd=listening
        )

    def close(self) -> None:
        """Stop the store (and so its socket), or close the socket no store took."""
        self._store = None
        if self._listening is not None:
            self._listening.close()
            self._listening = None
