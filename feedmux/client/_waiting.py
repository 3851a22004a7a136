"""A loader's waits: one poller over its sockets, the control sockets served meanwhile.

This module owns the blocking part of a :class:`~feedmux.client.remote.RemoteLoader`:
the poller over its handshake monitors, data and control sockets, the wait for
data (at most a heartbeat interval at a time; past the loader's timeout it
raises, with what the CURVE handshakes explain), the bounded wait for the
servers' welcome, and whether the next receive waits before it asks the data
sockets (:attr:`LoaderWaits.first`). It never receives a data message and never
decides anything about the servers: control messages go to the loader's
``serve`` callback, and the link state decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from feedmux.client._link import ServerLinks
from feedmux.errors import TransportTimeoutError

__all__ = ["WAITED", "WELCOME_WAIT", "LoaderWaits"]

#: Seconds a wait for data took, past which the loader waits first next time: a poll
#: that returned at once (a message was there) says nothing of the next one.
WAITED = 1e-4

#: Seconds ``len()`` waits at most for the servers' welcome (the epoch size they declare).
WELCOME_WAIT = 5.0


class LoaderWaits:
    """The waits of one connected loader (``sockets``: every socket it polls; ``control``:
    its control sockets, served with ``serve(index)``; ``explain``: what a timeout says)."""

    def __init__(self, sockets: Sequence[Any], control: Sequence[Any], links: ServerLinks,
                 serve: Callable[[int], None],
                 explain: Callable[[TransportTimeoutError], str]) -> None:
        self.poller = zmq.Poller()
        for socket in sockets:
            self.poller.register(socket, zmq.POLLIN)
        self.control = control
        self.links = links
        self.serve = serve
        self.explain = explain
        #: Whether the last data message came only after a wait of over :data:`WAITED` (a
        #: trainer faster than its servers): the next receive then waits first (a poll
        #: returns at once for a message already there) instead of asking every data
        #: socket for nothing.
        self.first = False

    def for_data(self, waited_from: float, now: float) -> float:
        """Wait for data, having waited since ``waited_from``; the time after the wait."""
        try:
            wait = self.links.wait(waited_from, now)
        except TransportTimeoutError as error:
            raise TransportTimeoutError(self.explain(error)) from None
        self._poll(wait)
        return time.monotonic()

    def for_welcome(self) -> None:
        """Serve the control sockets until every server welcomed the loader, for at most
        the loader's timeout or :data:`WELCOME_WAIT` seconds."""
        links = self.links
        deadline = time.monotonic() + min(links.timeout or WELCOME_WAIT, WELCOME_WAIT)
        while not all(links.server_ids) and (left := deadline - time.monotonic()) > 0:
            self._poll(left)

    def _poll(self, seconds: float) -> None:
        events = dict(self.poller.poll(max(1, int(seconds * 1000))))
        for index, socket in enumerate(self.control):
            if socket in events:
                self.serve(index)
