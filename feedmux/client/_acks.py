"""A trainer's acknowledgements of what it handed out, sent off the hot path.

This module owns the background thread that tells each server, within
:data:`NEW_MESSAGE_INTERVAL` of the loader moving on to a new message (at once
when half its credit waits for it; within a long message at least every
:data:`MARK_INTERVAL`), the last ``(epoch, position)`` this trainer handed out:
a ranked
trainer, so that a restarted rank (same rank, new process) continues right
after it; a free trainer, with the sequence number of the message it
is in, so that only the rest of that message goes to the others if it dies,
and the messages it handed out whole that the loader has not acknowledged yet
(it acknowledges several at once; these are the rest).
It is repeated
once per heartbeat interval: it is also the trainer's sign of life (a trainer in a
long step does not call its loader, but this thread runs; a killed one is silent), which
keeps a rank's holder its rank and a free trainer its messages. The thread
has its own ZeroMQ context and one DEALER per control endpoint (a ZeroMQ
socket must never be shared between threads), reads the loader's progress
without locking — the loader publishes the current message before resetting
nothing and the index after, so a torn read can only under-report, never claim
a sample not yet handed out — and sends only when the mark moved, and then
coalesced (one mark covers every message before it: a trainer of small samples
reading hundreds of messages a second sends a few dozen marks, not one a
message; 64 ranks each sending one every 5 ms were 12,800 control messages a
second into one server; see :class:`AckPace`). It must
never touch the loader's sockets, block the trainer, or send per sample.

It also owns :class:`SeenPositions`, a loader's memory of what it
took, so that a sample dealt to it twice is handed out once.
"""

from __future__ import annotations

import bisect
import logging
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from feedmux._plumbing.sockets import (
    CONTROL_FRAME_BYTES,
    HEARTBEAT_INTERVAL,
    make_socket,
    send_message,
)
from feedmux.client._data import take_all
from feedmux.client._handout import HandOut
from feedmux.client._moves import reconnect
from feedmux.protocol import Ack, position_runs, take_rows

log = logging.getLogger("feedmux.client")

__all__ = ["ACK_INTERVAL", "CONNECT_WAIT", "NEW_MESSAGE_INTERVAL", "AckPace", "HandOutAcks",
           "Left", "Progress", "SeenPositions", "left_of", "progress_of"]

#: Seconds between two looks at what was handed out, after a look that sent something.
ACK_INTERVAL = 0.005
#: Most seconds the thread waits for its connections at its start (a server that is away).
CONNECT_WAIT = 10.0
#: Looks that send nothing double the wait up to this (an idle loader costs 20 wake-ups a
#: second, not 200: sixteen loaders in one process polling every 5 ms starved it).
MAX_ACK_INTERVAL = 0.05
#: A mark that moved within the message it was in goes out at least this often.
MARK_INTERVAL = 0.1
#: A mark in a new message goes out once this long passed since the last mark (the server
#: then knows every message before it handed out whole, and frees their credit), or at
#: once when half the loader's credit waits in messages handed out whole. One mark a
#: message cost a trainer of small samples a tenth of its CPU (hundreds of marks a second);
#: a SIGKILLed trainer's unacknowledged reading is still bounded as before (see AckPace).
NEW_MESSAGE_INTERVAL = 0.02

#: ``() -> (link number, server id, tags, sequence number, handed-out count)`` of the
#: current message (sequence number 0: a rank's, which wants no acknowledgement), or None.
Progress = Callable[[], "tuple[int, str, Any, int, int] | None"]
#: ``() -> {link number: (server id, epoch, position, sequence number)}``: the last sample
#: handed out of the last message the loader left on each link (``HandOut.left``).
Left = Callable[[], "Mapping[int, tuple[str, int, int, int]]"]


