"""The server's own process as a sampling seat: ``--workers auto`` at a count of one.

A worker process costs every message twice: the worker encodes and sends it, the
server receives it, and both processes poll and hand turns over (``--workers
auto`` at one worker used 2-4x the CPU of ``--workers 1`` for the same samples,
docs/autoscale.md). So while ``auto`` (or ``feedmux scale 1`` on an ``auto``
server) wants one sampling process, that process is the server's:
:class:`InProcessSeat` runs the shards of the pool's *home* seat
(:attr:`WorkerPool.home`) in the forwarding loop, with the same
:class:`~feedmux.server._sources.runner.SeatRunners` a worker runs, and hands each
message it draws straight to the forwarding run (no socket, no copy, no
compression: :meth:`_Run.take` as if it came from a worker). Its shards are
assigned, ticketed and resumed exactly as a worker's are: when more processes are
wanted, the staffing forks them and the shards move to them (new tickets, the new
owners replay up to where the server's ledger stands); back at one, the workers are
asked to end and the shards move home the same way (what they still had on their
way is dropped by its old ticket). The seated sequence is that of any other count.

Why a seat and not a switch to the one-process loop of ``--workers 1``
(``produce`` over :class:`~feedmux.server._sources.shards.MergedShards`): the
forwarding loop's merge, numbering, ranked stage and ledger stay the one path of
an ``auto`` server, so a change of the count is a move of shards, the mechanism the
tickets already make exact, and never a hand-over between two loops with their own
positions and stages. What it costs over ``--workers 1``: messages cut at the merge
block (a worker's, so that a shard can move mid-epoch), and the merge's bookkeeping
per message.

Control is answered while a draw lasts (a sampler of seconds a sample) by the
stand-in thread of ``--workers 1`` (:class:`~feedmux.server._standin.ControlStandIn`),
around each draw only. A sampler that crashes the process (a segfault) takes the
server with it at a count of one, as with ``--workers 1``; a fixed ``--workers N``
always samples in worker processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any

from feedmux._plumbing.shm import ShmPool
from feedmux.protocol import Error
from feedmux.server._control.meters import SamplerMeter
from feedmux.server._sources.owning import DrawnItems
from feedmux.server._sources.producer import Frames, SampleErrors, _Draw, error_message
from feedmux.server._sources.runner import SeatRunners, ShardRunner
from feedmux.server._sources.skips import SkipGuard
from feedmux.server._sources.workers import WorkerPool
from feedmux.server.config import ServerConfig

__all__ = ["InProcessSeat"]

#: The seat of a pool that never samples in the server: no shard is ever assigned to it.
NOWHERE = -2


class InProcessSeat:
    """The shards the pool assigns to its home seat, drawn in this process.

    Parameters
    ----------
    pool : WorkerPool
        Its :attr:`~WorkerPool.home` is this seat (None: a fixed count, which never
        samples here; the seat then draws nothing).
    config : ServerConfig
        The run's configuration (seed resolved).
    shm : ShmPool, optional
        The server's shared-memory pool: large drawn arrays are copied into it.
    meanwhile : callable
        What runs around each draw (the control stand-in's ``drawing``).
    """

    def __init__(self, pool: WorkerPool, config: ServerConfig, shm: ShmPool | None,
                 meanwhile: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 ) -> None:
        seat = NOWHERE if pool.home is None else pool.home
        self._pool = pool
        self._server_id = config.server_id
        self.meter = SamplerMeter() if seat == NOWHERE else pool.meters[seat]
        # As a worker: its shards' part of an epoch only (the shards may move).
        errors = SampleErrors(config.on_error == "skip", self.meter,
                              guard=SkipGuard(config.max_skips, whole_epochs=False))
        drawn = _Draw(DrawnItems(shm) if config.policy.copy_arrays else None, errors.hook(),
                      shm, errors, self.meter, meanwhile)
        self._runners = SeatRunners(pool.parts, config, seat, pool.block, drawn)

    def ready(self, readable: Collection[int]) -> ShardRunner | None:
        """The runner to draw from now: the first of this seat's shards in merge order
        whose epoch is released, when the merge may take its message (``readable``: the
        shards it reads now); else None."""
        pool = self._pool
        runners = self._runners
        runners.follow(pool.assignment)
        runner = runners.next(pool.released)
        return runner if runner is not None and runner.index in readable else None

    def draw(self, runner: ShardRunner, take: Callable[[int, int, Frames], None],
             ) -> Error | None:
        """Draw ``runner``'s next message (or end of epoch) and hand it to
        ``take(shard, ticket, frames)``; the error that ends the run, as a worker would
        have sent it, if the draw raised."""
        shard, ticket = runner.index, runner.ticket

        def send(frames: Frames) -> bool:
            take(shard, ticket, frames)
            return True

        try:
            runner.step(send, self.meter, self._pool.batch_size)
        except Exception as error:
            return error_message(error, self._server_id)
        return None

    def close(self) -> None:
        """Close the shards' activations (the server stops)."""
        self._runners.close()
