"""The server's use of the shared-memory pool: when to open it, how a full pool waits.

This module owns the server-side policy around :class:`feedmux._plumbing.shm.ShmPool`:
a pool whenever ``shm`` is on (:func:`open_pool`), a message placed in it only when a
trainer proved it maps the pool (and sent as references only to such a
trainer: the data ROUTER picks each message's trainer, so trainers on other
hosts get the same message over the socket), the fall-back to sockets where
``/dev/shm`` cannot hold it, and the back-pressure of a full pool (the sampler
waits, serving control; every stall counts in the ``shm_stalls`` statistic, and
one that lasts is logged; the wait is the outbox's, so its time counts as blocked).
It never overwrites a run in use and never sends data itself: the senders send
what :func:`pooled` returns.

Ranked trainers get references too, placed in place: the server keeps the
message's frames (its owned copies, runs of the pool) for a successor, and a
run whose memory the server still holds is not reused whatever the trainer's
release says (it is pinned, :mod:`feedmux._plumbing.shmruns`): a restarted rank
gets its predecessor's rest over the socket, from those frames, with no second
copy. With ``--workers N`` the workers write large arrays into their regions of
the pool and forward references; they go on to trainers that map the pool as
they are, and are copied out (one copy) for those that do not. A worker's message
the forwarder decodes (to deal it to ranks, or to cut batches) is read in place
(:class:`~feedmux._plumbing.shm.ForwardedRuns`), and a rank's share of whole
samples goes on as references to the worker's runs, kept for a successor while the
server's frames live. Consumer groups' messages are placed once as they enter
the groups' buffer (:func:`placed_now`, SHARED: each member a message goes to
holds a claim cell of its own on the same runs, and the runs go once the buffer
let the message go and every claim was released, or its trainer died); a ranked
group's shares are placed as they are dealt. Neither waits for a full pool: the
message goes whole. How a message goes to one trainer is a :class:`Via`.
Free trainers get references too, while the ledger keeps the message's
bytes to deal them again (a dead trainer's claimed runs are taken back as soon
as its pid is gone, so only whole bytes, never references, are dealt again).
"""

from __future__ import annotations

import enum
import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from feedmux._plumbing.shm import Placement, ShmPool, has_refs
from feedmux._plumbing.shmtable import SHARED
from feedmux.server._delivery.outbox import Outbox, Wait
from feedmux.server._delivery.registry import TrainerRegistry, shm_trainers
from feedmux.server.config import ServerConfig, disabled

__all__ = ["Via", "close_pool", "open_pool", "place_or_wait", "pooled", "placed_now",
           "settled", "via"]

log = logging.getLogger("feedmux.server")

#: A stall longer than this is logged (a trainer holding its views); shorter ones,
#: ordinary back-pressure of a fast sampler, only count in ``shm_stalls``.
STALL_WARNING = 1.0


def open_pool(config: ServerConfig) -> ShmPool | None:
    """The pool this server offers, or None (disabled, off by the combination table, or no
    room)."""
    if not config.shm:
        return None
    if (off := disabled(config.asks, "shm")) is not None:
        log.info("no shared-memory pool: %s", off)  # the table's OFF rules are logged once
        return None
    pool = ShmPool.create(config.shm_size)
    if pool is not None:
        log.info("shared-memory pool of %d MiB at %s", config.shm_size >> 20, pool.path)
    return pool


def close_pool(pool: ShmPool | None) -> None:
    if pool is not None:
        pool.close()


class Via(enum.Enum):
    """How one message goes to one trainer (:func:`via`)."""

    #: As references to the pool (the trainer maps it).
    POOL = "as references to the pool"
    #: As it is, over the socket (no placement, or a trainer that does not map the pool).
    AS_IS = "as it is"
    #: Not now: too many of its references are on their way to the trainer, or it does
    #: not map the pool and the message holds a worker's references only.
    WAIT = "not now"