class AckPace:
    """When the acknowledging thread looks next, and whether a mark that moved is due.

    Pure: the thread tells it what each look did and asks. The wait is
    :data:`ACK_INTERVAL` after a look that found the loader moved on (or sent
    something), doubled after each look that did not, up to
    :data:`MAX_ACK_INTERVAL`. A loader that takes a new message only every so
    often (a training batch of images every 100 ms) is looked at after half that
    time instead (at most :data:`MAX_ACK_INTERVAL`): the waits of 5, 10, 20 and
    40 ms after each mark found nothing new, and each wake-up of the thread cost
    the trainer about as much as its hand-out of the batch itself. A mark in a
    new message is due once :data:`NEW_MESSAGE_INTERVAL` passed since the last
    mark, or at once when
    ``urgent`` messages handed out whole wait for their acknowledgement (half
    the loader's credit: the server must not run out of it); one that moved
    within the last message acknowledged, once :data:`MARK_INTERVAL` passed.
    What a SIGKILLed loader handed out and never acknowledged (a rank's
    successor gets it again; a free trainer's is dealt to the others) is thus
    at most the rest of one message or ``MARK_INTERVAL + MAX_ACK_INTERVAL`` of
    its reading.

    Examples
    --------
    >>> pace = AckPace(urgent=4)
    >>> pace.looked(sent=False); pace.looked(sent=False); pace.wait
    0.02
    >>> pace.looked(sent=True); pace.wait
    0.005
    >>> for now in (1.0, 1.1, 1.2, 1.3): pace.new_message(now)  # a message every 100 ms
    >>> pace.looked(sent=True); round(pace.wait, 3)
    0.05
    >>> message = object()
    >>> pace.mark_due(message, now=1.0, last_sent=0.99)  # a new message, 10 ms after
    False
    >>> pace.mark_due(message, now=1.0, last_sent=0.98), pace.mark_due(message, 1.0, 0.99, 4)
    (True, True)
    >>> pace.marked(message)
    >>> pace.mark_due(message, now=1.05, last_sent=1.0), pace.mark_due(message, 1.1, 1.0)
    (False, True)
    """

    __slots__ = ("_last_new", "_message", "gap", "urgent", "wait")

    def __init__(self, urgent: int = 1) -> None:
        self.wait = ACK_INTERVAL
        self.urgent = max(1, urgent)
        self._message: object = None
        #: Seconds between the loader's new messages, as the looks saw them (a running
        #: mean; 0: not known yet), and when the last one was seen.
        self.gap = 0.0
        self._last_new = -1.0

    def looked(self, sent: bool) -> None:
        if sent:  # soon again, unless the loader's next message is far off
            self.wait = min(MAX_ACK_INTERVAL, max(ACK_INTERVAL, self.gap / 2))
        else:
            self.wait = min(MAX_ACK_INTERVAL, 2 * self.wait)

    def new_message(self, now: float) -> None:
        """A look found the loader on a message it was not on at the look before."""
        if self._last_new >= 0:
            gap = now - self._last_new
            self.gap = gap if self.gap <= 0 else 0.75 * self.gap + 0.25 * gap
        self._last_new = now

    def mark_due(self, message: object, now: float, last_sent: float, waiting: int = 0) -> bool:
        """Whether a mark in ``message`` is due (``waiting``: messages handed out whole and
        not acknowledged)."""
        if message is not self._message:
            return waiting >= self.urgent or now - last_sent >= NEW_MESSAGE_INTERVAL
        return now - last_sent >= MARK_INTERVAL

    def marked(self, message: object) -> None:
        """A mark in ``message`` (the loader's current tags: a new message, a new array)
        went out."""
        self._message = message


