"""What a hostile or careless peer sends a live server, and how to watch its memory.

Shared by the live fuzz (:mod:`benchmarks.fuzz_live`), the soak
(:mod:`benchmarks.soak`) and the hardening tests. Every function here opens
its own short-lived ZeroMQ socket, bounds every wait, and closes it with
linger 0; none of them binds a socket. A socket that sends what a hostile
peer sends is closed only as :class:`HostileSockets` says, or libzmq may abort
this process. Memory figures come from ``/proc/PID/status`` (Linux only).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq

__all__ = [
    "MAX_RETIRED", "RETIRE_SECONDS", "HostileSockets",
    "ask", "flood", "peak_rss", "reset_peak", "rss",
]

#: Seconds a retired hostile socket whose connection is still up stays open after its
#: last send before it is closed (one whose connection ended is closed at once).
RETIRE_SECONDS = 2.0
#: Retired hostile sockets (each with its monitor) left open at most.
MAX_RETIRED = 256
#: The monitor events after which a hostile socket has no connection, nor will again.
_OVER = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


class HostileSockets:
    """DEALERs that send what a hostile peer would, each closed only once that is safe.

    libzmq 4.3.5 aborts the whole process (``Resource temporarily unavailable
    (src/session_base.cpp:233)``, an assertion in ``session_base_t::clean_pipes``)
    when a socket is closed while its connection is part-way through writing a
    multipart message, and that connection fails before the close is complete:
    the rest of the half-written message can no longer be read from the closing
    pipe. A hostile peer meets both conditions at once: the server drops its
    connection for a frame over the limit just as the peer, done with it,
    closes the socket. So these sockets never reconnect (a dropped connection
    would be dialled again and write the same messages again), and a retired
    one is closed once its monitor says its connection is over (nothing can
    fail any more), or after :data:`RETIRE_SECONDS` without a send while it is
    still up (the server read what it was sent: nothing is half-written).
    """

    def __init__(self) -> None:
        self.context: zmq.Context[Any] = zmq.Context()
        self._monitors: dict[zmq.Socket[Any], zmq.Socket[Any]] = {}
        self._retired: deque[tuple[float, zmq.Socket[Any]]] = deque()
        self._opened = 0

    def open(self, address: str, *, kind: int = zmq.DEALER, security: Any = None,
             hwm: int = 100) -> zmq.Socket[Any]:
        """A socket connected to ``address`` that gives up on the first dropped connection."""
        socket = self.context.socket(kind)
        socket.linger = 0
        socket.sndhwm = socket.rcvhwm = hwm
        socket.setsockopt(zmq.RECONNECT_IVL, -1)
        if security is not None:
            security.apply(socket)
        # pyzmq's get_monitor_socket names the endpoint by the file descriptor, which a
        # new socket reuses while the old one is still closing: a name of our own.
        self._opened += 1
        endpoint = f"inproc://hostile-monitor-{id(self)}-{self._opened}"
        socket.monitor(endpoint, _OVER)
        monitor = self._monitors[socket] = self.context.socket(zmq.PAIR)
        monitor.connect(endpoint)
        socket.connect(address)
        return socket

    def retire(self, socket: zmq.Socket[Any]) -> None:
        """Stop using ``socket``: it is closed once that is safe (see the class).

        Waits (at most :data:`RETIRE_SECONDS`) while :data:`MAX_RETIRED` are
        still open: a context holds 1023 sockets at most.
        """
        self._retired.append((time.monotonic(), socket))
        self.close_idle()
        while len(self._retired) > MAX_RETIRED:
            time.sleep(0.01)  # the poll interval of a wait bounded by RETIRE_SECONDS
            self.close_idle()

    def close_idle(self) -> None:
        """Close the retired sockets whose connection is over or idle long enough."""
        idle_since = time.monotonic() - RETIRE_SECONDS
        kept: deque[tuple[float, zmq.Socket[Any]]] = deque()
        for retired, socket in self._retired:
            if retired <= idle_since or self._monitors[socket].poll(0):
                self._close(socket)
            else:
                kept.append((retired, socket))
        self._retired = kept

    def close(self, sockets: Sequence[zmq.Socket[Any]] = ()) -> None:
        """Retire ``sockets`` too, close each once that is safe (within
        :data:`RETIRE_SECONDS`), then the context."""
        for socket in sockets:
            self.retire(socket)
        deadline = time.monotonic() + RETIRE_SECONDS
        while self._retired and time.monotonic() < deadline:
            time.sleep(0.02)  # the poll interval of a bounded wait on the monitors
            self.close_idle()
        for _, socket in self._retired:
            self._close(socket)
        self._retired.clear()
        self.context.term()

    def _close(self, socket: zmq.Socket[Any]) -> None:
        monitor = self._monitors.pop(socket)
        socket.close(linger=0)
        monitor.close(linger=0)


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes."""
    return _status(pid, "VmRSS:")


def peak_rss(pid: int) -> int:
    """The highest resident set size of ``pid`` since it started or :func:`reset_peak`."""
    return _status(pid, "VmHWM:")


def reset_peak(pid: int) -> None:
    """Reset the peak RSS of ``pid`` (a process this user owns) to its current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def flood(address: str, frames: list[Any], *, messages: int = 1, kind: int = zmq.DEALER,
          timeout: float = 5.0, security: Any = None) -> int:
    """Send ``messages`` copies of the multipart ``frames`` to ``address``; how many left.

    Stops early when the socket will not take more within ``timeout`` seconds
    (the server dropped the connection or stopped reading). The socket is a
    :class:`HostileSockets` one: it closes only after it has been idle a moment.
    """
    sockets = HostileSockets()
    socket = sockets.open(address, kind=kind, security=security, hwm=max(messages, 1000))
    sent = 0
    try:
        for _ in range(messages):
            if not socket.poll(int(timeout * 1000), zmq.POLLOUT):
                break
            try:
                socket.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:  # the connection went between the poll and the send
                break
            sent += 1
    finally:
        sockets.close([socket])
    return sent


def ask(address: str, frames: list[Any], *, timeout: float = 2.0,
        security: Any = None) -> list[bytes] | None:
    """Send ``frames`` from a DEALER and return the first reply's frames (None: no reply)."""
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    if security is not None:
        security.apply(socket)
    try:
        socket.connect(address)
        socket.send_multipart(frames)
        if not socket.poll(int(timeout * 1000)):
            return None
        return list(socket.recv_multipart())
    finally:
        socket.close(linger=0)
        context.term()
