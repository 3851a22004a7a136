"""The server's sockets: a half-open connection is let go of within ``HALF_OPEN_TIMEOUT``
wherever the trainers' libzmq keeps reading (the control socket, and the data socket:
every trainer is dealt by credit, so its libzmq reads whatever comes); the control
socket pings and never stops reading a connection (libzmq 4.3.5 can abort on a ping to
a connection that had stopped reading and whose peer has gone)."""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection

import zmq

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT, HEARTBEAT_INTERVAL
from feedmux.server._shell import SocketShell
from feedmux.server.config import ServerConfig
from tests.integration.conftest import holds_for


def _config() -> ServerConfig:
    return ServerConfig(source="tests.integration.samplers:numbered",
                        bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0")


def test_half_open_connections_are_bounded_where_the_trainers_keep_reading() -> None:
    # Every trainer's libzmq reads whatever comes (credit bounds the data): both sockets.
    shell = SocketShell(_config(), stopping=False, shm=lambda config: None)
    try:
        bound = int(HALF_OPEN_TIMEOUT * 1000)
        assert shell.control.getsockopt(zmq.TCP_MAXRT) == bound
        assert shell.data.getsockopt(zmq.TCP_MAXRT) == bound
        # Its pings are what a vanished trainer's control connection leaves unacknowledged
        # in the kernel, so that the bound starts.
        assert shell.control.getsockopt(zmq.HEARTBEAT_IVL) == int(HEARTBEAT_INTERVAL * 1000)
    finally:
        shell.close()


def _control_nobody_reads(test: Connection) -> None:
    """A server's sockets whose control socket nobody reads: its endpoint goes to ``test``,
    which says when to close (60 s at most)."""
    shell = SocketShell(_config(), stopping=False, shm=lambda config: None)
    try:
        test.send(shell.control_address)
        test.poll(60)
    finally:
        shell.close()


def test_the_control_socket_outlives_a_trainer_that_left_while_it_was_not_read() -> None:
    # 4096 messages nobody reads, then the peer leaves. Before, the control socket's
    # receive queue held 1024: libzmq stopped reading the connection, saw the peer's
    # hang-up while stopped, and aborted the server at its next ping (libzmq 4.3.5,
    # "Assertion failed: !_io_error", issue 4364; once under load with 256 trainers).
    # In a child process: an abort must not take the test's process with it.
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    server = spawn.Process(target=_control_nobody_reads, args=(theirs,))
    server.start()
    theirs.close()
    try:
        assert ours.poll(30), "the server's sockets were not open within 30 s"
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        peer = context.socket(zmq.DEALER)
        peer.sndhwm = 0
        peer.connect(ours.recv())
        for _ in range(4096):
            peer.send(b"x")
        peer.close(linger=10_000)  # all of it in the kernel's buffers, then gone
        context.term()
        assert holds_for(server.is_alive, 3 * HEARTBEAT_INTERVAL), (
            f"the server died (exit code {server.exitcode})")
    finally:
        with contextlib.suppress(OSError):  # it died: nobody to tell
            ours.send("close")
        server.join(10)
        if server.is_alive():
            server.kill()
            server.join(10)
    assert server.exitcode == 0
