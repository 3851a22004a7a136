"""The dealing stage: one data message to one audience, free trainers or ranks.

:class:`Dealer` owns the one send path of data messages. An *audience* is who
may get a message: the free trainers of the server or of one consumer group
(:class:`FreeAudience`: whoever has room takes it), or the ranks of the server
or of one ranked group (:class:`RankAudience`: the holder of the message's
rank, a successor getting its predecessor's rest first through
:class:`~feedmux.server._delivery.ranksend.RankSender`). A server without
groups is one free audience and one rank audience; each consumer group is an
audience fed from the groups' buffer. How a message travels to each trainer
(socket or shared-memory references) is the
:class:`~feedmux.server._delivery.carrier.Carrier`'s choice; what becomes of a
free message once sent is the audience's *recovery policy*,
:class:`~feedmux.server._delivery.reliable.ReliableFree` (credit, sequence
numbers, a ledger of unacknowledged messages and the re-deal of a lost
trainer's rest to the audience's other members). A free trainer that asked for
batches is dealt like the others; what it takes goes through its shape's
batches in the audience (:class:`~feedmux.server._delivery.freebatches.FreeBatches`),
and the batches go to the trainers of that shape. The dealer tries and waits
through the :class:`~feedmux.server._delivery.outbox.Outbox`; it must never
send on a socket itself, decide who holds a rank (the control core does), or
keep a message once it left (the ledgers do).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from feedmux._plumbing.shm import Placement
from feedmux._plumbing.shmtable import SENT as SENT_RUNS
from feedmux.errors import ProtocolError
from feedmux.protocol import Data, decode, encode, read_tags, stacking_into, without_padding
from feedmux.server._delivery.batches import unstackable
from feedmux.server._delivery.carrier import Carrier
from feedmux.server._delivery.freebatches import NO_BATCHES, FreeBatches, Shape
from feedmux.server._delivery.ledger import Entry, Ledger
from feedmux.server._delivery.outbox import GONE, SENT, Outbox, Wait
from feedmux.server._delivery.ranksend import RankSender
from feedmux.server._delivery.registry import DealerControl

log = logging.getLogger("feedmux.server")

__all__ = ["MAX_PENDING", "Dealer", "FreeAudience", "FreePolicy", "RankAudience"]

#: Batches of one shape built and not sent yet past which its trainers take no new message
#: (the others do): what a free audience holds for a shape stays a few messages.
MAX_PENDING = 2


def _single_samples(client_id: bytes) -> Shape:
    return NO_BATCHES


class FreePolicy(Protocol):
    """What becomes of a free audience's messages: who may take the next one, in which
    order, with which envelope, and what is kept of it once sent."""

    #: Whether a sent message is kept to be dealt again (the carrier keeps whole bytes).
    keeps: bool

    def turn(self) -> None:
        """Before each attempt: take in what the trainers said (credit, acknowledgements)."""

    def candidates(self, members: list[bytes] | None,
                   resent: Entry | None = None) -> list[tuple[bytes, bytes]]:
        """``(data identity, client id)`` of the trainers that may take a message now,
        in the order to try them, among ``members`` (client ids; None: every trainer);
        ``resent``: the message is a lost trainer's, dealt again."""

    def envelope(self) -> list[bytes]:
        """What goes before the message on the wire."""

    def sent(self, identity: bytes, frames: Sequence[Any], resent: Entry | None) -> None:
        """``frames`` went to ``identity`` (``resent``: a lost trainer's, dealt again)."""

    def gone(self, identity: bytes) -> None:
        """A send found ``identity`` not connected."""

    def next_redeal(self) -> Entry | None:
        """A lost trainer's message to deal before any new one, taken (None: none)."""

    def redeal_later(self, entry: Entry) -> None:
        """``entry`` (from :meth:`next_redeal`) found nobody: first again."""

    def wait(self, capped: bool) -> Wait:
        """What a message nobody took waits for (``capped``: a trainer had room but too
        many pool references on their way)."""


@dataclass
class FreeAudience:
    """The free trainers of the server (``name`` "") or of one consumer group.

    ``members()`` gives their client ids, the next in turn first (None: every
    trainer the policy knows); ``batches`` cuts what its trainers that asked for
    batches take (one cut per batch shape).
    """

    name: str
    members: Callable[[], list[bytes] | None]
    policy: FreePolicy
    batches: FreeBatches = field(default_factory=lambda: FreeBatches("", _single_samples))


