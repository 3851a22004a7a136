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
(:meth:`ReliableLedger.handed`): only the rest of that message is sent again,
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

The bookkeeping (credit, unacknowledged messages, the re-send queue) is the
pure :class:`ReliableLedger`; :class:`ReliableDispatch` is the socket edge
around it and must hold no delivery state of its own.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

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
)
from feedmux.server._control.meters import ControlMeter
from feedmux.server._delivery.retention import rest_after

__all__ = ["MAX_CREDIT", "MAX_UNACKED_BYTES", "ReliableDispatch", "ReliableLedger"]

log = logging.getLogger("feedmux.server")
peer_log = RateLimitedLog(log)

#: Most messages of credit one trainer's grant counts for (a larger grant is cut to this).
MAX_CREDIT = 256
#: Most bytes of data messages held for acknowledgement across all trainers: past this
#: the server waits for acknowledgements (or a lost trainer) before it sends more, so a
#: peer that grants credit and never acknowledges pins at most this much.
MAX_UNACKED_BYTES = 512 * 1024 * 1024

#: The envelope of messages that want no acknowledgement (heartbeats, end of stream).
_NO_ACK = pack_envelope(0)


@dataclass
class _Pending:
    frames: list[Any]
    n_samples: int
    epoch: int
    nbytes: int = 0
    #: The last (epoch, position) of it the trainer said it handed out, if any.
    handed: tuple[int, int] | None = None


@dataclass
class _Peer:
    client_id: str
    capacity: int = 0
    unacked: dict[int, _Pending] = field(default_factory=dict)

    @property
    def credit(self) -> int:
        return self.capacity - len(self.unacked)


class ReliableLedger:
    """Who has credit, what each trainer holds unacknowledged, what waits to be re-sent.

    Pure bookkeeping: no socket, no clock (``now`` is passed in).
    """

    def __init__(self, server_id: str = "") -> None:
        #: Acknowledgements over control that name another server (a trainer's previous
        #: one: its sequence numbers mean nothing here) are ignored.
        self.server_id = server_id
        self.peers: dict[bytes, _Peer] = {}
        self.resend: deque[_Pending] = deque()
        self.next_seq = 1
        self.resent_messages = 0
        self.lost_trainers = 0
        self.unacked_bytes = 0
        self._last_probe = float("-inf")

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
            peer = self.peers.get(identity)
            if peer is not None:
                self._acknowledge(peer, message.seqs)
        else:
            peer_log.log(logging.WARNING, "unexpected", "unexpected %s on the reliable data socket",
                         type(message).__name__)

    def _acknowledge(self, peer: _Peer, seqs: Sequence[int]) -> None:
        for seq in seqs:
            done = peer.unacked.pop(seq, None)
            if done is not None:
                self.unacked_bytes -= done.nbytes

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
        mark = (message.epoch, message.position)
        for peer in self.peers.values():
            if peer.client_id != message.client_id:
                continue
            if message.position < 0:
                self._acknowledge(peer, message.seqs)
                continue
            for seq in message.seqs:
                pending = peer.unacked.get(seq)
                if pending is not None and (pending.handed is None or mark > pending.handed):
                    pending.handed = mark

    def pick(self) -> bytes | None:
        """The trainer with the most credit left (spreads load across trainers), or None.

        None also while :data:`MAX_UNACKED_BYTES` are held for acknowledgement.
        """
        if self.unacked_bytes >= MAX_UNACKED_BYTES:
            return None
        best, best_credit = None, 0
        for identity, peer in self.peers.items():
            if peer.credit > best_credit:
                best, best_credit = identity, peer.credit
        return best

    def delivered(self, identity: bytes, pending: _Pending) -> None:
        """``pending`` went to ``identity`` under sequence number :attr:`next_seq`."""
        self.peers[identity].unacked[self.next_seq] = pending
        self.unacked_bytes += pending.nbytes
        self.next_seq += 1

    def lose(self, identity: bytes) -> None:
        """``identity`` is gone: what it held goes to the front of the re-send queue."""
        peer = self.peers.pop(identity, None)
        if peer is None:
            return
        self.lost_trainers += 1
        held = []
        for seq in sorted(peer.unacked):
            pending = peer.unacked[seq]
            self.unacked_bytes -= pending.nbytes
            if pending.handed is not None:
                # Exactly once: only what the trainer had not handed out goes to the others.
                rest = rest_after(pending.frames, pending.handed)
                if rest is None:
                    continue
                tags, frames = rest
                pending = _Pending(frames, len(tags), pending.epoch, _size(frames))
            held.append(pending)
        self.resend.extendleft(reversed(held))
        log.warning("trainer %s went away holding %d unacknowledged message(s); "
                    "sending them to the others", peer.client_id, len(held))

    def probe_due(self, now: float, force: bool = False) -> bool:
        """Whether a heartbeat interval has passed since the last probe (and start one)."""
        if not force and now - self._last_probe < HEARTBEAT_INTERVAL:
            return False
        self._last_probe = now
        return True

    @property
    def unacknowledged(self) -> int:
        return len(self.resend) + sum(len(peer.unacked) for peer in self.peers.values())

    def stats(self) -> dict[str, int]:
        return {
            "reliable_trainers": len(self.peers),
            "unacknowledged_messages": self.unacknowledged,
            "resent_messages": self.resent_messages,
            "lost_trainers": self.lost_trainers,
        }