class HandOutAcks:
    """The acknowledging thread of one ranked loader (one per process: started after a fork).

    ``progress`` is read every :data:`ACK_INTERVAL` to :data:`MAX_ACK_INTERVAL`
    seconds, as :class:`AckPace` says; the thread ends
    when :meth:`stop` is called or ``progress`` reports the loader gone.
    ``left`` (read just before ``progress``) says how far the loader got in the
    last message it left on each link: each server is marked on its own link, so
    a loader over several servers that moved to another server's message between
    two looks still tells the one it left (a rank's messages are released by
    its marks alone: a server never told stops dealing to the rank once the
    rank's credit is used up).
    ``finished`` (the loader's, per link): the (server id, sequence
    number) of messages handed out whole and not acknowledged yet; the thread
    takes them and acknowledges them (an ``Ack`` with no position).
    """

    def __init__(self, control_addresses: Sequence[str], *, client_id: str, rank: int,
                 progress: Progress, security: Any = None,
                 finished: Sequence[deque[tuple[str, int]]] = (), credits: int = 2,
                 left: Left | None = None) -> None:
        self.client_id = client_id
        self.rank = rank
        self._progress = progress
        self._left: Left = left or dict
        self._finished = list(finished)
        self._addresses = list(control_addresses)
        self._security = security
        self._stop = threading.Event()
        self._pid = os.getpid()
        #: Control endpoints that moved (a restarted server elsewhere): (link number, address).
        self._moves: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        #: Per link: the last mark sent there, (server id, epoch, position), and when.
        self.sent: list[tuple[str, int, int] | None] = [None] * len(self._addresses)
        self._last_sent = [-HEARTBEAT_INTERVAL] * len(self._addresses)
        #: Per link: set once this thread's connection to that server is up (or it gave
        #: up waiting), see :meth:`wait_connected`.
        self.connected = [threading.Event() for _ in self._addresses]
        self._awaited: set[int] = set()  # links whose first message waited (the loader's)
        self._pace = AckPace(urgent=credits // 2)
        #: The loader's last progress seen, and whether the last look found it moved (which
        #: keeps the pace up).
        self._seen: tuple[Any, int] | None = None
        self._moved = False
        #: Acknowledgements sent (the pace follows whether a look sent any).
        self.sends = 0
        self._thread = threading.Thread(target=self._run, name=f"feedmux-acks-{client_id}",
                                        daemon=True)
        self._thread.start()

    def current(self, link: int, server_id: str, tags: Any,
                seq: int) -> tuple[int, str, Any, int]:
        """The loader's next current message (what :func:`progress_of` reads), once
        acknowledgements can reach server ``link``.

        The first time for each link it waits (at most :data:`CONNECT_WAIT` s) for
        this thread's connection: a mark queued on a connection still being set up
        dies with a trainer killed meanwhile, and the server then thinks nothing
        was handed out (a restarted rank got its predecessor's samples again from
        the start of the epoch).
        """
        if link not in self._awaited:
            self._awaited.add(link)
            self.connected[link].wait(CONNECT_WAIT)
        return link, server_id, tags, seq

    def told(self, mark: tuple[str, int, int]) -> bool:
        """Whether ``mark`` (server id, epoch, position) is the last mark sent on its
        server's link (queued on the socket: the thread's close flushes it)."""
        return mark in list(self.sent)

    def _run(self) -> None:
        context: zmq.Context[Any] = zmq.Context()
        # The server answers nothing here: what a server sends waits unread, bounded.
        sockets = [make_socket(context, zmq.DEALER, hwm=100, max_message_bytes=CONTROL_FRAME_BYTES,
                               security=self._security) for _ in self._addresses]
        handshakes = _Handshakes(sockets, self.connected)
        try:
            for socket, address in zip(sockets, self._addresses, strict=True):
                socket.connect(address)
            handshakes.check()
            while not self._stop.wait(self._pace.wait):
                handshakes.check()
                self._follow_moves(sockets)
                sends, self._moved = self.sends, False
                if not self._send(sockets):
                    break
                self._pace.looked(self.sends > sends or self._moved)
            self._send(sockets, final=True)  # the last word: what was handed out up to the close
        finally:
            handshakes.close()
            for socket in sockets:
                socket.close(linger=200)
            context.term()

    def move(self, link: int, address: str) -> None:
        """The server of link ``link`` now listens on control endpoint ``address``."""
        self._moves.put((link, address))

    def _follow_moves(self, sockets: list[Any]) -> None:
        while not self._moves.empty():
            link, address = self._moves.get()
            if address != self._addresses[link]:
                reconnect(sockets[link], self._addresses[link], address)
                self._addresses[link] = address

    def _send(self, sockets: list[Any], final: bool = False) -> bool:
        try:
            # What the loader left first: a message is left after its hand-outs were
            # recorded, and reading the progress records them (the audit log) before any
            # mark goes out.
            left = dict(self._left())
            current = self._progress()
        except ReferenceError:
            return False
        now = time.monotonic()
        marking = None if current is None or current[4] <= 0 else current[0]
        self._mark_left(sockets, left, marking, now, final)
        if current is None or current[4] <= 0:
            self._acknowledge_finished(sockets)
            self._signs_of_life(sockets, now)  # nothing handed out yet
            return True
        link, server_id, tags, seq, handed = current
        self._signs_of_life(sockets, now, marking=link)
        if self._seen is None or self._seen[0] is not tags or self._seen[1] != handed:
            if self._seen is None or self._seen[0] is not tags:
                self._pace.new_message(now)
            self._seen, self._moved = (tags, handed), True
        row = tags[min(handed, len(tags)) - 1]
        mark = (server_id, int(row[0]), int(row[1]))
        # The same mark again once per heartbeat interval: the server takes it as a sign of
        # life of this rank's holder, or of this free trainer, however long the
        # trainer's own steps take.
        waiting = sum(len(finished) for finished in self._finished)
        sent, last_sent = self.sent[link], self._last_sent[link]
        due = not (mark == sent and now - last_sent < HEARTBEAT_INTERVAL) and (
            mark == sent or final or self._pace.mark_due(tags, now, last_sent, waiting))
        # (a mark that moved within the message last acknowledged goes soon, with more)
        if not due:
            # The messages handed out whole wait for the next mark, unless half the credit
            # waits or the loader stopped (it waits for data: the server needs the credit).
            if waiting and (final or waiting >= self._pace.urgent or not self._moved):
                self._acknowledge_finished(sockets)
            return True
        # A mark in message ``seq`` acknowledges the messages before it too (the server's
        # acknowledge_before): those waiting here need no acknowledgement of their own.
        self._acknowledge_finished(sockets, (link, server_id, seq) if seq else None)
        if self._offer(sockets[link], Ack(seqs=(seq,) if seq else (), client_id=self.client_id,
                                          server_id=server_id, rank=self.rank, epoch=mark[1],
                                          position=mark[2])):
            self.sent[link], self._last_sent[link] = mark, now
            self._pace.marked(tags)
        return True

    def _signs_of_life(self, sockets: list[Any], now: float, marking: int | None = None) -> None:
        """A sign of life (an ``Ack`` with no mark) on each link but ``marking`` (the
        current message's, whose mark is repeated instead) that sent nothing for a
        heartbeat interval: a loader over several servers in a long step on one
        server's message is alive for the others too (a free trainer silent
        for ``SILENCE_GRACE`` counts as lost there, and what it holds is dealt again to
        the others; a rank's holder silent for a few seconds is said lost)."""
        for link, socket in enumerate(sockets):
            if link != marking and now - self._last_sent[link] >= HEARTBEAT_INTERVAL:
                self._last_sent[link] = now
                self._offer(socket, Ack(client_id=self.client_id, rank=self.rank))

    def _mark_left(self, sockets: list[Any], left: dict[int, tuple[str, int, int, int]],
                   marking: int | None, now: float, final: bool) -> None:
        """Mark on each link how far the loader got in the message it left there, if that
        server was not told yet (coalesced as a new message's mark is; at once in the
        last word). The link of a current message with samples handed out is marked
        from that message, which comes after."""
        for link, (server_id, epoch, position, seq) in left.items():
            sent = self.sent[link]
            if seq or link == marking or link >= len(sockets) or (
                    sent is not None and sent[0] == server_id and sent[1:] >= (epoch, position)):
                continue  # (a message with a sequence number, left whole, is acknowledged
                # by that number: it waits in ``finished``)
            if not final and now - self._last_sent[link] < NEW_MESSAGE_INTERVAL:
                continue  # the next look sends it, with whatever the loader left since
            if self._offer(sockets[link], Ack(client_id=self.client_id, server_id=server_id,
                                              rank=self.rank, epoch=epoch, position=position)):
                self.sent[link], self._last_sent[link] = (server_id, epoch, position), now

    def _acknowledge_finished(self, sockets: list[Any],
                              covered: tuple[int, str, int] | None = None) -> None:
        """Acknowledge the messages handed out whole that the loader left waiting, but those
        a mark about to go in message ``covered`` (link, server id, sequence number)
        acknowledges: the ones before it on its link, from its server."""
        for link, (socket, finished) in enumerate(zip(sockets, self._finished, strict=False)):
            by_server: dict[str, list[int]] = {}
            for server_id, seq in take_all(finished):
                if covered is not None and covered[0] == link and covered[1] == server_id \
                        and seq < covered[2]:
                    continue
                by_server.setdefault(server_id, []).append(seq)
            for server_id, seqs in by_server.items():
                # Dropped if the server is away: it deals them again (as with a lost ack).
                self._offer(socket, Ack(seqs=seqs, client_id=self.client_id,
                                        server_id=server_id, rank=self.rank))

    def _offer(self, socket: Any, ack: Ack) -> bool:
        try:
            send_message(socket, ack, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False  # the server is away: the next look sends the newer mark
        self.sends += 1
        return True

    def stop(self, timeout: float = 2.0) -> None:
        """Send the last mark and end the thread (a no-op in a forked child)."""
        if self._pid != os.getpid():
            return
        self._stop.set()
        self._thread.join(timeout)


class _Handshakes:
    """Sets each link's event once its socket's handshake succeeded, or all of them
    :data:`CONNECT_WAIT` seconds after the start (a server away is no reason to hold
    the loader); looked at without blocking, so that an absent server never delays
    the marks to the others. Its monitors are closed once every link is settled."""

    def __init__(self, sockets: Sequence[Any], connected: Sequence[threading.Event]) -> None:
        self.sockets = list(sockets)
        self.connected = list(connected)
        self.deadline = time.monotonic() + CONNECT_WAIT
        # Made before the sockets connect, so that no event is missed.
        self.waiting: dict[int, Any] = {
            link: socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            for link, socket in enumerate(self.sockets)}

    def check(self) -> None:
        for link, monitor in list(self.waiting.items()):
            while link in self.waiting and monitor.poll(0):
                if recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._settle(link)
        if self.waiting and time.monotonic() > self.deadline:
            self.close()

    def _settle(self, link: int) -> None:
        monitor = self.waiting.pop(link)
        self.sockets[link].disable_monitor()
        monitor.close(linger=0)
        self.connected[link].set()

    def close(self) -> None:
        for link in list(self.waiting):
            self._settle(link)


def progress_of(out: HandOut) -> Progress:
    """A :data:`Progress` reading a loader's :class:`HandOut` through a weak reference (the
    thread must not keep the loader alive); raises ReferenceError once it is gone."""
    ref = weakref.ref(out)

    def progress() -> tuple[int, str, Any, int, int] | None:
        target = ref()
        if target is None:
            raise ReferenceError("the loader is gone")
        current = target.current  # the message first ...
        if current is None:
            return None
        link, server_id, tags, seq = current
        return link, server_id, tags, seq, target.index  # ... then how far: a torn read
        # under-reports

    return progress


def left_of(out: HandOut) -> Left:
    """A :data:`Left` reading a loader's :class:`HandOut` through a weak reference; raises
    ReferenceError once it is gone."""
    ref = weakref.ref(out)

    def left() -> Mapping[int, tuple[str, int, int, int]]:
        target = ref()
        if target is None:
            raise ReferenceError("the loader is gone")
        return target.left.copy()  # (one call: the loader may add a link meanwhile)

    return left


class SeenPositions:
    """The positions a loader took, per (server id, epoch): the last two epochs of each server.

    Kept as ranges (a server deals in position order, so they merge as they
    come: a few ranges per epoch, not a set of every position), checked once per
    data message, never per sample.

    Examples
    --------
    >>> import numpy as np
    >>> seen = SeenPositions()
    >>> seen.fresh("s", np.array([[1, 0], [1, 1]])) is None  # all new
    True
    >>> seen.fresh("s", np.array([[1, 1], [1, 2]]))  # row 0 came before
    [1]
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], _Ranges] = {}

    def fresh(self, server_id: str, tags: Any) -> list[int] | None:
        """Record a message's positions; the rows not seen before, or None when all are new."""
        if not len(tags):
            return None
        epoch = int(tags[0, 0])  # a data message never spans two epochs
        seen = self._seen.get((server_id, epoch))
        if seen is None:
            seen = self._seen[(server_id, epoch)] = _Ranges()
            for key in [key for key in self._seen if key[0] == server_id and key[1] < epoch - 1]:
                del self._seen[key]
        runs = position_runs(tags)
        if len(runs) == 1 and not seen.overlaps(runs[0][1], runs[0][2]):  # the usual message
            seen.add(runs[0][1], runs[0][2])
            return None
        old = seen.contains(tags[:, 1])
        for _, start, end in runs:
            seen.add(start, end)
        return np.flatnonzero(~old).tolist() if old.any() else None

    def once(self, server_id: str, tags: Any, samples: Any,
             batched: bool) -> tuple[Any, Any]:
        """A message's ``samples`` and ``tags`` without the rows handed out before (a
        re-send that crossed its acknowledgement), logged; ``samples`` is a list, or
        (``batched``) one batch tree."""
        rows = self.fresh(server_id, tags)
        if rows is None:
            return samples, tags
        log.warning("dropping %d sample(s) of server %s already handed out",
                    len(tags) - len(rows), server_id)
        if batched:
            return take_rows(samples, rows), tags[rows]
        return [samples[row] for row in rows], tags[rows]


class _Ranges:
    """Sorted, disjoint half-open ranges of positions; touching ranges are merged.

    Examples
    --------
    >>> ranges = _Ranges()
    >>> ranges.add(5, 8); ranges.add(0, 2); ranges.add(2, 5)
    >>> ranges.starts, ranges.ends
    ([0], [8])
    >>> ranges.overlaps(8, 10), ranges.overlaps(7, 9)
    (False, True)
    """

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any position of ``[start, end)`` is in a range."""
        index = bisect.bisect_right(self.starts, start) - 1
        if index >= 0 and self.ends[index] > start:
            return True
        return index + 1 < len(self.starts) and self.starts[index + 1] < end

    def add(self, start: int, end: int) -> None:
        """Add ``[start, end)``, merged with the ranges it overlaps or touches."""
        starts, ends = self.starts, self.ends
        low = bisect.bisect_left(ends, start)  # the first range that ends at start or later
        high = bisect.bisect_right(starts, end)  # past the last range that starts by end
        if low < high:
            start, end = min(start, starts[low]), max(end, ends[high - 1])
        starts[low:high] = [start]
        ends[low:high] = [end]

    def contains(self, positions: Any) -> Any:
        """A boolean array: which of ``positions`` are in a range."""
        if not self.starts:
            return np.zeros(len(positions), dtype=bool)
        index = np.searchsorted(self.starts, positions, side="right") - 1
        return (index >= 0) & (positions < np.asarray(self.ends)[np.maximum(index, 0)])
