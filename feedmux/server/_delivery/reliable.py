"""The free trainers' delivery: credit-based flow control with acknowledgements.

Every server's (``--reliable`` asked for it while the at-most-once plain
delivery was the default; it is a no-op now). The data socket is a ROUTER and
each trainer a DEALER. A trainer grants credit (how many messages it will hold)
and acknowledges each data message once it has handed out all of its samples;
the server sends a message only to a trainer with credit left and keeps it until
it is acknowledged. When a trainer goes away (its connection closed, seen by a send
that fails under ``ROUTER_MANDATORY``, or silent for :data:`SILENCE_GRACE`: a
frozen trainer, a host gone), its unacknowledged messages go to its
audience's re-deal queue, dealt before anything new to the audience's other
trainers (the server's free trainers, or the other members of its consumer
group), each epoch of it shared among them (:mod:`.shares`). So
nothing is lost and every sample of an epoch reaches a live trainer (of each
group). A trainer also acknowledges, every few ms from a thread over the
control socket, how far it handed out the message it is in
(:meth:`Credits.record_mark`): only the rest of that message is sent again,
so every sample is handed out once across the trainers, counting a dead one's
(up to the last few ms before it died; the loader drops a sample it already
handed out, should one come twice). A trainer acknowledges the messages it
handed out whole several at once on the data socket (half its credit), and
that thread acknowledges the rest of them within a few ms (an ``Ack`` with no
position): one acknowledgement per message would wake both ends' I/O threads
for every message. A loader that closes says goodbye on the data socket (its
last mark, then a grant of no credit): what it held goes to the others at
once, not when a send finds its connection gone.

The server also sends outside credit on this socket: a heartbeat every
:data:`~feedmux._plumbing.sockets.HEARTBEAT_INTERVAL` (its send finds a trainer
whose connection closed) and a summary of the hand-outs up to every
:data:`SUMMARY_INTERVAL`. A trainer in a long step reads none of them. The
data connection has no ZMTP heartbeats (a short outage must be a pause, not a
dropped connection with what it carries), and its receive queue no limit: credit
bounds the data, and the server bounds what it sends outside
credit to a trainer that shows no sign of reading: at most
:data:`SUMMARY_BACKLOG` summaries since its last credit, acknowledgement or
control heartbeat (the summaries it misses meanwhile are worth nothing: it gets
the newest one once it reads again), and one heartbeat a second, which keeps
finding it if it dies (under 100 bytes each: a trainer that reads nothing for
an hour holds well under 1 MiB of them).

Every message on the data socket, server to trainer, starts with the
envelope of :mod:`feedmux.protocol` (:func:`~feedmux.protocol.pack_envelope`):
the message's sequence number, 0 for messages that need no acknowledgement
(heartbeats, end of stream, a rank's data).

The bookkeeping is pure: :class:`Credits` (who has credit, the sequence
numbers) over one :class:`~feedmux.server._delivery.ledger.Ledger` of
unacknowledged messages per free audience (recovery: re-deal to the others,
the re-deal queue included). :class:`ReliableFree` is the recovery policy the
dealer (:mod:`feedmux.server._delivery.dealer`) applies to a free audience;
:class:`ReliableLink` is the socket edge (credit and acknowledgements read on
the data socket, heartbeats that find lost trainers, the wait for the last
acknowledgements) and sends through the outbox. Neither sends a data message
of its own: the dealer does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT, HEARTBEAT_INTERVAL, readable
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
from feedmux.server._delivery.ledger import Entry, Ledger, Recovery, handed_below
from feedmux.server._delivery.outbox import GONE, Outbox, Wait
from feedmux.server._delivery.shares import RedealShares

__all__ = ["IDLE_END", "MAX_CREDIT", "MAX_UNACKED_BYTES", "NO_ACK", "SILENCE_GRACE",
           "SUMMARY_BACKLOG",
           "SUMMARY_INTERVAL",
           "Credits",
           "HandOutSummary", "ReliableFree", "ReliableLink"]

log = logging.getLogger("feedmux.server")
peer_log = RateLimitedLog(log)

#: Most messages of credit one trainer's grant counts for (a larger grant is cut to this).
MAX_CREDIT = 256
#: Most bytes of data messages held for acknowledgement across all trainers: past this
#: the server waits for acknowledgements (or a lost trainer) before it sends more, so a
#: peer that grants credit and never acknowledges pins at most this much.
MAX_UNACKED_BYTES = 512 * 1024 * 1024

#: Most seconds between two summaries of the hand-outs sent to the trainers (while the
#: summary changes): what a trainer that left or died held, dealt after the last summary
#: the others read, is lost if the server dies then too (docs/resume.md).
SUMMARY_INTERVAL = 0.25
#: Most summaries sent to a trainer since it last showed it reads (a credit or an
#: acknowledgement on the data socket, a heartbeat from its loader over control): a
#: reading trainer shows it every second or so (four summaries at most meanwhile), one
#: in a long step is sent no more until it reads again. Each is a few hundred bytes
#: (up to ~25 KiB with ``MAX_SUMMARY_RUNS`` runs): what a paused trainer holds of them.
SUMMARY_BACKLOG = 16

#: Seconds a free reliable trainer may stay silent (no credit or acknowledgement on the
#: data socket, no heartbeat, hand-out mark or sign of life over control: its loader's
#: thread sends one every heartbeat interval, whatever the trainer does) before it counts
#: as lost and what it holds goes to the others. Its data connection has no ZMTP
#: heartbeats: a link down for a few seconds is a pause (TCP carries the queued messages
#: when it comes back), not a departure; a trainer that dies closes its connection and is
#: lost at the next send to it (within a heartbeat interval). Silence is what is left: a
#: frozen process, or a host gone without a word (a half-open connection). Longer than a
#: short outage plus TCP's retransmission back-off after it (a few seconds), and the time
#: the kernel gives a half-open connection (``HALF_OPEN_TIMEOUT``): the data connection to
#: a vanished host closes about when its trainer counts as silent, whichever tells first.
SILENCE_GRACE = HALF_OPEN_TIMEOUT

#: Seconds without an acknowledgement, at the end of a stream, after which the trainers that
#: hold nothing are told the end (see ReliableLink.finish): past the heartbeat interval
#: within which a holder that died is found.
IDLE_END = 2 * HEARTBEAT_INTERVAL

#: The envelope of messages that want no acknowledgement by sequence number (heartbeats,
#: end of stream, a rank's data: its hand-out marks release it).
NO_ACK = pack_envelope(0)


@dataclass
class _Peer:
    client_id: str
    capacity: int = 0


class Credits:
    """Who has credit, the sequence numbers, and the
    :class:`~feedmux.server._delivery.ledger.Ledger` of what each trainer holds
    unacknowledged, one per free audience (``""``: the server's free trainers, else a
    consumer group's; a lane per trainer; recovery: re-deal to the audience's others).

    Pure bookkeeping: no socket, no clock (``now`` is passed in).
    """

    def __init__(self, server_id: str = "") -> None:
        #: Acknowledgements over control that name another server (a trainer's previous
        #: one: its sequence numbers mean nothing here) are ignored.
        self.server_id = server_id
        self.peers: dict[bytes, _Peer] = {}
        #: Each free audience's unacknowledged messages (a trainer is in one audience).
        self.ledgers: dict[str, Ledger] = {}
        #: The server's free trainers' ledger.
        self.ledger = self.ledger_of("")
        #: The next message's sequence number (one numbering across the audiences: a
        #: trainer acknowledges by it whichever audience it is in).
        self.next_seq = 1
        self.lost_trainers = 0
        self._last_beat = float("-inf")

    def ledger_of(self, audience: str) -> Ledger:
        """The ledger of ``audience`` (created empty when first asked for)."""
        ledger = self.ledgers.get(audience)
        if ledger is None:
            ledger = self.ledgers[audience] = Ledger(Recovery.REDEAL)
        return ledger

    def granting(self) -> set[str]:
        """The client ids of the trainers that granted credit (and are not lost)."""
        return {peer.client_id for peer in list(self.peers.values())}

    def count(self, identity: bytes) -> int:
        """Messages ``identity`` holds unacknowledged."""
        return sum(ledger.count(identity) for ledger in list(self.ledgers.values()))

    def credit(self, identity: bytes) -> int:
        """How many more messages ``identity`` will hold (0: unknown)."""
        peer = self.peers.get(identity)
        return 0 if peer is None else peer.capacity - self.count(identity)

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
            # Another process's sequence numbers (a trainer's acknowledgements from before
            # this server restarted) would acknowledge this one's messages of those numbers.
            if message.server_id and self.server_id and message.server_id != self.server_id:
                return
            if identity in self.peers:
                for ledger in list(self.ledgers.values()):
                    if message.position >= 0 and message.seqs:
                        # A closing loader's last mark, before its goodbye on the same
                        # socket: its message seqs[0] handed out up to (epoch, position).
                        ledger.acknowledge_before(identity, identity, message.seqs[0])
                        ledger.record_mark(identity, identity,
                                           (message.epoch, message.position), message.seqs)
                    else:
                        ledger.acknowledge(identity, message.seqs)
        else:
            peer_log.log(logging.WARNING, "unexpected", "unexpected %s on the reliable data socket",
                         type(message).__name__)

    def record_mark(self, message: Ack) -> None:
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
            for ledger in list(self.ledgers.values()):
                if message.position < 0:
                    ledger.acknowledge(identity, message.seqs)
                    continue
                # A mark in a message also says the earlier ones were handed out whole: an
                # acknowledgement lost on the way (a control link down a while, a full
                # queue) does not keep its message, and its credit, for ever.
                for seq in message.seqs[:1]:
                    ledger.acknowledge_before(identity, identity, seq)
                ledger.record_mark(identity, identity, (message.epoch, message.position),
                                   message.seqs)

    def candidates(self, members: Collection[bytes] | None = None,
                   skip: Collection[bytes] = ()) -> list[tuple[bytes, bytes]]:
        """``(data identity, client id)`` of the trainers with credit left, the most first
        (spreads load across trainers), among ``members`` (client ids; None: all), none
        of ``skip``.

        None at all while :data:`MAX_UNACKED_BYTES` are held for acknowledgement.
        """
        if self.nbytes >= MAX_UNACKED_BYTES:
            return []
        found = []
        for identity, peer in list(self.peers.items()):
            trainer = peer.client_id.encode()
            if identity in skip or (members is not None and trainer not in members):
                continue
            credit = self.credit(identity)
            if credit > 0:
                found.append((credit, identity, trainer))
        found.sort(key=lambda item: -item[0])  # stable: the first granted first among equals
        return [(identity, trainer) for _, identity, trainer in found]

    def sent(self, audience: str, identity: bytes, frames: list[Any],
             resent: Entry | None = None) -> int:
        """``frames`` went to ``identity`` of ``audience`` as the next sequence number
        (``resent``: a lost trainer's message dealt again); returns that number."""
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        ledger = self.ledger_of(audience)
        if resent is not None:
            ledger.resent(identity, resent, identity, seq)
        else:
            ledger.record(identity, identity, frames, seq)
        return seq

    def lose(self, identity: bytes, goodbye: bool = False) -> None:
        """``identity`` is gone (``goodbye``: it said so, closing): what it held goes to
        the front of its audience's re-deal queue."""
        peer = self.peers.pop(identity, None)
        if peer is None:
            return
        held = sum(ledger.lose(identity) for ledger in list(self.ledgers.values()))
        if goodbye:
            log.info("trainer %s left holding %d unacknowledged message(s); sending them "
                     "to the others", peer.client_id, held)
            return
        self.lost_trainers += 1
        log.warning("trainer %s went away holding %d unacknowledged message(s); "
                    "sending them to the others", peer.client_id, held)

    def beat_due(self, now: float, force: bool = False) -> bool:
        """Whether a heartbeat interval has passed since the last heartbeat (and start one)."""
        if not force and now - self._last_beat < HEARTBEAT_INTERVAL:
            return False
        self._last_beat = now
        return True

    @property
    def nbytes(self) -> int:
        """Bytes held for acknowledgement, every audience's."""
        return sum(ledger.nbytes for ledger in list(self.ledgers.values()))

    @property
    def unacknowledged(self) -> int:
        """Messages not acknowledged yet, the re-deal queues' included."""
        return sum(ledger.held() for ledger in list(self.ledgers.values()))

    def stats(self) -> dict[str, int]:
        return {
            "reliable_trainers": len(self.peers),
            "unacknowledged_messages": self.unacknowledged,
            "resent_messages": sum(ledger.resent_messages
                                   for ledger in list(self.ledgers.values())),
            "lost_trainers": self.lost_trainers,
        }


class ReliableFree:
    """The reliable recovery policy of one free audience (``audience``: "" or a group's
    name), for the dealer: trainers with credit, the most first; a sequence number in
    every envelope; each message kept in the audience's ledger until acknowledged, a
    lost trainer's rest dealt again to the audience's others first, each epoch of it
    shared with the trainers that hold none of it (:class:`RedealShares`; ``sharers``:
    how many trainers a client id said share the stream)."""

    keeps = True

    def __init__(self, link: ReliableLink, audience: str,
                 sharers: Callable[[str], int] = lambda client_id: 1) -> None:
        self.link = link
        self.credits = link.credits
        self.audience = audience
        self.ledger = link.credits.ledger_of(audience)
        self.shares = RedealShares(self.ledger, sharers)

    def turn(self) -> None:
        self.link.turn()

    def candidates(self, members: list[bytes] | None,
                   resent: Entry | None = None) -> list[tuple[bytes, bytes]]:
        found = self.credits.candidates(None if members is None else set(members))
        if resent is None:
            return found
        return self.shares.takers(found, resent, self.link.clock())

    def envelope(self) -> list[bytes]:
        return [pack_envelope(self.credits.next_seq)]

    def sent(self, identity: bytes, frames: Sequence[Any], resent: Entry | None) -> None:
        self.credits.sent(self.audience, identity, list(frames), resent)
        if resent is None and not self.audience:
            self.link.summary.dealt(frames)

    def gone(self, identity: bytes) -> None:
        self.link.lose(identity)

    def next_redeal(self) -> Entry | None:
        return self.ledger.next_redeal()

    def redeal_later(self, entry: Entry) -> None:
        self.ledger.redeal_later(entry)

    def wait(self, capped: bool) -> Wait:
        return Wait.CREDIT


class ReliableLink:
    """The reliable data socket's edge: reads the credit and acknowledgements on
    ``socket`` (the outbox calls :meth:`serve` when they arrive during its wait), finds
    lost trainers with heartbeats, and waits for the last acknowledgements."""

    def __init__(self, socket: zmq.Socket[Any], outbox: Outbox, server_id: str,
                 read_marks: Callable[[], object] = lambda: None,
                 count_control: Callable[[int, float], None] = lambda messages, cpu: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.outbox = outbox
        #: Counts the credit and acknowledgements taken in, and the CPU seconds they took
        #: (control traffic on the data socket: the shell's control meter adds them up).
        self.count_control = count_control
        self.server_id = server_id
        self.credits = Credits(server_id)
        #: Reads the control socket: a trainer's last hand-out marks, sent just before it
        #: died, must count before its messages are cut for the others.
        self.read_marks = read_marks
        #: What tells the free trainers what all of them handed out (for a restarted server).
        self.summary = HandOutSummary()
        #: When each trainer (data identity) was last heard, on either socket, moved on by
        #: the time the server itself did not look (see :meth:`turn`).
        self.heard: dict[bytes, float] = {}
        self.clock = clock
        self._turned = clock()

    def lose(self, identity: bytes, goodbye: bool = False) -> None:
        if identity in self.credits.peers:
            self.read_marks()
        self.credits.lose(identity, goodbye)
        self.summary.forget(identity)
        self.heard.pop(identity, None)

    def reading(self, client_id: str) -> None:
        """The loader of trainer ``client_id`` is reading (its heartbeat over control came):
        it may be sent summaries again."""
        now = self.clock()
        for identity in self._identities(client_id):
            self.summary.read(identity)
            self.heard[identity] = now

    def marked(self, message: Ack) -> None:
        """A free trainer's hand-out mark or sign of life over control (:class:`Ack`)."""
        now = self.clock()
        for identity in self._identities(message.client_id):
            self.heard[identity] = now
        self.credits.record_mark(message)

    def _identities(self, client_id: str) -> list[bytes]:
        return [identity for identity, peer in list(self.credits.peers.items())
                if peer.client_id == client_id]

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
                self.outbox.stray_dropped += 1  # read and dropped: counted as stray
                continue
            identity = parts[0].bytes
            known = identity in self.credits.peers
            if isinstance(message, Credit) and not known:
                self._replaced(identity, message.client_id)
            self.credits.take(identity, message)
            if known and isinstance(message, Credit) and message.credits <= 0:
                # A loader's goodbye (it closes, or its process ends: a DataLoader worker
                # at the end of a pass): what it holds goes to the others now, before a
                # successor connects and is dealt the next epoch's messages first.
                self.lose(identity, goodbye=True)
                continue
            self.summary.read(identity)
            self.heard[identity] = self.clock()
        self.count_control(received, time.thread_time() - cpu_started)

    def _replaced(self, identity: bytes, client_id: str) -> None:
        """A new connection grants credit as ``client_id``: an older one under that id is a
        closed loader's not seen gone yet (a loader grants credit once its hello was
        admitted, and a hello is refused while a live trainer holds its id). Its messages
        go to the others now: the hand-out marks name the client id, so the new loader's
        would acknowledge what the old one never handed out."""
        for other in self._identities(client_id):
            if other != identity:
                self.lose(other)

    def turn(self) -> None:
        """Take in credit and acknowledgements, find lost trainers when it is time, and
        sum up the hand-outs for the trainers when that is due.

        Silence counts only while the server listens: a gap between two turns longer
        than a heartbeat interval (a draw that took long, a stopped server process)
        moves every trainer's last-heard time on by the excess, so that what they sent
        meanwhile, still unread in the queues, is not taken for silence."""
        now = self.clock()
        away, self._turned = now - self._turned - HEARTBEAT_INTERVAL, now
        if away > 0:
            for identity in list(self.heard):
                self.heard[identity] += away
        self.serve()
        self.beat()
        self.summarize()

    def finish(self, deadline: float, halted: Callable[[], bool], redeal: Callable[[], object],
               owed: Callable[[], int] = lambda: 0,
               end: Callable[[], Message] | None = None) -> None:
        """Wait (until ``deadline`` on the monotonic clock) for every message to be
        acknowledged, ``redeal()`` dealing again what lost trainers held (``owed()``: more
        messages not handed out yet, the ranks').

        Meanwhile, once no acknowledgement came for :data:`IDLE_END` seconds, a
        trainer that holds nothing, while nothing waits to be dealt again, is told the
        end (``end()``): a trainer waiting for its end may be what the holders wait for
        (DataLoader workers are read in turn: worker 0 hands out its last messages only
        once worker 1, which got none, ends). Not at once: a holder that died is found
        within a heartbeat interval, and its rest must still find the others reading;
        and not while a holder is silent (its acknowledging thread says it lives every
        heartbeat interval): a trainer whose host is gone is found only when its silence
        times out, and its rest must find the others still reading then.
        """
        credits = self.credits
        told: set[bytes] = set()
        progress = [credits.unacknowledged, self.clock()]

        def left() -> int:
            return credits.unacknowledged + owed()

        def tell_the_idle() -> None:
            if credits.unacknowledged != progress[0]:
                progress[:] = [credits.unacknowledged, self.clock()]
            peers = list(credits.peers)
            held = [credits.count(identity) for identity in peers]
            now = self.clock()
            if (end is None or owed() or credits.unacknowledged > sum(held)
                    or now - progress[1] < IDLE_END):
                return  # dealing again, a rank owed, or the holders still hand out
            if any(count and now - self.heard.get(identity, now) >= IDLE_END
                   for identity, count in zip(peers, held, strict=True)):
                return  # a silent holder (a host gone): its rest goes to the idle once lost
            frames = [NO_ACK, *encode(end())]
            for identity, count in zip(peers, held, strict=True):
                if not count and identity not in told:
                    told.add(identity)
                    self.outbox.send(identity, frames)

        def attempt() -> Wait | None:
            self.turn()
            redeal()
            tell_the_idle()
            return Wait.CREDIT if left() and self.clock() < deadline else None

        self.outbox.deliver(attempt, halted)
        if left():
            log.warning("ending the stream with %d message(s) unacknowledged", left())
        log.info("%d data message(s) re-sent", credits.stats()["resent_messages"])

    def beat(self, force: bool = False) -> None:
        """Every heartbeat interval, find out which trainers are gone: a send fails (its
        connection closed), or it was silent for :data:`SILENCE_GRACE`."""
        now = self.clock()
        if not self.credits.beat_due(now, force):
            return
        beat = [NO_ACK, *encode(Heartbeat(sender_id=self.server_id))]
        if any(now - self.heard.get(identity, now) > SILENCE_GRACE
               for identity in list(self.credits.peers)):
            self.read_marks()  # what waits unread on control is no silence
        for identity in list(self.credits.peers):
            silent = now - self.heard.setdefault(identity, now)
            if silent > SILENCE_GRACE:
                log.warning("trainer %s was not heard from for %.0f s",
                            self.credits.peers[identity].client_id[:64], silent)
                self.lose(identity)
            elif self.outbox.send(identity, beat) is GONE:  # full: alive, just busy
                self.lose(identity)

    def summarize(self) -> None:
        """Every :data:`SUMMARY_INTERVAL`, tell each trainer what all the free trainers
        handed out (:func:`~feedmux.server._delivery.ledger.handed_below`) when it has not
        been told that yet and is not :data:`SUMMARY_BACKLOG` summaries behind."""
        summary = self.summary
        frames = summary.due(self.clock(), self.credits.ledger, self.server_id)
        if frames is None:
            return
        for identity in list(self.credits.peers):
            if not summary.wants(identity):
                continue
            if self.outbox.send(identity, frames) is GONE:
                self.lose(identity)
            else:
                summary.sent(identity)

    def broadcast(self, message: Message) -> None:
        frames = [NO_ACK, *encode(message)]
        for identity in list(self.credits.peers):
            self.outbox.send(identity, frames)


class HandOutSummary:
    """When a reliable server tells each of its trainers the summary of what they
    handed out.

    A trainer that outlives the server gives the last one it read to the
    restarted process, which deals again exactly what it lists as not handed
    out: what was in flight to a live trainer, or held by one that left,
    below the live trainers' latest hand-outs (docs/resume.md). ``newest`` is
    where the furthest message dealt ends (``(epoch, position + 1)``): the furthest,
    not the last, since a batch of a free trainer's shape built from a dead
    trainer's re-dealt rows goes out as a new message behind it (had the summary
    stopped there, the re-deal queue's positions above it would be covered by
    nothing, and a restarted server would take those below a survivor's latest
    hand-out for handed out); and
    ``held()`` the runs dealt and in no ledger: the rows the free trainers' batch
    shapes hold and the batches they built and did not send
    (:meth:`~feedmux.server._delivery.freebatches.FreeBatches.outstanding`).
    Those are listed as not handed out with the ledger's: below ``newest`` as
    soon as a trainer of another shape takes a later message, they would
    otherwise count as handed out, and a restarted server would never deal them.
    Pure: ``now`` is passed in. At most one summary every
    :data:`SUMMARY_INTERVAL`; a trainer is not told what it was told last, nor
    anything once it is :data:`SUMMARY_BACKLOG` summaries behind (it has not
    shown it reads since), until it reads: then it gets the newest one, so every
    live trainer ends up with the newest summary.

    >>> summary = HandOutSummary()
    >>> for _ in range(SUMMARY_BACKLOG):
    ...     summary.sent(b"t")
    >>> summary.current = (1, 8)
    >>> summary.wants(b"t"), summary.wants(b"u")
    (False, True)
    >>> summary.read(b"t")
    >>> summary.wants(b"t")
    True
    """

    def __init__(self) -> None:
        self.newest: tuple[int, int] | None = None
        self.held: Callable[[], list[tuple[int, int, int]]] = list
        #: The newest summary (empty before anything was dealt).
        self.current: tuple[int, ...] = ()
        self._last = float("-inf")
        #: What each trainer was told last, and how many summaries it was sent since it
        #: last showed it reads.
        self._told: dict[bytes, tuple[int, ...]] = {}
        self._unread: dict[bytes, int] = {}

    def due(self, now: float, ledger: Ledger, server_id: str) -> list[Any] | None:
        """The heartbeat frames of the newest summary, to send the trainers that
        :meth:`wants` it, or None when none is due."""
        if self.newest is None or now - self._last < SUMMARY_INTERVAL:
            return None
        self._last = now
        self.current = handed_below(self.newest, [*ledger.outstanding(), *self.held()])
        if not self.current:
            return None
        return [NO_ACK, *encode(Heartbeat(sender_id=server_id, handed_below=self.current))]

    def dealt(self, frames: Sequence[Any]) -> None:
        """A message went to a free trainer (not as a re-deal): ``newest`` moves to its
        end if that lies further (one read of its tags frame)."""
        tags = read_tags(frames)
        if len(tags):
            end = (int(tags[-1, 0]), int(tags[-1, 1]) + 1)
            if self.newest is None or end > self.newest:
                self.newest = end

    def wants(self, identity: bytes) -> bool:
        """Whether trainer ``identity`` is to be sent the newest summary now."""
        return (self._told.get(identity) != self.current
                and self._unread.get(identity, 0) < SUMMARY_BACKLOG)

    def sent(self, identity: bytes) -> None:
        """The newest summary went to ``identity``."""
        self._told[identity] = self.current
        self._unread[identity] = self._unread.get(identity, 0) + 1

    def read(self, identity: bytes) -> None:
        """``identity`` showed it reads: what was sent before is out of its queue."""
        self._unread.pop(identity, None)

    def forget(self, identity: bytes) -> None:
        """``identity`` is gone."""
        self._told.pop(identity, None)
        self._unread.pop(identity, None)
