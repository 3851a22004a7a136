"""What a hostile or careless peer sends a live server, and how to watch its memory.

Shared by the live fuzz (:mod:`benchmarks.fuzz_live`), the soak
(:mod:`benchmarks.soak`) and the hardening tests. Every function here opens
its own short-lived ZeroMQ socket, bounds every wait, and closes it with
linger 0; none of them binds a socket. Memory figures come from
``/proc/PID/status`` (Linux only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

__all__ = ["flood", "ask", "peak_rss", "reset_peak", "rss"]


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
    (the server dropped the connection or stopped reading).
    """
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(kind)
    socket.linger = 0
    if security is not None:
        security.apply(socket)
    sent = 0
    try:
        socket.connect(address)
        for _ in range(messages):
            if not socket.poll(int(timeout * 1000), zmq.POLLOUT):
                break
            socket.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            sent += 1
        # Give libzmq a bounded moment to write it out before the close drops it.
        socket.poll(200, zmq.POLLIN)
    finally:
        socket.close(linger=0)
        context.term()
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
