"""A ranked trainer's acknowledgements of what it handed out, sent off the hot path.

This module owns the background thread that tells each server, every few
milliseconds, the last ``(epoch, position)`` this rank handed out, so that a
restarted rank (same rank, new process) continues right after it; repeated
once per heartbeat interval, it is also the rank's sign of life (a trainer in a
long step does not call its loader, but this thread runs; a killed one is silent). The thread
has its own ZeroMQ context and one DEALER per control endpoint (a ZeroMQ
socket must never be shared between threads), reads the loader's progress
without locking — the loader publishes the current message before resetting
nothing and the index after, so a torn read can only under-report, never claim
a sample not yet handed out — and sends only when the mark moved. It must
never touch the loader's sockets, block the trainer, or send per sample.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from feedmux._transport import HEARTBEAT_INTERVAL, make_socket, send_message
from feedmux.protocol import Ack

__all__ = ["ACK_INTERVAL", "HandOutAcks", "Progress"]

#: Seconds between two looks at what was handed out (an acknowledgement only if it moved).
ACK_INTERVAL = 0.005

#: ``() -> (link number, server id, tags, handed-out count)`` of the current message, or None.
Progress = Callable[[], "tuple[int, str, Any, int] | None"]


class HandOutAcks:
    """The acknowledging thread of one ranked loader (one per process: started after a fork).

    ``progress`` is read every :data:`ACK_INTERVAL` seconds; the thread ends
    when :meth:`stop` is called or ``progress`` reports the loader gone.
    """

    def __init__(self, control_addresses: Sequence[str], *, client_id: str, rank: int,
                 progress: Progress, security: Any = None) -> None:
        self.client_id = client_id
        self.rank = rank
        self._progress = progress
        self._addresses = list(control_addresses)
        self._security = security
        self._stop = threading.Event()
        self._pid = os.getpid()
        #: The last mark sent: (server id, epoch, position).
        self.sent: tuple[str, int, int] | None = None
        self._last_sent = -HEARTBEAT_INTERVAL
        self._thread = threading.Thread(target=self._run, name=f"feedmux-acks-{client_id}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        context: zmq.Context[Any] = zmq.Context()
        sockets = [make_socket(context, zmq.DEALER, hwm=100, max_message_bytes=1 << 20,
                               security=self._security) for _ in self._addresses]
        try:
            for socket, address in zip(sockets, self._addresses, strict=True):
                socket.connect(address)
            while not self._stop.wait(ACK_INTERVAL):
                if not self._send(sockets):
                    break
            self._send(sockets)  # the last word: what was handed out up to the close
        finally:
            for socket in sockets:
                socket.close(linger=200)
            context.term()

    def _send(self, sockets: list[Any]) -> bool:
        try:
            current = self._progress()
        except ReferenceError:
            return False
        now = time.monotonic()
        if current is None or current[3] <= 0:
            if now - self._last_sent >= HEARTBEAT_INTERVAL:
                self._last_sent = now
                for socket in sockets:  # nothing handed out yet: a sign of life only
                    self._offer(socket, Ack(client_id=self.client_id, rank=self.rank))
            return True
        link, server_id, tags, handed = current
        row = tags[min(handed, len(tags)) - 1]
        mark = (server_id, int(row[0]), int(row[1]))
        # The same mark again once per heartbeat interval: the server takes it as a sign of
        # life of this rank's holder, however long the trainer's own steps take.
        if mark == self.sent and now - self._last_sent < HEARTBEAT_INTERVAL:
            return True
        if self._offer(sockets[link], Ack(client_id=self.client_id, server_id=server_id,
                                          rank=self.rank, epoch=mark[1], position=mark[2])):
            self.sent, self._last_sent = mark, now
        return True

    @staticmethod
    def _offer(socket: Any, ack: Ack) -> bool:
        try:
            send_message(socket, ack, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False  # the server is away: the next look sends the newer mark
        return True

    def stop(self, timeout: float = 2.0) -> None:
        """Send the last mark and end the thread (a no-op in a forked child)."""
        if self._pid != os.getpid():
            return
        self._stop.set()
        self._thread.join(timeout)


def progress_of(loader: Any) -> Progress:
    """A :data:`Progress` reading ``loader`` through a weak reference (the thread must not
    keep the loader alive); raises ReferenceError once the loader is gone."""
    ref = weakref.ref(loader)

    def progress() -> tuple[int, str, Any, int] | None:
        target = ref()
        if target is None:
            raise ReferenceError("the loader is gone")
        current = target._current  # the message first ...
        if current is None:
            return None
        return (*current, target._index)  # ... then how far: a torn read under-reports

    return progress
