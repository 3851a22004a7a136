"""The server's sockets: a half-open connection is let go of within ``HALF_OPEN_TIMEOUT``
wherever the trainers' libzmq keeps reading, and never on the plain data socket, whose
trainers' full queues close their receive windows by design (Linux applies the bound to a
closed window too: a trainer in a long step would be cut off)."""

from __future__ import annotations

import pytest
import zmq

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT
from feedmux.server._shell import SocketShell
from feedmux.server.config import ServerConfig


@pytest.mark.parametrize("reliable", [False, True], ids=["plain", "reliable"])
def test_half_open_connections_are_bounded_where_the_trainers_keep_reading(
    reliable: bool
) -> None:
    config = ServerConfig(source="tests.integration.samplers:numbered",
                          bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0",
                          reliable=reliable)
    shell = SocketShell(config, stopping=False, shm=lambda config: None)
    try:
        bound = int(HALF_OPEN_TIMEOUT * 1000)
        assert shell.control.getsockopt(zmq.TCP_MAXRT) == bound
        assert shell.data.getsockopt(zmq.TCP_MAXRT) == (bound if reliable else 0)
    finally:
        shell.close()