def pooled(pool: ShmPool, core: TrainerRegistry, frames: Sequence[Any], outbox: Outbox,
           halted: Callable[[], bool]) -> tuple[Sequence[Any], Placement | None]:
    """What goes on a socket, and ``frames`` placed in the pool for the trainers that map
    it (waiting while it is full) or None: no such trainer, nothing large, or the server
    stops.

    The message may still go to a trainer that does not map the pool (whichever
    free trainer has room takes it): the sender gives the placement back then
    (:meth:`ShmPool.cancel`). Telling the pool it is in use lets the copy that
    makes a drawn array the server's own (in the server or a worker) write it
    there directly. A message a sampling worker forwarded as references is
    copied out for the socket only when a trainer that does not map the pool may
    take it (:func:`via` keeps it from the others otherwise, and gives it
    to a trainer that mapped the pool while it waited), and freed
    at once when it goes to none that does. A rank's message is placed in place
    too: the retention keeps its frames for a successor, and the pool does not
    reuse a run whose memory the server still holds (a pinned or kept run).
    """
    trainers = shm_trainers(core)
    pool.want(bool(trainers))
    placed = None
    if trainers and len(frames) > 2:
        placed = place_or_wait(pool, frames, outbox, halted)
    if not has_refs(frames):
        if placed is not None:
            placed.address(trainers)
        return frames, placed
    if placed is None:  # whole, for the socket: its runs are free once copied
        whole = pool.forwarded.copied_out(frames)
        pool.drop(frames)
        return whole, None
    if len(trainers) == len(core.trainers):
        placed.address(trainers, maps=lambda identity: identity in shm_trainers(core))
        return frames, placed
    placed.address(trainers)
    return pool.forwarded.copied_out(frames), placed


def placed_now(pool: ShmPool, core: TrainerRegistry, frames: Sequence[Any],
               state: int = SHARED) -> Placement | None:
    """``frames`` placed for the consumer groups' members that map the pool, or None: no
    such trainer, nothing large, or the pool is full. ``state`` SHARED: once for every
    group (each member it goes to holds a cell of its own,
    :class:`~feedmux._plumbing.shmtable.SharedRuns`); a sampling worker's references
    become shared as they are (its runs: the worker's copy is the only one); SENT: a
    ranked group's share, for its rank's holder alone.

    A full pool does not hold the groups back: their buffer is what bounds a
    lagging group, and the runs the buffer holds come back only as the groups move
    on, so waiting here could wait for the very message that waits. The message
    goes whole, over the sockets, and counts in ``shm_stalls``.
    """
    trainers = shm_trainers(core)
    pool.want(bool(trainers))
    if not trainers or len(frames) <= 2 or (state != SHARED and has_refs(frames)):
        return None
    placed = pool.place(frames, state=state)
    if placed is None:
        pool.reclaim(pool.owners_due())
        placed = pool.place(frames, state=state)
    if placed is None:
        pool.stalled()
        return None
    if placed.first() < 0:  # nothing large: the socket carries it
        return None
    placed.address(trainers)
    return placed


def settled(pool: ShmPool | None, placed: Placement | None, frames: Sequence[Any],
            sent: bool) -> Sequence[Any]:
    """The message's frames once its send is over: ``placed`` given back unless it was
    delivered as references (:meth:`ShmPool.cancel`); a message not sent keeps its bytes
    (copied out of the runs a worker forwarded, before they are freed), for the consumer
    groups that may have opened while it waited."""
    if pool is None or placed is None:
        return frames
    if not sent:
        frames = pool.forwarded.copied_out(frames)
    pool.cancel(placed)
    return frames


def via(pool: ShmPool | None, placed: Placement | None, target: bytes, cap: int) -> Via:
    """How ``target`` gets the message: as placed in the pool, as it is, or not now
    (``cap`` of its references are still on their way, or it does not map the pool and
    the message is a worker's references only)."""
    if pool is None or placed is None:
        return Via.AS_IS
    if target not in placed.trainers:
        if not placed.refs_only:
            return Via.AS_IS
        if placed.maps is None or not placed.maps(target):
            return Via.WAIT
        placed.also_for(target)  # it mapped the pool while the message waited
    return Via.WAIT if pool.in_transit(target) >= cap else Via.POOL


def place_or_wait(pool: ShmPool, frames: Sequence[Any], outbox: Outbox,
                  halted: Callable[[], bool]) -> Placement | None:
    """``frames`` placed in the pool; while it is full, the outbox's back-pressure wait
    (control served, the time counted as blocked) between two looks at the slot table
    for released runs. None if the server stops meanwhile."""
    placed = pool.place(frames)
    if placed is not None:
        return placed
    pool.stalled()
    started, warned = time.monotonic(), False

    def attempt() -> Wait | None:
        nonlocal placed, warned
        pool.reclaim(pool.owners_due())
        placed = pool.place(frames)
        if placed is not None:
            return None
        if not warned and time.monotonic() - started > STALL_WARNING:
            warned = True
            gc.collect()  # a pinned run held only by a reference cycle comes back now
            log.warning("shared-memory pool full (%d MiB in use) for %.0f s: the sampler waits "
                        "for the trainers to drop their views",
                        pool.stats()["shm_bytes_in_use"] >> 20, STALL_WARNING)
        return Wait.BRIEF  # a release is a store into the slot table: nothing to poll for

    return placed if outbox.deliver(attempt, halted) else None
