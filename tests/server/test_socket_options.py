"""The server's sockets: a half-open connection is let go of within ``HALF_OPEN_TIMEOUT``
wherever the trainers' libzmq keeps reading (the control socket, and the data socket:
every trainer is dealt by credit, so its libzmq reads whatever comes)."""

from __future__ import annotations

import zmq

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT
from feedmux.server._shell import SocketShell
from feedmux.server.config import ServerConfig


def test_half_open_connections_are_bounded_where_the_trainers_keep_reading() -> None:
    # Every trainer's libzmq reads whatever comes (credit bounds the data): both sockets.
    config = ServerConfig(source="tests.integration.samplers:numbered",
                          bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0")
    shell = SocketShell(config, stopping=False, shm=lambda config: None)
    try:
        bound = int(HALF_OPEN_TIMEOUT * 1000)
        assert shell.control.getsockopt(zmq.TCP_MAXRT) == bound
        assert shell.data.getsockopt(zmq.TCP_MAXRT) == bound
    finally:
        shell.close()
