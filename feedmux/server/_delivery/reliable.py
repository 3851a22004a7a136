"""Reliable delivery: credit-based flow control with acknowledgements (``--reliable``).

In reliable mode the data socket is a ROUTER and each trainer a DEALER. A
trainer grants credit (how many messages it will hold) and acknowledges each
data message once it has handed out all of its samples; the server sends a
message only to a trainer with credit left and keeps it until it is
acknowledged. When a trainer goes away (its connection drops, seen by a send
that fails under ``ROUTER_MANDATORY``; ZMTP heartbeats turn a frozen trainer
into a dropped connection), its unacknowledged messages go back to the front
of the queue for the others. So nothing is lost and every sample of an epoch
reaches a live trainer. A trainer also acknowledges, every few ms from a
thread over the control socket, how far it handed out the message it is in
(:meth:`Credits.handed`): only the rest of that message is sent again,
so every sample is handed out once across the trainers, counting a dead one's
(up to the last few ms before it died; the loader drops a sample it already
handed out, should one come twice). A trainer acknowledges the messages it
handed out whole several at once on the data socket (half its credit), and
that thread acknowledges the rest of them within a few ms (an ``Ack`` with no
position): one acknowledgement per message would wake both ends' I/O threads
for every message.

With credit, a trainer's receive queue never fills up, which is what makes
ZMTP heartbeats safe on this data socket (see ``make_socket``).

Every message on the reliable data socket, server to trainer, starts with the
envelope of :mod:`feedmux.protocol` (:func:`~feedmux.protocol.pack_envelope`):
the message's sequence number, 0 for messages that need no acknowledgement
(heartbeats, end of stream).

The bookkeeping is pure: :class:`Credits` (who has credit) over the server's
:class:`~feedmux.server._delivery.ledger.Ledger` of unacknowledged messages
(recovery: re-deal to the others, the re-deal queue included);
:class:`ReliableDispatch` is the socket edge around them, sends through the
outbox, and must hold no delivery state of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from feedmux._plumbing.shm import Placement
from feedmux._plumbing.sockets import HEARTBEAT_INTERVAL, readable
from feedmux._ratelog import RateLimitedLog
from feedmux.errors import ProtocolError
from feedmux.protocol import (
    CONTROL_LIMITS,
    Ack,
    Credit,
    Heartbeat,
    Message,
    decode,
    encode,
    pack_envelope,
    read_tags,
)
from feedmux.server._control.meters import ControlMeter
from feedmux.server._delivery.carrier import Carrier
from feedmux.server._delivery.ledger import Entry, Ledger, Recovery, handed_below
from feedmux.server._delivery.outbox import FULL, GONE, SENT, Outbox, Wait

__all__ = ["MAX_CREDIT", "MAX_UNACKED_BYTES", "NO_ACK", "SUMMARY_INTERVAL", "Credits",
           "HandOutSummary", "ReliableDispatch"]

log = logging.getLogger("feedmux.server")
peer_log = RateLimitedLog(log)

#: Most messages of credit one trainer's grant counts for (a larger grant is cut to this).
MAX_CREDIT = 256
#: Most bytes of data messages held for acknowledgement across all trainers: past this
#: the server waits for acknowledgements (or a lost trainer) before it sends more, so a
#: peer that grants credit and never acknowledges pins at most this much.
MAX_UNACKED_BYTES = 512 * 1024 * 1024

#: Most seconds between two summaries of the hand-outs sent to the trainers (while the
#: summary changes): what a trainer that left in the last one held may be lost if the
#: server dies too.
SUMMARY_INTERVAL = 0.25

#: The envelope of messages that want no acknowledgement by sequence number (heartbeats,
#: end of stream, a rank's data: its hand-out marks release it).
NO_ACK = pack_envelope(0)


@dataclass
class _Peer:
    client_id: str
    capacity: int = 0


class Credits:
    """Who has credit, over the :class:`~feedmux.server._delivery.ledger.Ledger` of what
    each trainer holds unacknowledged (a lane per trainer; recovery: re-deal to the others).

    Pure bookkeeping: no socket, no clock (``now`` is passed in).
    """

    def __init__(self, server_id: str = "") -> None:
        #: Acknowledgements over control that name another server (a trainer's previous
        #: one: its sequence numbers mean nothing here) are ignored.
        self.server_id = server_id
        self.peers: dict[bytes, _Peer] = {}
        self.ledger = Ledger(Recovery.REDEAL)
        self.lost_trainers = 0
        self._last_probe = float("-inf")

    def credit(self, identity: bytes) -> int:
        """How many more messages ``identity`` will hold (0: unknown)."""
        peer = self.peers.get(identity)
        return 0 if peer is None else peer.capacity - self.ledger.count(identity)

    def takes(self, identity: bytes, held: int) -> bool:
        """Whether ``identity`` granted credit for more than the ``held`` messages it has
        (a rank's holder: its messages are kept in the rank's ledger, not here)."""
        peer = self.peers.get(identity)
        return peer is not None and peer.capacity > held

    def take(self, identity: bytes, message: Message) -> None:
        """A credit grant or an acknowledgement from ``identity``."""
        if isinstance(message, Credit):
            peer = self.peers.get(identity)
            if peer is None:
                peer = self.peers[identity] = _Peer(message.client_id)
                peer_log.log(logging.INFO, "credit", "trainer %s grants %d messages of credit",
                             message.client_id[:64], message.credits)
            peer.capacity = min(MAX_CREDIT, max(0, message.credits))
        elif isinstance(message, Ack):
            if identity in self.peers:
                self.ledger.acknowledge(identity, message.seqs)
        else:
            peer_log.log(logging.WARNING, "unexpected", "unexpected %s on the reliable data socket",
                         type(message).__name__)

    def handed(self, message: Ack) -> None:
        """A trainer handed out its message ``message.seqs`` up to ``(epoch, position)``,
        or (position -1) its messages ``message.seqs`` whole.

        These come from the trainer's acknowledging thread, over the control
        socket, every few ms; an acknowledgement of a message already
        acknowledged whole (or re-sent) finds nothing and is ignored. Only the
        sender's own messages (by its client id) are marked or acknowledged:
        anyone can reach the control port, and a mark on another trainer's
        message would cut what is re-sent when that trainer goes.
        """
        if message.server_id and self.server_id and message.server_id != self.server_id:
            return
        for identity, peer in list(self.peers.items()):
            if peer.client_id != message.client_id:
                continue
            if message.position < 0:
                self.ledger.acknowledge(identity, message.seqs)
            else:
                self.ledger.handed(identity, identity, (message.epoch, message.position),
                                   message.seqs)

    def pick(self, skip: Collection[bytes] = ()) -> bytes | None:
        """The trainer with the most credit left (spreads load across trainers), or None;
        none of ``skip`` (their queues are full).

        None also while :data:`MAX_UNACKED_BYTES` are held for acknowledgement.
        """
        if self.ledger.nbytes >= MAX_UNACKED_BYTES:
            return None
        best, best_credit = None, 0
        for identity in self.peers:
            credit = self.credit(identity)
            if credit > best_credit and identity not in skip:
                best, best_credit = identity, credit
        return best

    def lose(self, identity: bytes) -> None:
        """``identity`` is gone: what it held goes to the front of the re-deal queue."""
        peer = self.peers.pop(identity, None)
        if peer is None:
            return
        self.lost_trainers += 1
        held = self.ledger.lose(identity)
        log.warning("trainer %s went away holding %d unacknowledged message(s); "
                    "sending them to the others", peer.client_id, held)

    def probe_due(self, now: float, force: bool = False) -> bool:
        """Whether a heartbeat interval has passed since the last probe (and start one)."""
        if not force and now - self._last_probe < HEARTBEAT_INTERVAL:
            return False
        self._last_probe = now
        return True

    @property
    def unacknowledged(self) -> int:
        return self.ledger.held()

    def stats(self) -> dict[str, int]:
        return {
            "reliable_trainers": len(self.peers),
            "unacknowledged_messages": self.unacknowledged,
            "resent_messages": self.ledger.resent_messages,
            "lost_trainers": self.lost_trainers,
        }


class ReliableDispatch:
    """Hands data messages to trainers with credit and re-sends what a lost trainer held.

    It reads the credit and acknowledgements on ``socket`` and sends through
    ``outbox`` (which calls :meth:`serve` when they arrive during its wait).
    """

    def __init__(self, socket: zmq.Socket[Any], outbox: Outbox, server_id: str,
                 read_marks: Callable[[], object] = lambda: None,
                 meter: ControlMeter | None = None) -> None:
        self.socket = socket
        self.outbox = outbox
        #: Counts the credit and acknowledgements taken in (control traffic on the data socket).
        self.meter = meter or ControlMeter()
        self.server_id = server_id
        self.credits = Credits(server_id)
        self.ledger = self.credits.ledger
        #: Reads the control socket: a trainer's last hand-out marks, sent just before it
        #: died, must count before its messages are cut for the others.
        self.read_marks = read_marks
        #: How each message travels (socket or shared-memory pool); None: by socket.
        self.carrier: Carrier | None = None
        #: What tells the trainers what all of them handed out (for a restarted server).
        self.summary = HandOutSummary()

    def _lose(self, identity: bytes) -> None:
        if identity in self.credits.peers:
            self.read_marks()
        self.credits.lose(identity)

    def serve(self) -> None:
        """Take in every credit and acknowledgement waiting on the socket."""
        if not readable(self.socket):
            return
        cpu_started, received = time.thread_time(), 0
        while readable(self.socket):
            try:
                parts = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            received += 1
            try:
                message = decode(parts[1:], limits=CONTROL_LIMITS)
            except ProtocolError as error:
                peer_log.log(logging.WARNING, "malformed",
                             "malformed message on the reliable data socket: %s", error)
                continue
            self.credits.take(parts[0].bytes, message)
        self.meter.add(received, time.thread_time() - cpu_started)

    def send(self, frames: list[Any], n_samples: int, epoch: int,
             halted: Callable[[], bool]) -> bool:
        """Deliver one new message (after any waiting re-sends); False once ``halted()``."""
        # The ledger keeps the frames (bytes the server holds) to deal them again.
        placed = None
        if self.carrier is not None:
            wire, placed = self.carrier.place(frames, kept=True)
            frames = list(wire)
        pending = Entry(b"", frames)

        def attempt() -> Wait | None:
            self._turn()
            if not self.ledger.redeal and self._deliver_any(pending, placed):
                return None
            return Wait.CREDIT

        sent = False
        try:
            sent = self.outbox.deliver(attempt, halted)
        finally:
            if self.carrier is not None:
                self.carrier.settle(placed, frames, sent)  # its runs back unless delivered
        if sent:
            self.summary.newest = frames
        return sent

    def finish(self, deadline: float, halted: Callable[[], bool],
               owed: Callable[[], int] = lambda: 0) -> None:
        """Wait (until ``deadline`` on the monotonic clock) for every message to be
        acknowledged, re-sending what lost trainers held (``owed()``: more messages
        not handed out yet, the ranks')."""
        credits = self.credits

        def left() -> int:
            return credits.unacknowledged + owed()

        def attempt() -> Wait | None:
            self._turn()
            return Wait.CREDIT if left() and time.monotonic() < deadline else None

        self.outbox.deliver(attempt, halted)
        if left():
            log.warning("ending the stream with %d message(s) unacknowledged", left())
        log.info("%d data message(s) re-sent", self.ledger.resent_messages)

    def _turn(self) -> None:
        """Take in credit and acknowledgements, probe the trainers, re-send what is due."""
        self.serve()
        self.probe()
        self.flush_resend()
        self.summarize()

    def _deliver_any(self, entry: Entry, placed: Placement | None = None,
                     again: bool = False) -> bool:
        """Send ``entry`` to the trainer with the most credit that takes it (as ``placed``
        in the shared-memory pool for a trainer that maps it; ``again``: a lost trainer's
        message dealt again, by socket)."""
        skip: set[bytes] = set()
        while (identity := self.credits.pick(skip)) is not None:
            wire: Sequence[Any] | None = entry.frames
            # The pool knows a trainer by its client id (a reliable data socket's identity
            # is libzmq's own).
            trainer = self.credits.peers[identity].client_id.encode()
            if self.carrier is not None:
                wire = self.carrier.wire(trainer, entry.frames, placed)
            seq = self.ledger.next_seq
            sent = FULL if wire is None else self.outbox.send(
                identity, [pack_envelope(seq), *wire])
            if sent is SENT:
                if again:
                    self.ledger.resent(identity, entry, identity, seq)
                else:
                    self.ledger.record(identity, identity, entry.frames, seq)
                if self.carrier is not None and wire is not None:
                    self.carrier.delivered(trainer, wire, placed)
                return True
            if sent is GONE:
                self._lose(identity)  # it left the credits
            else:
                skip.add(identity)  # its queue is full, or its pool references
        return False

    def flush_resend(self) -> None:
        """Re-send what lost trainers held, as far as credit goes."""
        ledger = self.ledger
        while (entry := ledger.next_redeal()) is not None:
            if not self._deliver_any(entry, again=True):
                ledger.redeal_later(entry)
                return

    def probe(self, force: bool = False) -> None:
        """Every heartbeat interval, find out which trainers are gone (a send fails)."""
        if not self.credits.probe_due(time.monotonic(), force):
            return
        beat = [NO_ACK, *encode(Heartbeat(sender_id=self.server_id))]
        for identity in list(self.credits.peers):
            if self.outbox.send(identity, beat) is GONE:  # full: alive, just busy
                self._lose(identity)

    def summarize(self) -> None:
        """Every :data:`SUMMARY_INTERVAL`, tell every trainer what all of them handed out
        (:func:`~feedmux.server._delivery.ledger.handed_below`), when it changed."""
        beat = self.summary.due(time.monotonic(), self.ledger, self.server_id)
        if beat is None:
            return
        for identity in list(self.credits.peers):
            if self.outbox.send(identity, beat) is GONE:
                self._lose(identity)

    def broadcast(self, message: Message) -> None:
        frames = [NO_ACK, *encode(message)]
        for identity in list(self.credits.peers):
            self.outbox.send(identity, frames)


class HandOutSummary:
    """When a reliable server tells its trainers the summary of what they handed out.

    A trainer that outlives the server gives the last one it read to the
    restarted process, which deals again exactly what it lists as not handed
    out: what was in flight to a live trainer, or held by one that left,
    below the live trainers' latest hand-outs (docs/resume.md). ``newest`` is
    the newest message dealt (its frames: their tags are read only here).
    Pure: ``now`` is passed in; at most one summary every
    :data:`SUMMARY_INTERVAL`, and none that says what the last one said.
    """

    def __init__(self) -> None:
        self.newest: list[Any] | None = None
        self._last = float("-inf")
        self._said: tuple[int, ...] = ()

    def due(self, now: float, ledger: Ledger, server_id: str) -> list[Any] | None:
        """The heartbeat frames to send every trainer now, or None."""
        if self.newest is None or now - self._last < SUMMARY_INTERVAL:
            return None
        self._last = now
        tags = read_tags(self.newest)
        newest = (int(tags[-1, 0]), int(tags[-1, 1]) + 1) if len(tags) else None
        summary = handed_below(newest, ledger.outstanding())
        if not summary or summary == self._said:
            return None
        self._said = summary
        return [NO_ACK, *encode(Heartbeat(sender_id=server_id, handed_below=summary))]
