"""The server's use of the shared-memory pool: when to open it, how a full pool waits.

This module owns the server-side policy around :class:`feedmux._plumbing.shm.ShmPool`:
a pool for plain delivery with ``shm`` on, a message placed in it only when a
trainer proved it maps the pool (and sent as references only to such a
trainer: the data ROUTER picks each message's trainer, so trainers on other
hosts get the same message over the socket), the fall-back to sockets where
``/dev/shm`` cannot hold it, and the back-pressure of a full pool (the sampler
waits, serving control; every stall counts in the ``shm_stalls`` statistic, and
one that lasts is logged). It never overwrites a run in use and never sends
data itself: the shell sends what :func:`place_or_wait` returns.

Ranked trainers get references too, placed in place: the server keeps the
message's frames (its owned copies, runs of the pool) for a successor, and a
run whose memory the server still holds is not reused whatever the trainer's
release says (it is pinned, :mod:`feedmux._plumbing.shmruns`): a restarted rank
gets its predecessor's rest over the socket, from those frames, with no second
copy. With ``--workers N`` the workers write large arrays into their regions of
the pool and forward references; they go on to trainers that map the pool as
they are, and are copied out (one copy) for those that do not. Consumer groups
get their messages over the sockets (a group's buffer is read by every group).
Reliable trainers get references too, while the ledger keeps the message's
bytes to deal them again (a dead trainer's claimed runs are taken back as soon
as its pid is gone, so only whole bytes, never references, are dealt again).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from feedmux._plumbing.shm import Placement, ShmPool, activate, has_refs
from feedmux.server._control.core import ControlCore, shm_trainers
from feedmux.server.config import ServerConfig, disabled

__all__ = ["close_pool", "open_pool", "place_or_wait", "pooled", "settled", "through_pool"]

log = logging.getLogger("feedmux.server")

#: Seconds between two looks at the slot table while the pool is full: the first
#: looks come quickly (a run is usually released within a sample's time), then
#: they back off to the longest.
STALL_POLL_FIRST = 0.0002
STALL_POLL_LONGEST = 0.02
#: A stall longer than this is logged (a trainer holding its views); shorter ones,
#: ordinary back-pressure of a fast sampler, only count in ``shm_stalls``.
STALL_WARNING = 1.0


class StopFlag(Protocol):
    def __bool__(self) -> bool: ...


def open_pool(config: ServerConfig) -> ShmPool | None:
    """The pool this server offers, or None (disabled, reliable mode, or no room)."""
    if not config.shm:
        return None
    if (off := disabled(config.asks, "shm")) is not None:
        log.info("no shared-memory pool: %s", off)  # the table's OFF rules are logged once
        return None
    pool = ShmPool.create(config.shm_size)
    if pool is not None:
        activate(pool)
        log.info("shared-memory pool of %d MiB at %s", config.shm_size >> 20, pool.path)
    return pool


def close_pool(pool: ShmPool | None) -> None:
    if pool is not None:
        activate(None)
        pool.close()


def pooled(pool: ShmPool, core: ControlCore, frames: Sequence[Any],
           serve_control: Callable[[float], bool],
           stopping: StopFlag) -> tuple[Sequence[Any], Placement | None]:
    """What goes on a socket, and ``frames`` placed in the pool for the trainers that map
    it (waiting while it is full) or None: no such trainer, nothing large, or the server
    stops.

    The message may still go to a trainer that does not map the pool (whichever
    free trainer has room takes it): the sender gives the placement back then
    (:meth:`ShmPool.cancel`). Telling the pool it is in use lets the copy that
    makes a drawn array the server's own (in the server or a worker) write it
    there directly. A message a sampling worker forwarded as references is
    copied out for the socket only when a trainer that does not map the pool may
    take it (:func:`through_pool` keeps it from the others otherwise, and gives it
    to a trainer that mapped the pool while it waited), and freed
    at once when it goes to none that does. A rank's message is placed in place
    too: the retention keeps its frames for a successor, and the pool does not
    reuse a run whose memory the server still holds (a pinned run).
    """
    trainers = shm_trainers(core)
    pool.wanted = bool(trainers)
    placed = None
    if trainers and len(frames) > 2:
        placed = place_or_wait(pool, frames, serve_control, stopping)
    if not has_refs(frames):
        if placed is not None:
            placed.trainers = frozenset(trainers)
        return frames, placed
    if placed is None:  # whole, for the socket: its runs are free once copied
        whole = pool.copied_out(frames)
        pool.drop(frames)
        return whole, None
    placed.trainers = frozenset(trainers)
    if len(trainers) == len(core.trainers):
        placed.refs_only = True
        placed.maps = lambda identity: identity in shm_trainers(core)
        return frames, placed
    return pool.copied_out(frames), placed


def settled(pool: ShmPool | None, placed: Placement | None, frames: Sequence[Any],
            sent: bool) -> Sequence[Any]:
    """The message's frames once its send is over: ``placed`` given back unless it was
    delivered as references (:meth:`ShmPool.cancel`); a message not sent keeps its bytes
    (copied out of the runs a worker forwarded, before they are freed), for the consumer
    groups that may have opened while it waited."""
    if pool is None or placed is None:
        return frames
    if not sent:
        frames = pool.copied_out(frames)
    pool.cancel(placed)
    return frames


def through_pool(pool: ShmPool | None, placed: Placement | None, target: bytes,
                 cap: int) -> bool | None:
    """Whether ``target`` gets the message as placed in the pool (True) or as it is
    (False), or must wait (None): ``cap`` of its references are still on their way, or it
    does not map the pool and the message is a worker's references only."""
    if pool is None or placed is None:
        return False
    if target not in placed.trainers:
        if not placed.refs_only:
            return False
        if placed.maps is None or not placed.maps(target):
            return None
        placed.trainers |= {target}  # it mapped the pool while the message waited
    return None if pool.in_transit(target) >= cap else True


def place_or_wait(
    pool: ShmPool, frames: Sequence[Any], serve_control: Callable[[float], bool],
    stopping: StopFlag,
) -> Placement | None:
    """``frames`` placed in the pool, waiting while it is full; None if the server stops."""
    placed = pool.place(frames)
    if placed is not None:
        return placed
    pool.stalls += 1
    started = time.monotonic()
    pause, warned = STALL_POLL_FIRST, False
    while not stopping:
        if pause < 0.001:
            time.sleep(pause)
        serve_control(0 if pause < 0.001 else pause)
        pool.reclaim(pool.owners_due())
        placed = pool.place(frames)
        if placed is not None:
            return placed
        pause = min(pause * 2, STALL_POLL_LONGEST)
        if not warned and time.monotonic() - started > STALL_WARNING:
            warned = True
            gc.collect()  # a pinned run held only by a reference cycle comes back now
            log.warning("shared-memory pool full (%d MiB in use) for %.0f s: the sampler waits "
                        "for the trainers to drop their views",
                        pool.stats()["shm_bytes_in_use"] >> 20, STALL_WARNING)
    return None
