"""The outbox: the only code that sends on the server's data ROUTER.

:class:`Outbox` owns the data socket's sends and the one wait of the data
path. Every data message — to a free trainer, a rank's holder, a consumer
group's member (each after its envelope), a rank's successor (its
predecessor's rest), a re-sent message of a lost trainer, a heartbeat or end of
stream on the data socket — leaves through :meth:`Outbox.send`, a
non-blocking addressed send with one error policy for a failed one:

- ``zmq.Again``: that trainer's queue is full (its high-water mark): :data:`FULL`,
  try the next trainer or wait;
- ``EHOSTUNREACH`` (``ROUTER_MANDATORY``): its data connection is not up yet,
  or gone: :data:`GONE`; who decides that it is gone for good is the caller
  (the control heartbeats, or the data socket's link, which finds a lost trainer);
- anything else (the socket closed, the context terminated) is raised.

While nobody can take a message the sender calls :meth:`Outbox.wait`: it serves
the control socket meanwhile (and the credit and acknowledgements arriving on
the data socket), and every second spent in it counts in one
``blocked_seconds``. The outbox never decides who gets a message
(the dealer, the ledger and the control core do) and keeps no message once it
left.
"""

from __future__ import annotations

import enum
import errno
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

__all__ = ["FULL", "GONE", "SENT", "Frames", "Outbox", "Sent", "Wait"]

#: One data message as it is sent: its frames (bytes, memoryviews, zmq Frames).
Frames = Sequence[Any]


class Sent(enum.Enum):
    """What became of one addressed send."""

    SENT = "sent"
    FULL = "its queue is full"
    GONE = "not connected (yet, or any more)"


SENT, FULL, GONE = Sent.SENT, Sent.FULL, Sent.GONE


class Wait(enum.Enum):
    """What a sender that could not send waits for (see :meth:`Outbox.wait`)."""

    #: Room at any trainer would do: until the data socket is writable, at most 0.1 s.
    ROOM = enum.auto()
    #: Room at one trainer: a ROUTER's writability says that *some* peer has room, so
    #: polling for it would spin; a short look at the control socket instead (1 ms).
    BRIEF = enum.auto()
    #: Credit or acknowledgements: until the data socket is readable.
    CREDIT = enum.auto()
    #: Nobody to send to: the control socket alone, at most 0.1 s.
    IDLE = enum.auto()


#: How long each wait lasts at most (milliseconds), and what it watches on the data socket.
_WAITS = {Wait.ROOM: (100, zmq.POLLOUT), Wait.BRIEF: (1, 0), Wait.CREDIT: (100, zmq.POLLIN),
          Wait.IDLE: (100, 0)}


class Outbox:
    """The data ROUTER's sends and the data path's one back-pressure wait.

    ``control`` is the control socket, ``serve_control()`` answers what waits
    on it; ``serve_data()``, when given, takes in what arrives on the data
    socket (the trainers' credit and acknowledgements, and what stray peers send
    there, dropped).
    """

    def __init__(self, socket: Any, control: Any, serve_control: Callable[[], object],
                 serve_data: Callable[[], object] | None = None) -> None:
        self.socket = socket
        self.control = control
        self.serve_control = serve_control
        self.serve_data = serve_data
        #: Seconds senders waited because no trainer could take a message.
        self.blocked_seconds = 0.0
        #: Bytes of data messages that left (counted by :meth:`count`).
        self.bytes_sent = 0
        #: Messages on the data socket that are no feedmux message (a scanner, a
        #: misconfigured client, a fuzzer): read with the trainers' credit and
        #: acknowledgements (``serve_data``), dropped and counted here. Left unread they
        #: would not only be held: libzmq keeps a departed peer's pipe, with every message
        #: it queued, until the socket has read them (measured: about 0.5 KiB a message,
        #: +300 MiB in 45 s of churning peers).
        self.stray_dropped = 0
        self._poller = zmq.Poller()
        self._poller.register(control, zmq.POLLIN)

    def send(self, target: bytes, parts: Sequence[Any]) -> Sent:
        """One non-blocking send of ``parts`` to ``target`` (see the module's policy)."""
        try:
            self.socket.send_multipart([target, *parts], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return FULL
        except zmq.ZMQError as error:
            if error.errno != errno.EHOSTUNREACH:
                raise
            return GONE
        return SENT

    def deliver(self, attempt: Callable[[], Wait | None], halted: Callable[[], bool]) -> bool:
        """The data path's one back-pressure loop: ``attempt()`` until it sent (it returns
        None), waiting between tries for what it names; False once ``halted()``."""
        while not halted():
            what = attempt()
            if what is None:
                return True
            self.wait(what)
        return False

    def count_bytes(self, nbytes: int) -> None:
        """``nbytes`` left in data messages (for the ``bytes_sent`` statistic)."""
        self.bytes_sent += nbytes

    def count(self, frames: Sequence[Any]) -> None:
        """``frames`` left as one data message (for the ``bytes_sent`` statistic)."""
        self.bytes_sent += sum(_nbytes(frame) for frame in frames)

    def wait(self, what: Wait) -> None:
        """Wait for ``what`` (bounded by its timeout), serving control meanwhile; the
        time counts as blocked."""
        started = time.perf_counter()
        poller = self._poller
        timeout, data_events = _WAITS[what]
        if self.serve_data is not None:  # credit and acknowledgements are read in any wait
            data_events |= zmq.POLLIN
        if data_events:
            poller.register(self.socket, data_events)
        try:
            events = dict(poller.poll(timeout))
        finally:
            if data_events:
                poller.unregister(self.socket)
        if self.control in events:
            self.serve_control()
        if self.serve_data is not None and events.get(self.socket, 0) & zmq.POLLIN:
            self.serve_data()
        self.blocked_seconds += time.perf_counter() - started


def _nbytes(frame: Any) -> int:
    """Bytes of one frame (bytes, memoryviews of any item size, zmq Frames)."""
    size = getattr(frame, "nbytes", None)
    return int(size) if size is not None else len(frame)