class RankAudience:
    """The ranks of the server or of one ranked group: ``target_of(rank)`` is the data
    identity of a rank's holder; ``ledger()`` the ranks' ledger now (a job restarted
    from a checkpoint starts a new one: its previous ranks are owed nothing), and
    ``holders()`` the ranks held."""

    def __init__(self, target_of: Callable[[int], bytes | None], ledger: Callable[[], Ledger],
                 holders: Callable[[], list[int]],
                 sender: Callable[[Ledger], RankSender]) -> None:
        self.target_of = target_of
        self.ledger = ledger
        self.holders = holders
        self._make_sender = sender
        self.sender = sender(ledger())

    def replay_taken_over(self) -> None:
        """Hand every rank taken over since the last look its predecessor's rest."""
        if self.sender.retention is not self.ledger():
            self.sender = self._make_sender(self.ledger())
        self.sender.replay_taken_over(self.holders(), self.target_of)


class Dealer:
    """Deals data messages to audiences, by socket or pool references (``carrier``).

    ``halted()`` says when a waiting message stops waiting; ``policy(name)`` is the
    recovery policy of the free audience ``name`` (the server's: "", or a group's).
    Given ``rank_envelope`` and ``rank_room`` (a server's are always given), a rank's
    message goes after an envelope that wants no sequence-number acknowledgement, within
    its holder's credit. ``refuse(client_id, problem)`` tells a free trainer that its
    batch could not be built.
    """

    def __init__(self, outbox: Outbox, core: DealerControl, carrier: Carrier,
                 halted: Callable[[], bool], policy: Callable[[str], FreePolicy],
                 rank_envelope: Sequence[bytes] = (),
                 rank_room: Callable[[bytes, int], bool] | None = None,
                 refuse: Callable[[str, str], None] = lambda client_id, problem: None,
                 ) -> None:
        self.outbox = outbox
        self.core = core
        self.carrier = carrier
        self.halted = halted
        self.policy = policy
        self.rank_envelope = rank_envelope
        self.rank_room = rank_room
        self.refuse = refuse
        #: Every free audience made (their batches are finished at the stream's end).
        self.audiences: list[FreeAudience] = []
        #: Each free audience's batches, by name ("": the group ``default``'s).
        self._batches: dict[str, FreeBatches] = {}

    def free_audience(self, name: str, members: Callable[[], list[bytes] | None],
                      ) -> FreeAudience:
        """The free audience ``name`` (its members' client ids from ``members()``) under
        this server's recovery policy."""
        audience = FreeAudience(name, members, self.policy(name), self.free_batches(name))
        self.audiences.append(audience)
        return audience

    def free_batches(self, name: str) -> FreeBatches:
        """The batches of free audience ``name``'s trainers (made when first asked for)."""
        batches = self._batches.get(name)
        if batches is None:
            batches = self._batches[name] = FreeBatches(self.core.config.server_id,
                                                        self.core.batch_shape,
                                                        self.core.config.buckets)
        return batches

    def rank_sender(self, ledger: Ledger) -> RankSender:
        """A sender of ranked messages kept in ``ledger`` (a replay counts as sent)."""
        return RankSender(self.outbox, ledger, self._replayed, self.rank_envelope,
                          self.rank_room)

    def send(self, frames: Sequence[Any], audience: FreeAudience | RankAudience,
             rank: int = -1) -> tuple[bool, Sequence[Any]]:
        """Deal one message (to ``rank``'s holder of a rank audience), waiting while nobody
        can take it; whether it went (not once halted), and its frames from now on (whole
        bytes if not). The bytes that left are counted."""
        keeps = isinstance(audience, FreeAudience) and audience.policy.keeps
        frames, placed = self.carrier.place(frames, keeps=keeps)  # a rank's: pinned runs
        tries = 0

        def attempt() -> Wait | None:
            nonlocal tries
            tries += 1
            return self.offer(frames, placed, audience, rank, first=tries == 1)

        sent = False
        try:
            sent = self.outbox.deliver(attempt, self.halted)
        finally:  # unless delivered (went by socket, or nowhere): its runs back
            frames = self.carrier.settle(placed, frames, sent)
        return sent, frames

    def offer(self, frames: Sequence[Any], placed: Placement | None,
              audience: FreeAudience | RankAudience, rank: int = -1,
              first: bool = True) -> Wait | None:
        """One try at dealing a message (placed in the pool as ``placed``, or None); None
        if it went, else what to wait for before the next try."""
        if isinstance(audience, RankAudience):
            sent, capped = self._to_rank(audience, rank, frames, placed)
            # A ROUTER is writable when any trainer's queue has room, which may not be
            # this rank's: after the first try, a brief look at control alone.
            return None if sent else Wait.ROOM if first and not capped else Wait.BRIEF
        policy = audience.policy
        policy.turn()
        if not self.redeal(audience):
            return policy.wait(False)
        skipped = self._to_free(audience, frames, placed, None)
        return None if skipped is None else policy.wait(skipped)

    def redeal(self, audience: FreeAudience) -> bool:
        """Deal the audience's lost trainers' rest first, as far as it goes, and the
        batches built and not sent yet (those never hold the rest back); True once no
        rest is left."""
        policy = audience.policy
        if audience.batches.shapes():
            self._send_batches(audience)
        while (entry := policy.next_redeal()) is not None:
            if audience.batches.bucketed and not entry.sampled:
                entry = _as_sampled(entry)  # a bucketed batch's rest: its samples
            if self._to_free(audience, entry.frames, None, entry) is not None:
                policy.redeal_later(entry)
                return False
        return True

    def finish_batches(self, audience: FreeAudience, epoch: int | None = None) -> None:
        """``epoch`` (None: every one) was dealt whole to ``audience``: its trainers' last,
        partial batches of it are made, and sent as far as they go."""
        audience.batches.finish_epoch(epoch)
        self.redeal(audience)

    def batch_stats(self) -> dict[str, int]:
        """The free trainers' batches' counters (none before a free trainer asked for
        batches): samples of epochs' last partial batches dropped (``drop_last``), and
        samples that made no batch and that no trainer of another shape took."""
        made = [batches for batches in list(self._batches.values()) if batches.cut_any]
        if not made:
            return {}
        return {"free_batch_samples_dropped": sum(batches.dropped for batches in made),
                "free_batch_samples_unbuilt": sum(batches.unbuilt for batches in made)}

    def batches_owed(self) -> int:
        """Batches of every free audience built or begun and not sent yet."""
        return sum(batches.owed() for batches in self._batches.values())

    def _send_batches(self, audience: FreeAudience) -> None:
        """Send each shape's built batches to the audience's trainers of that shape with
        credit, as far as they go; a shape with no trainer left gives its rows to the
        others (dealt again, first)."""
        batches, policy = audience.batches, audience.policy
        self._give_back(audience)
        present = self.core.batch_shapes(audience.name, batches.refused)
        for shape in batches.shapes():
            if shape not in present:
                for frames in reversed(batches.release(shape)):
                    policy.redeal_later(Entry(b"", frames))
                continue
            pending = batches.pending_of(shape)
            while pending and self._batch_to(audience, shape, pending[0][0]):
                pending.popleft()

    @staticmethod
    def _give_back(audience: FreeAudience) -> None:
        """Rows a shape held that did not make a batch go to the audience's others, first."""
        batches = audience.batches
        returned, batches.returned = batches.returned, []
        for shape, frames in reversed(returned):
            audience.policy.redeal_later(Entry(b"", frames, unbatchable=(shape,)))

    def _batch_to(self, audience: FreeAudience, shape: Shape, frames: list[Any]) -> bool:
        """Send a batch of ``shape`` to one of the audience's trainers of that shape with
        credit (as references to the pool for a trainer that maps it; the ledger keeps
        the bytes); whether one took it."""
        policy, batches = audience.policy, audience.batches
        candidates = [(identity, trainer) for identity, trainer
                      in policy.candidates(audience.members())
                      if batches.shape(trainer) == shape and trainer not in batches.refused]
        if not candidates:
            return False
        placed = self.carrier.share(frames, SENT_RUNS)  # never waits: whole when it is full
        try:
            for identity, trainer in candidates:
                if self._try_send(policy, identity, trainer, frames, placed, None):
                    return True
            return False
        finally:  # its runs back unless they went as references
            self.carrier.settle(placed, frames, sent=True)

    def _cut(self, audience: FreeAudience, shape: Shape, trainer: bytes,
             frames: Sequence[Any], resent: Entry | None) -> None:
        """A trainer of ``shape`` takes a message: its rows go into the shape's batches, and
        the batches made go to the shape's trainers (it first, having the most credit).

        A message whose samples do not stack is that trainer's error, not the server's:
        it is dealt nothing more, and the message (with the rows its shape held) goes to
        the audience's trainers of other shapes first, or, with none, is dropped."""
        batches = audience.batches
        frames = self.carrier.whole(frames)
        pool = self.carrier.pool
        try:
            # While a trainer maps the pool, a batch joined from several messages is stacked
            # straight into the server's region of it (its one copy): sent as references.
            with stacking_into(pool.empty if pool is not None and pool.wanted else None):
                batches.cut(shape, frames)
        except ProtocolError as error:
            batches.refused.add(trainer)
            tags = read_tags(list(frames))
            self.refuse(trainer.decode(errors="replace"),
                        unstackable(error, int(tags[0, 0]), shape[0], bucket_by=shape[2]))
            unbatchable = (*(() if resent is None else resent.unbatchable), shape)
            returned = [back for _, back in batches.returned] + [list(frames)]
            batches.returned = []
            if self.core.batch_shapes(audience.name, batches.refused) - set(unbatchable):
                for back in reversed(returned):
                    audience.policy.redeal_later(Entry(b"", back, unbatchable=unbatchable))
            else:
                dropped = sum(len(read_tags(back)) for back in returned)
                batches.unbuilt += dropped
                log.warning("%d sample(s) dropped: no trainer of another batch shape than "
                            "batch_size=%d takes them", dropped, shape[0])
            return
        self._send_batches(audience)

    def _to_free(self, audience: FreeAudience, frames: Sequence[Any], placed: Placement | None,
                 resent: Entry | None) -> bool | None:
        """Offer a message to each of the audience's trainers in turn (one that asked for
        batches takes it into its shape's batches). Returns None if one took it, else
        whether a trainer was skipped for the pool's cap."""
        policy, capped = audience.policy, False
        batches = audience.batches
        for identity, trainer in policy.candidates(audience.members(), resent):
            shape = batches.shape(trainer)
            if resent is not None and shape in resent.unbatchable:
                continue  # its samples do not make this trainer's batches
            if shape != NO_BATCHES:
                if trainer in batches.refused or len(batches.pending_of(shape)) >= MAX_PENDING:
                    continue  # refused, or its shape's batches wait: another takes it
                self._cut(audience, shape, trainer, frames, resent)
                return None
            sent = self._try_send(policy, identity, trainer, frames, placed, resent)
            if sent:
                return None
            capped = capped or sent is None
        return capped

    def _try_send(self, policy: FreePolicy, identity: bytes, trainer: bytes,
                  frames: Sequence[Any], placed: Placement | None,
                  resent: Entry | None) -> bool | None:
        """One try at sending a free message to one trainer (data identity ``identity``,
        client id ``trainer``: the pool knows a trainer by its client id, the socket by
        its identity): True if it went (the policy and the carrier told), False if not
        (its queue full, or it is gone: the policy told), None if the pool's cap on
        references on their way held it back. The one send of a free message, single
        samples and batches alike; it runs per message and candidate, so it makes the
        calls a send needs and nothing more (no lookups, no copies)."""
        wire = self.carrier.wire(trainer, frames, placed)
        if wire is None:
            return None
        sent = self.outbox.send(identity, [*policy.envelope(), *wire])
        if sent is SENT:
            policy.sent(identity, frames, resent)
            self.carrier.delivered(trainer, wire, placed)
            return True
        if sent is GONE:
            policy.gone(identity)
        return False

    def _to_rank(self, audience: RankAudience, rank: int, frames: Sequence[Any],
                 placed: Placement | None) -> tuple[bool, bool]:
        """Send a rank's message to its holder. Returns (sent, held back for the cap)."""
        target = audience.target_of(rank)
        if target is None:
            return False, False
        wire = self.carrier.wire(target, frames, placed)
        if wire is None:
            return False, True
        if not audience.sender.send(rank, target, frames, None if wire is frames else wire):
            return False, False
        self.carrier.delivered(target, wire, placed)
        return True, False

    def _replayed(self, frames: Sequence[Any]) -> None:
        self.outbox.count(frames)
        tags = read_tags(frames)
        self.core.data_sent(len(tags), int(tags[0, 0]))


def _as_sampled(entry: Entry) -> Entry:
    """``entry`` with its samples as they were sampled: a bucketed batch (its length-led
    leaves padded) re-encoded as its samples, which any trainer takes; else as it is.
    Once per message dealt again, on a server where a free trainer asked for buckets."""
    message = decode(list(entry.frames))
    assert isinstance(message, Data)
    samples = without_padding(message.samples)
    if samples is not message.samples:
        frames = list(encode(Data(message.tags, samples, message.server_id)))
        return dataclasses.replace(entry, frames=frames, nbytes=0, sampled=True)
    return dataclasses.replace(entry, sampled=True)
