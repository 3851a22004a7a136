"""Closing the server's socket shell never waits on a socket someone else left open."""

from __future__ import annotations

import threading
from typing import Any

import zmq

from feedmux.server._shell import SocketShell
from feedmux.server.config import ServerConfig


def test_close_returns_when_a_socket_of_its_context_was_left_open() -> None:
    # A second SIGTERM can land between the closes of forward's sockets to the
    # workers (opened in the shell's context): the one left open made the shell's
    # close wait for ever in the context's term(), and the server, stuck there with
    # its workers spinning, ignored every later signal (CI saw all three alive).
    config = ServerConfig(source="tests.integration.samplers:numbered",
                          bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0")
    shell = SocketShell(config, stopping=False, shm=lambda config: None)
    left: zmq.Socket[Any] = shell.context.socket(zmq.PULL)
    left.bind("tcp://127.0.0.1:0")
    closing = threading.Thread(target=shell.close, daemon=True)
    closing.start()
    closing.join(10)
    try:
        assert not closing.is_alive(), "SocketShell.close() still waits on the socket left open"
        assert left.closed
    finally:
        if closing.is_alive():  # let the stuck close finish before the test process ends
            left.close(linger=0)
            closing.join(5)
