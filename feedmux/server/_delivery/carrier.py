"""The carrier: how one data message travels to each trainer, by socket or shared memory.

:class:`Carrier` owns the choice, per message and trainer, between the message
as it is (the socket carries it) and references to the server's shared-memory
pool (for a trainer that proved it maps the pool, with fewer than
``transit_cap`` references on their way to it). A message that the ledger
keeps — a rank's, for a successor; a free trainer's, to be re-dealt — keeps
frames the server holds (a pool run whose memory the server still holds is
pinned, never reused), so a trainer that dies holding references (its runs
are reclaimed once its pid is gone) never takes the kept copy with it. What the
socket carries may go compressed (``--compress``: the choice per trainer is
:mod:`feedmux.server._delivery.compression`'s; the ledger keeps the frames as they
are, so a re-deal or a replay is compressed again for its new trainer). A message a
sampling worker compressed is never placed in the pool: while a trainer maps the pool
it is inflated first (the workers compress only while none does, so that is the moment
one starts mapping it), otherwise it goes on as it is. It never sends (the outbox does)
nor decides who gets a message (the dealer and the ledger do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from feedmux._plumbing.shm import Placement, ShmPool, has_refs
from feedmux._plumbing.shmtable import SHARED
from feedmux.protocol import packed
from feedmux.server._delivery.compression import LinkCompression
from feedmux.server._delivery.outbox import Outbox
from feedmux.server._delivery.pool import Via, placed_now, pooled, settled, via
from feedmux.server._delivery.registry import TrainerRegistry, shm_trainers

__all__ = ["Carrier"]


class Carrier:
    """The shared-memory pool's side of sending (or nothing, without a pool).

    ``outbox`` is the data socket's, whose back-pressure wait a full pool waits in;
    ``halted()`` says when that wait stops (the server stops or restarts);
    ``compression`` chooses, per trainer the socket carries to, whether its messages go
    compressed (None: never).
    """

    def __init__(self, pool: ShmPool | None, core: TrainerRegistry, transit_cap: int,
                 outbox: Outbox, halted: Callable[[], bool],
                 compression: LinkCompression | None = None) -> None:
        self.compression = compression
        self.pool = pool
        self.core = core
        self.transit_cap = transit_cap
        self.outbox = outbox
        self.halted = halted

    def _poolable(self, frames: Sequence[Any]) -> Sequence[Any] | None:
        """``frames`` as the pool takes them (a message a worker compressed inflated,
        while a trainer maps the pool), or None: they go as they are (no pool, or
        compressed with no trainer that maps the pool)."""
        if self.pool is None:
            return None
        if self.compression is not None and packed(frames) is not None:
            self.pool.want(bool(shm_trainers(self.core)))
            if not self.pool.wanted:
                return None
            return self.compression.forms.raw(frames)
        return frames

    def place(self, frames: Sequence[Any], keeps: bool) -> tuple[Sequence[Any], Placement | None]:
        """What goes on a socket, and ``frames`` placed in the pool for the trainers that
        map it (waiting while it is full), or None (no pool, no such trainer, nothing
        large, stopping). ``keeps``: the ledger keeps the message to deal it again to
        another trainer, so what goes on a socket is whole bytes even when every trainer
        maps the pool (a worker's references to runs a dead trainer held would be reused
        memory)."""
        raw = self._poolable(frames)
        if raw is None or self.pool is None:
            return frames, None
        frames = raw
        wire, placed = pooled(self.pool, self.core, frames, self.outbox, self.halted)
        if keeps and placed is not None and placed.refs_only:
            # The ledger's bytes; the trainers get references.
            wire = self.pool.forwarded.copied_out(wire)
        return wire, placed

    def share(self, frames: Sequence[Any], state: int = SHARED) -> Placement | None:
        """``frames`` placed once for every consumer group's members that map the pool
        (:func:`~feedmux.server._delivery.pool.placed_now`; ``state`` SENT: one ranked
        group's share), or None; given back with :meth:`unshare` once no group will be
        sent it (SENT: :meth:`settle`)."""
        return None if self.pool is None else placed_now(self.pool, self.core, frames, state)

    def share_or_whole(self, frames: Sequence[Any]) -> tuple[Sequence[Any], Placement | None]:
        """:meth:`share` for a message as the sampler made it, and the frames the groups'
        buffer (and the free trainers' ledgers) keep of it: whole bytes.

        A sampling worker's references become the shared placement as they are (the
        worker's runs: no copy for the trainers that map the pool) and the frames kept
        are their one copy; when the message cannot be shared (no trainer maps the
        pool, the pool is full) the arrays are copied out and the runs freed. A
        message a worker compressed is inflated first while a trainer maps the pool
        (as :meth:`place` does), else kept as it is."""
        raw = self._poolable(frames)
        if raw is None or self.pool is None:
            return frames, None
        frames = raw
        placed = self.share(frames)
        if not has_refs(frames):
            return frames, placed
        if placed is None:
            return self.whole(frames, drop=True), None
        return self.pool.forwarded.copied_out(frames), placed

    def whole(self, frames: Sequence[Any], drop: bool = False) -> Sequence[Any]:
        """``frames`` with the arrays a sampling worker's references name copied out (the
        runs freed too when ``drop``), or ``frames`` when there is none."""
        if self.pool is None or not has_refs(frames):
            return frames
        whole = self.pool.forwarded.copied_out(frames)
        if drop:
            self.pool.drop(frames)
        return whole

    def decodable(self, frames: Sequence[Any]) -> Sequence[Any]:
        """``frames`` as the decoder reads them: a sampling worker's references copied out
        and its compression undone (a message buffered before a ranked group joined)."""
        frames = self.whole(frames)
        if self.compression is not None and packed(frames) is not None:
            frames = self.compression.forms.raw(frames)
        return frames

    def unshare(self, placed: Placement | None) -> None:
        if placed is not None and self.pool is not None:
            self.pool.shared.unshare(placed)

    def wire(self, target: bytes, frames: Sequence[Any],
             placed: Placement | None) -> Sequence[Any] | None:
        """What goes to ``target``: the message as placed in the pool (a shared
        placement's: naming a claim cell of its own) or as it is (None: not now, see
        :class:`~feedmux.server._delivery.pool.Via`)."""
        how = via(self.pool, placed, target, self.transit_cap)
        if how is Via.WAIT:
            return None
        if how is Via.POOL and placed is not None and self.pool is not None:
            if not placed.shared:
                return placed.frames
            handed = self.pool.shared.hand(placed)  # None: every cell taken, it goes whole
            if handed:
                return handed
        # A groups' message kept as a worker's references (see :meth:`share_or_whole`), for
        # a member that does not map the pool: its own copy of the bytes, for the socket.
        frames = self.whole(frames)
        return frames if self.compression is None else self.compression.wire(target, frames)

    def delivered(self, target: bytes, wire: Sequence[Any], placed: Placement | None) -> None:
        """``wire`` (from :meth:`wire`) went to ``target``."""
        if self.compression is not None:
            self.compression.delivered(target, wire)
        if (placed is not None and self.pool is not None
                and (wire is placed.frames or wire is placed.handed)):
            self.pool.delivered(target, placed)  # its runs are the trainer's to release

    def settle(self, placed: Placement | None, frames: Sequence[Any],
               sent: bool) -> Sequence[Any]:
        """Done with ``placed`` (its runs back unless delivered as references); the
        message's frames from now on (whole bytes if it was not sent)."""
        return settled(self.pool, placed, frames, sent)
