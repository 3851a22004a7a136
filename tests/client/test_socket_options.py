"""A loader's sockets: ZMTP heartbeats only on control, where the receive queue cannot fill;
every one of them lets go of a half-open connection (``HALF_OPEN_TIMEOUT``)."""

from __future__ import annotations

import os

import pytest
import zmq

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT, UNLIMITED
from feedmux.client._link import ServerLinks
from feedmux.client._sockets import close_sockets, open_sockets


def beats(socket: zmq.Socket[object]) -> bool:
    return bool(socket.getsockopt(zmq.HEARTBEAT_IVL))


def opened(rank: int = -1) -> tuple[zmq.Context[object], list[zmq.Socket[object]],
                                     list[zmq.Socket[object]]]:
    # Nothing listens there: a connect is asynchronous, nothing is sent.
    links = ServerLinks(["tcp://127.0.0.1:9"], ["tcp://127.0.0.1:10"], client_id="t",
                        world_size=1, rank=rank, timeout=5.0, heartbeat_interval=1.0)
    context: zmq.Context[object] = zmq.Context()
    data, control = open_sockets(context, links, client_id="t", hwm=4,
                                 max_message_bytes=-1, security=None)
    return context, data, control


@pytest.mark.parametrize("rank", [-1, 0])
def test_heartbeats_go_only_on_sockets_whose_receive_queue_has_no_limit(rank: int) -> None:
    context, data, control = opened(rank)
    try:
        # Data sockets do not beat: a short outage must not drop a connection with what it
        # carries. Credit bounds the data, not the queue.
        assert [beats(socket) for socket in data] == [False]
        assert [socket.rcvhwm for socket in data] == [UNLIMITED]
        assert [beats(socket) for socket in control] == [True]
        for socket in (*data, *control):
            if beats(socket):  # a full queue stops libzmq reading: pings missed, an abort
                assert socket.rcvhwm == UNLIMITED
    finally:
        close_sockets(os.getpid(), context, [*data, *control])


@pytest.mark.parametrize("rank", [-1, 0])
def test_every_loader_socket_bounds_a_half_open_connection(rank: int) -> None:
    # What a loader sends (credit, acknowledgements, control) the server reads whatever its
    # queues hold, so the bound cuts off only a server that is gone.
    context, data, control = opened(rank)
    try:
        bound = int(HALF_OPEN_TIMEOUT * 1000)
        assert [socket.getsockopt(zmq.TCP_MAXRT) for socket in (*data, *control)] == [bound] * 2
    finally:
        close_sockets(os.getpid(), context, [*data, *control])