def _size(frames: list[Any]) -> int:
    """Bytes in ``frames`` (bytes, memoryviews of any item size, zmq Frames)."""
    return sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)


class ReliableDispatch:
    """Hands data messages to trainers with credit and re-sends what a lost trainer held."""

    def __init__(self, socket: zmq.Socket[Any], server_id: str,
                 read_marks: Callable[[], object] = lambda: None,
                 meter: ControlMeter | None = None) -> None:
        self.socket = socket
        #: Counts the credit and acknowledgements taken in (control traffic on the data socket).
        self.meter = meter or ControlMeter()
        self.server_id = server_id
        self.ledger = ReliableLedger(server_id)
        #: Reads the control socket: a trainer's last hand-out marks, sent just before it
        #: died, must count before its messages are cut for the others.
        self.read_marks = read_marks

    def _lose(self, identity: bytes) -> None:
        if identity in self.ledger.peers:
            self.read_marks()
        self.ledger.lose(identity)

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
            self.ledger.take(parts[0].bytes, message)
        self.meter.add(received, time.thread_time() - cpu_started)

    def send(self, frames: list[Any], n_samples: int, epoch: int,
             wait: Callable[[], bool]) -> bool:
        """Deliver one new message (after any waiting re-sends); False if told to stop.

        ``wait`` blocks briefly while serving the sockets and returns False when
        the server is stopping.
        """
        pending = _Pending(frames, n_samples, epoch, _size(frames))
        ledger = self.ledger
        while True:
            self.serve()
            self.probe()
            self.flush_resend()
            if not ledger.resend:
                identity = ledger.pick()
                if identity is not None and self._deliver(identity, pending):
                    return True
                if identity is not None:
                    continue  # that trainer was gone; try another
            if not wait():
                return False

    def flush_resend(self) -> None:
        """Re-send what lost trainers held, as far as credit goes."""
        ledger = self.ledger
        while ledger.resend:
            identity = ledger.pick()
            if identity is None:
                return
            pending = ledger.resend.popleft()
            if self._deliver(identity, pending):
                ledger.resent_messages += 1
            else:
                ledger.resend.appendleft(pending)

    def _deliver(self, identity: bytes, pending: _Pending) -> bool:
        try:
            self.socket.send_multipart(
                [identity, pack_envelope(self.ledger.next_seq), *pending.frames],
                flags=zmq.NOBLOCK, copy=False,
            )
        except zmq.ZMQError:
            self._lose(identity)
            return False
        self.ledger.delivered(identity, pending)
        return True

    def probe(self, force: bool = False) -> None:
        """Every heartbeat interval, find out which trainers are gone (a send fails)."""
        if not self.ledger.probe_due(time.monotonic(), force):
            return
        beat = [_NO_ACK, *encode(Heartbeat(sender_id=self.server_id))]
        for identity in list(self.ledger.peers):
            try:
                self.socket.send_multipart([identity, *beat], flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # its queue is full: alive, just busy
            except zmq.ZMQError:
                self._lose(identity)

    def broadcast(self, message: Message) -> None:
        frames = [_NO_ACK, *encode(message)]
        for identity in list(self.ledger.peers):
            try:
                self.socket.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
