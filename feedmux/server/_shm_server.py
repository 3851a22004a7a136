"""The server's use of the shared-memory pool: when to open it, how a full pool waits.

This module owns the server-side policy around :class:`feedmux._shm.ShmPool`:
a pool only for plain (PUSH) delivery with ``shm`` on, the fall-back to
sockets where ``/dev/shm`` cannot hold it, and the back-pressure of a full pool
(the sampler waits, serving control, and says so once per stall in the log and
in the ``shm_stalls`` statistic). It never overwrites a run in use and never
sends data itself: the shell sends what :func:`place_or_wait` returns.

Reliable mode does not use the pool: it re-deals a dead trainer's messages to
the others, and a run the dead trainer had claimed is taken back as soon as its
pid is gone, so a re-dealt reference could point at reused memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from feedmux._shm import ShmPool, activate
from feedmux.server.config import ServerConfig

__all__ = ["close_pool", "open_pool", "place_or_wait"]

log = logging.getLogger("feedmux.server")

#: Seconds between two looks at the slot table while the pool is full.
STALL_POLL = 0.02


class StopFlag(Protocol):
    def __bool__(self) -> bool: ...


def open_pool(config: ServerConfig) -> ShmPool | None:
    """The pool this server offers, or None (disabled, reliable mode, or no room)."""
    if not config.shm or config.reliable:
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


def place_or_wait(
    pool: ShmPool, frames: Sequence[Any], serve_control: Callable[[float], bool],
    stopping: StopFlag,
) -> list[Any] | None:
    """``frames`` placed in the pool, waiting while it is full; None if the server stops."""
    placed = pool.place(frames)
    if placed is not None:
        return placed
    pool.stalls += 1
    log.warning("shared-memory pool full (%d MiB in use): the sampler waits for the trainers "
                "to drop their views", pool.stats()["shm_bytes_in_use"] >> 20)
    while not stopping:
        serve_control(STALL_POLL)
        pool.reclaim()
        placed = pool.place(frames)
        if placed is not None:
            return placed
    return None
