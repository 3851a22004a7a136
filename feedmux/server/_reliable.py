"""Reliable delivery: credit-based flow control with acknowledgements (``--reliable``).

In reliable mode the data socket is a ROUTER and each trainer a DEALER. A
trainer grants credit (how many messages it will hold) and acknowledges each
data message once it has handed out all of its samples; the server sends a
message only to a trainer with credit left and keeps it until it is
acknowledged. When a trainer goes away (its connection drops, seen by a send
that fails under ``ROUTER_MANDATORY``; ZMTP heartbeats turn a frozen trainer
into a dropped connection), its unacknowledged messages go back to the front
of the queue for the others. So nothing is lost and every sample of an epoch
reaches a live trainer (at-least-once): what a dead trainer had not yet
acknowledged — at most its credit — is sent again.

With credit, a trainer's receive queue never fills up, which is what makes
ZMTP heartbeats safe on this data socket (see ``make_socket``).

Every message on the reliable data socket, server to trainer, starts with an
8-byte little-endian envelope: the message's sequence number (0 for messages
that need no acknowledgement: heartbeats, end of stream), then the encoded
message's frames.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from feedmux._transport import HEARTBEAT_INTERVAL, readable
from feedmux.errors import ProtocolError
from feedmux.protocol import Ack, Credit, Heartbeat, Message, decode, encode

__all__ = ["ENVELOPE_BYTES", "ReliableDispatch", "envelope"]

log = logging.getLogger("feedmux.server")

ENVELOPE_BYTES = 8


def envelope(seq: int) -> bytes:
    """The envelope frame of a reliable message (0: no acknowledgement wanted)."""
    return seq.to_bytes(ENVELOPE_BYTES, "little")


@dataclass
class _Pending:
    frames: list[Any]
    n_samples: int
    epoch: int


@dataclass
class _Peer:
    client_id: str
    capacity: int = 0
    unacked: dict[int, _Pending] = field(default_factory=dict)

    @property
    def credit(self) -> int:
        return self.capacity - len(self.unacked)


class ReliableDispatch:
    """Hands data messages to trainers with credit and re-sends what a lost trainer held."""

    def __init__(self, socket: zmq.Socket[Any], server_id: str) -> None:
        self.socket = socket
        self.server_id = server_id
        self.peers: dict[bytes, _Peer] = {}
        self.resend: deque[_Pending] = deque()
        self.next_seq = 1
        self.resent_messages = 0
        self.lost_trainers = 0
        self._last_probe = 0.0

    # -- input --------------------------------------------------------------------------
    def serve(self) -> None:
        """Take in every credit and acknowledgement waiting on the socket."""
        while readable(self.socket):
            try:
                parts = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = parts[0].bytes
            try:
                message = decode(parts[1:])
            except ProtocolError as error:
                log.warning("malformed message on the reliable data socket: %s", error)
                continue
            self._take(identity, message)

    def _take(self, identity: bytes, message: Message) -> None:
        if isinstance(message, Credit):
            peer = self.peers.get(identity)
            if peer is None:
                peer = self.peers[identity] = _Peer(message.client_id)
                log.info("trainer %s grants %d messages of credit", message.client_id,
                         message.credits)
            peer.capacity = max(0, message.credits)
        elif isinstance(message, Ack):
            peer = self.peers.get(identity)
            if peer is not None:
                for seq in message.seqs:
                    peer.unacked.pop(seq, None)
        else:
            log.warning("unexpected %s on the reliable data socket", type(message).__name__)

    # -- output -------------------------------------------------------------------------
    def send(self, frames: list[Any], n_samples: int, epoch: int,
             wait: Callable[[], bool]) -> bool:
        """Deliver one new message (after any waiting re-sends); False if told to stop.

        ``wait`` blocks briefly while serving the sockets and returns False when
        the server is stopping.
        """
        pending = _Pending(frames, n_samples, epoch)
        while True:
            self.serve()
            self.probe()
            self.flush_resend()
            if not self.resend:
                identity = self._pick()
                if identity is not None and self._deliver(identity, pending):
                    return True
                if identity is not None:
                    continue  # that trainer was gone; try another
            if not wait():
                return False

    def flush_resend(self) -> None:
        """Re-send what lost trainers held, as far as credit goes."""
        while self.resend:
            identity = self._pick()
            if identity is None:
                return
            pending = self.resend.popleft()
            if self._deliver(identity, pending):
                self.resent_messages += 1
            else:
                self.resend.appendleft(pending)

    def _pick(self) -> bytes | None:
        """The trainer with the most credit left (spreads load across trainers), or None."""
        best, best_credit = None, 0
        for identity, peer in self.peers.items():
            if peer.credit > best_credit:
                best, best_credit = identity, peer.credit
        return best

    def _deliver(self, identity: bytes, pending: _Pending) -> bool:
        seq = self.next_seq
        try:
            self.socket.send_multipart([identity, envelope(seq), *pending.frames],
                                       flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            self._lose(identity)
            return False
        self.next_seq = seq + 1
        self.peers[identity].unacked[seq] = pending
        return True

    def _lose(self, identity: bytes) -> None:
        peer = self.peers.pop(identity, None)
        if peer is None:
            return
        self.lost_trainers += 1
        held = [peer.unacked[seq] for seq in sorted(peer.unacked)]
        self.resend.extendleft(reversed(held))
        log.warning("trainer %s went away holding %d unacknowledged message(s); "
                    "sending them to the others", peer.client_id, len(held))

    def probe(self, force: bool = False) -> None:
        """Every heartbeat interval, find out which trainers are gone (a send fails)."""
        now = time.monotonic()
        if not force and now - self._last_probe < HEARTBEAT_INTERVAL:
            return
        self._last_probe = now
        beat = [envelope(0), *encode(Heartbeat(sender_id=self.server_id))]
        for identity in list(self.peers):
            try:
                self.socket.send_multipart([identity, *beat], flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # its queue is full: alive, just busy
            except zmq.ZMQError:
                self._lose(identity)

    def broadcast(self, message: Message) -> None:
        frames = [envelope(0), *encode(message)]
        for identity in list(self.peers):
            try:
                self.socket.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    # -- state --------------------------------------------------------------------------
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
