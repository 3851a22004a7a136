"""The plain server's own half-open bound (:mod:`feedmux._plumbing.halfopen`), on loopback.

What a vanished host leaves cannot be made on one host without root (the two-host test,
``tests/multihost/test_half_open.py``, makes it); here: the sweep finds the connections
accepted at the data endpoint and nothing else of the process, a live peer owes nothing
whether idle or with its window closed, and aborting a connection (the peer's silence
stood in for) makes libzmq drop it, frees its descriptor, and leaves the trainer to
reconnect and receive again.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from feedmux._plumbing import halfopen
from feedmux._plumbing.halfopen import HalfOpenSweep, unanswered
from feedmux._plumbing.sockets import bind, make_socket, readable
from tests.integration.conftest import holds_for, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="TCP_INFO and /proc: Linux")


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def plain_router(context: zmq.Context[Any]) -> tuple[zmq.Socket[Any], str]:
    """A plain server's data socket (as ``_data_socket`` makes it), bound on loopback."""
    router = make_socket(context, zmq.ROUTER, hwm=4, heartbeats=False, half_open_bound=False)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    return router, bind(router, "tcp://127.0.0.1:0", "data")


def trainer(context: zmq.Context[Any], endpoint: str, name: bytes) -> zmq.Socket[Any]:
    dealer = make_socket(context, zmq.DEALER, hwm=4, heartbeats=False)
    dealer.setsockopt(zmq.ROUTING_ID, name)
    dealer.connect(endpoint)
    return dealer


def delivered(router: zmq.Socket[Any], dealer: zmq.Socket[Any], name: bytes) -> bool:
    """Whether a message sent now to ``name`` arrives at ``dealer`` (within a second)."""
    try:
        router.send_multipart([name, b"x"], flags=zmq.NOBLOCK)
    except zmq.ZMQError:
        return False  # not connected (yet, or any more)
    return bool(dealer.poll(1000)) and dealer.recv() == b"x"


def test_the_sweep_finds_the_connections_accepted_at_the_endpoint_only(
    context: zmq.Context[Any]
) -> None:
    router, endpoint = plain_router(context)
    other, _ = plain_router(context)
    dealers = [trainer(context, endpoint, name) for name in (b"t1", b"t2")]
    stranger = trainer(context, bind(other, "tcp://127.0.0.1:0", "other"), b"t3")
    for dealer, name in zip(dealers, (b"t1", b"t2"), strict=True):
        wait_until(lambda d=dealer, n=name: delivered(router, d, n), 10, "a connection")
    assert delivered(other, stranger, b"t3")
    sweep = HalfOpenSweep(endpoint)
    # The two the router accepted: not the trainers' ends (in this process too), not the
    # listening socket, not the other router's.
    assert len(peer_ports(sweep)) == 2
    assert len(peer_ports(sweep)) == 2  # known by their inodes, found again
    assert sweep.sweep(time.monotonic()) == 0  # live and answering: nothing to abort


def test_a_live_peer_owes_nothing_idle_or_with_its_window_closed() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader = socket.create_connection(listener.getsockname())
        sender, _ = listener.accept()
        with reader, sender:
            assert unanswered(sender) == 0.0  # idle
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sender.setblocking(False)
            with pytest.raises(BlockingIOError):
                while True:  # until the reader's window and the sender's buffer are full
                    sender.send(b"x" * 65536)
            # The reader reads nothing: the sender probes its closed window, backing off
            # (0.2, 0.6, 1.4, 3 s ... after the window closed), and each probe is answered.
            assert holds_for(lambda: unanswered(sender) == 0.0, 4.0)


def test_an_aborted_connection_is_dropped_and_the_trainer_reconnects(
    context: zmq.Context[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    router, endpoint = plain_router(context)
    sweep = HalfOpenSweep(endpoint, bound=15.0)
    gone = trainer(context, endpoint, b"gone")
    wait_until(lambda: delivered(router, gone, b"gone"), 10, "the first connection")
    (gone_port,) = peer_ports(sweep)
    staying = trainer(context, endpoint, b"stays")
    wait_until(lambda: delivered(router, staying, b"stays"), 10, "the second connection")
    # The peer's silence, which loopback cannot make, stood in for: the first trainer's.
    monkeypatch.setattr(halfopen, "unanswered", lambda connection: 99.0 if (
        connection.getpeername()[1] == gone_port) else 0.0)
    assert sweep.sweep(time.monotonic()) == 1 and sweep.aborted == 1
    # libzmq dropped the connection and closed its descriptor; the trainer, reset, connects
    # again (a new connection, the same routing id) and receives; the other never noticed.
    # (The router is used meanwhile, as a server uses it: it takes in the old connection's
    # end there, and a trainer that connected before that under the same routing id would
    # stay unroutable.)
    wait_until(lambda: readable(router) >= 0 and gone_port not in peer_ports(sweep), 5,
               "libzmq to drop it")
    wait_until(lambda: delivered(router, gone, b"gone"), 10, "the trainer to reconnect")
    assert delivered(router, staying, b"stays")
    assert len(peer_ports(sweep)) == 2


def peer_ports(sweep: HalfOpenSweep) -> list[int]:
    """The peers' ports of the connections the sweep finds."""
    found = list(sweep._connections())
    try:
        return [connection.getpeername()[1] for connection in found]
    finally:
        for connection in found:
            connection.close()
