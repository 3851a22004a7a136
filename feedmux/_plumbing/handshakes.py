"""Refused CURVE handshakes, seen through libzmq's socket monitor, on both sides.

A CURVE peer with a wrong or unknown key is dropped inside libzmq: the
application sees no message, so without this a trainer only times out
("never answered") and the server logs nothing. :class:`HandshakeWatch` holds
monitor sockets for a set of sockets and turns their handshake-failure events
into sentences; :class:`HandshakeLogger` runs one in a thread of the server
and logs each refusal (rate-limited: anyone who can reach a port can cause
them). This module never reads or sends application messages, and owns
nothing but its monitor sockets and its thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from feedmux._ratelog import RateLimitedLog

__all__ = ["HandshakeLogger", "HandshakeWatch"]

log = logging.getLogger("feedmux.security")

_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def describe(event: dict[str, Any], where: str) -> str:
    """A sentence for one handshake-failure event of the socket at ``where``."""
    kind = event["event"]
    endpoint = event.get("endpoint", b"")
    peer = endpoint.decode("utf-8", "replace") if isinstance(endpoint, bytes) else str(endpoint)
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"CURVE authentication refused on {where} ({peer}): ZAP status "
                f"{event['value']} (a key that is not allowed)")
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return (f"CURVE handshake failed on {where} ({peer}): protocol error "
                f"{event['value']:#x} (a wrong server key, or a peer without CURVE)")
    return f"handshake failed on {where} ({peer}): error {event['value']}"


class HandshakeWatch:
    """Monitor sockets on ``sockets`` (named by ``names``); collects refused handshakes."""

    def __init__(self, sockets: list[zmq.Socket[Any]], names: list[str]) -> None:
        self.monitors = [socket.get_monitor_socket(_EVENTS) for socket in sockets]
        self.names = names
        self.seen: list[str] = []

    def poll(self) -> list[str]:
        """The refusals that arrived since the last call (without waiting)."""
        fresh = []
        for monitor, name in zip(self.monitors, self.names, strict=True):
            while monitor.poll(0):
                event: Any = recv_monitor_message(monitor)
                if event["event"] & _EVENTS:
                    fresh.append(describe(event, name))
        self.seen += fresh[: max(0, 16 - len(self.seen))]
        return fresh

    def explain(self, error: Exception) -> str:
        """``error``'s text, followed by the refusals seen so far (if there were any)."""
        self.poll()
        return "; ".join([str(error), *self.seen[:2]])

    def close(self) -> None:
        for monitor in self.monitors:
            monitor.close(linger=0)
        self.monitors = []


class HandshakeLogger:
    """A thread that logs every refused handshake on the server's public sockets.

    Start it after the sockets are bound and stop it before they close: the
    monitors belong to this thread from :meth:`start` to :meth:`stop`.
    """

    def __init__(self, sockets: list[zmq.Socket[Any]], names: list[str]) -> None:
        self.watch = HandshakeWatch(sockets, names)
        self.limited = RateLimitedLog(log)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feedmux-handshakes",
                                        daemon=True)

    def start(self) -> HandshakeLogger:
        self._thread.start()
        return self

    def _run(self) -> None:
        poller = zmq.Poller()
        for monitor in self.watch.monitors:
            poller.register(monitor, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(200):
                for line in self.watch.poll():
                    self.limited.log(logging.WARNING, "handshake", "%s", line)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.watch.close()
