"""How a loader's sockets are made and closed, in the process that uses them.

This module owns the options of a trainer's sockets (data DEALERs without ZMTP
heartbeats or a receive limit, since credit bounds what comes, a rank's named by
the client id; control DEALERs with heartbeats, named
"<instance>/control/<client id>" on every connection: one loader keeps its name
across reconnects, and a second loader given the same client id is another peer
to the server, which refuses it) and their closing, which a forked child never
does to its parent's sockets. It must never read or
decide anything: the loader and its link state do.
"""

from __future__ import annotations

import os
from typing import Any

import zmq

from feedmux._plumbing.curve import ClientCurve
from feedmux._plumbing.sockets import CONTROL_FRAME_BYTES, UNLIMITED, make_socket
from feedmux.client._link import ServerLinks

__all__ = ["close_sockets", "open_sockets"]


def open_sockets(
    context: zmq.Context[Any],
    links: ServerLinks,
    *,
    client_id: str,
    hwm: int,
    max_message_bytes: int,
    security: ClientCurve | None,
    instance: str = "",
) -> tuple[list[Any], list[Any]]:
    """Connected sockets: the data DEALERs and the control DEALERs, one of each per server.

    A rank's data DEALERs are named by the client id: its holder gets the
    rank's messages (its hello carries the same id).
    """
    # No ZMTP heartbeats: a link down for a few seconds must not drop the connection with
    # what is queued on it (the server would deal the rest of it to the others while this
    # trainer hands it out: repeats). The server finds a dead trainer by its closed
    # connection, a frozen or vanished one by its silence (the acknowledging thread's
    # signs of life). No receive limit either: credit bounds the data, and the server
    # what it sends besides.
    targets = [
        make_socket(context, zmq.DEALER, hwm=hwm + 16, rcvhwm=UNLIMITED,
                    max_message_bytes=max_message_bytes, heartbeats=False, security=security)
        for _ in links.links
    ]
    if links.rank >= 0:
        for socket in targets:
            socket.setsockopt(zmq.ROUTING_ID, client_id.encode())
    control = [
        make_socket(context, zmq.DEALER, hwm=100, rcvhwm=UNLIMITED,
                    max_message_bytes=CONTROL_FRAME_BYTES, security=security)
        for _ in links.links
    ]
    for socket in control:
        # The same identity on every connection: after a link was down long enough for the
        # ZMTP heartbeats to drop the connection, the reconnected one is still this trainer
        # to the server (a fresh random identity was a stranger, whose rank stayed orphaned).
        # (Cut to ZeroMQ's 255 bytes: the server reads the id from the messages, not this.)
        socket.setsockopt(zmq.ROUTING_ID, f"{instance}/control/{client_id}".encode()[:255])
    for target, control_socket, link in zip(targets, control, links.links, strict=True):
        target.connect(link.data_address)
        control_socket.connect(link.control_address)
    return targets, control


def close_sockets(pid: int, context: zmq.Context[Any], sockets: list[Any]) -> None:
    if pid != os.getpid():
        return  # a forked child must not touch its parent's sockets
    for socket in sockets:
        socket.close(linger=0)
    context.term()
