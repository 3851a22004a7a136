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

Ranked and reliable trainers get references too, while the server keeps the
message as drawn (its own copy, never a pool run) in its ledger: a restarted
rank gets its predecessor's rest, and reliable mode re-deals a dead trainer's
messages to the others, over the socket from those frames (a run the dead
trainer had claimed is taken back as soon as its pid is gone, so a re-dealt
reference could point at reused memory). Consumer groups get their messages
over the sockets (a group's buffer is read by every group).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from feedmux._plumbing.shm import Placement, ShmPool, activate
from feedmux.server.config import ServerConfig

__all__ = ["close_pool", "open_pool", "place_or_wait", "pooled", "through_pool"]

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
    """The pool this server offers, or None (disabled, or no room)."""
    if not config.shm:
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


def pooled(pool: ShmPool, trainers: set[bytes], frames: Sequence[Any],
           serve_control: Callable[[float], bool], stopping: StopFlag,
           ranked: bool = False) -> Placement | None:
    """``frames`` placed in the pool for the ``trainers`` that map it (waiting while it
    is full), or None: no such trainer, nothing large, or the server stops.

    The message may still go to a trainer that does not map the pool (whichever
    free trainer has room takes it): the sender gives the placement back then
    (:meth:`ShmPool.cancel`). For free trainers, telling the pool it is in use lets
    the copy that makes a drawn array the server's own write it there directly. A
    rank's messages are kept (the frames as drawn) until it handed them out, for a
    successor: those frames must not be pool runs a trainer frees, so a ranked
    message is copied into the pool whole and its frames stay the server's.
    """
    if not ranked:
        pool.wanted = bool(trainers)
    if not trainers or len(frames) <= 2:
        return None
    placed = place_or_wait(pool, frames, serve_control, stopping, in_place=not ranked)
    if placed is not None:
        placed.trainers = frozenset(trainers)
    return placed


def through_pool(pool: ShmPool | None, placed: Placement | None, target: bytes,
                 cap: int) -> bool | None:
    """Whether ``target`` gets the message as placed in the pool (True) or as it is
    (False), or must wait (None): ``cap`` of its references are still on their way."""
    if pool is None or placed is None or target not in placed.trainers:
        return False
    return None if pool.in_transit(target) >= cap else True


def place_or_wait(
    pool: ShmPool, frames: Sequence[Any], serve_control: Callable[[float], bool],
    stopping: StopFlag, in_place: bool = True,
) -> Placement | None:
    """``frames`` placed in the pool, waiting while it is full; None if the server stops."""
    placed = pool.place(frames, in_place=in_place)
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
        placed = pool.place(frames, in_place=in_place)
        if placed is not None:
            return placed
        pause = min(pause * 2, STALL_POLL_LONGEST)
        if not warned and time.monotonic() - started > STALL_WARNING:
            warned = True
            log.warning("shared-memory pool full (%d MiB in use) for %.0f s: the sampler waits "
                        "for the trainers to drop their views",
                        pool.stats()["shm_bytes_in_use"] >> 20, STALL_WARNING)
    return None
