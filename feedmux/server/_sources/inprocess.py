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
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

import numpy as np

from feedmux._plumbing.shm import ShmPool
from feedmux.protocol import Error, stacking_into, take_samples
from feedmux.server._delivery.outbox import Frames
from feedmux.server._sources.meters import SamplerMeter
from feedmux.server._sources.owning import DrawnItems
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import (
    Draw,
    Pacer,
    SampleErrors,
    encode_batch,
    error_message,
)
from feedmux.server._sources.runner import SIZE_EVERY, SeatRunners, ShardRunner
from feedmux.server._sources.skips import SkipGuard
from feedmux.server._sources.workers import WorkerPool
from feedmux.server.config import ServerConfig

__all__ = ["Drawn", "InProcessSeat"]

#: The seat of a pool that never samples in the server: no shard is ever assigned to it.
NOWHERE = -2


class Drawn(NamedTuple):
    """A chunk the server's own process drew of one shard: its tags (epoch, position in
    the shard's epoch) and its samples, not encoded yet."""

    tags: np.ndarray
    samples: Sequence[Any]


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
        self._config = config
        self._shm = shm
        self.meter = SamplerMeter() if seat == NOWHERE else pool.meters[seat]
        # As a worker: its shards' part of an epoch only (the shards may move).
        self.errors = SampleErrors(config.on_error == "skip", self.meter,
                                   guard=SkipGuard(config.max_skips, whole_epochs=False))
        drawn = Draw(DrawnItems(shm) if BatchPolicy.of(config).copy_arrays else None,
                      self.errors.hook(), shm, self.errors, self.meter, meanwhile)
        self._runners = SeatRunners(pool.parts, config, seat, pool.block, drawn)
        #: Sizes the messages made of the chunks (as ``--workers 1`` sizes its own).
        self._pacer = Pacer(BatchPolicy.of(config))
        #: CPU seconds of this thread in the draws: what ``auto`` measures as the CPU of
        #: the sampling process at one (the server's forwarding is no worker's work).
        self.cpu_seconds = 0.0
        self._draws = 0  # the message sizes look at the samples' size every SIZE_EVERY-th
        pool.home_cpu = lambda: self.cpu_seconds

    def ready(self, readable: Collection[int]) -> ShardRunner | None:
        """The runner to draw from now: the first of this seat's shards in merge order
        whose epoch is released, when the merge may take its message (``readable``: the
        shards it reads now); else None."""
        pool = self._pool
        runners = self._runners
        runners.follow(pool.assignment)
        runner = runners.next(pool.released)
        return runner if runner is not None and runner.index in readable else None

    def limit(self) -> int:
        """Samples of the next message (the pacer's: ``samples_per_message``, the payload
        target, ``max_delay`` of drawing, the trainers' batch size)."""
        return self._pacer.limit(self._pool.batch_size)

    def draw(self, readable: Callable[[], Collection[int]],
             keep: Callable[[int, int, np.ndarray, Sequence[Any], int], None],
             take: Callable[[int, int, Frames], None]) -> Error | int:
        """Draw chunks of this seat's shards in merge order, each handed to
        ``keep(shard, ticket, tags, samples, nbytes)`` (its ends of epoch to ``take(shard,
        ticket, frames)``), until a message's worth (:meth:`limit`) or nothing more may be
        drawn now; how many steps it drew, or the error that ends the run, as a worker
        would have sent it, if a draw raised."""
        limit = self.limit()
        batch_size = self._pool.batch_size
        steps = samples = 0
        started, cpu = time.perf_counter(), time.thread_time()
        while samples < limit and (runner := self.ready(readable())) is not None:
            before = runner.count
            try:
                self._step(runner, keep, take, batch_size,
                           observe=not steps and not self._draws % SIZE_EVERY)
            except Exception as error:
                return error_message(error, self._config.server_id)
            steps += 1
            samples += max(0, runner.count - before)  # an end of epoch counts none
        self.cpu_seconds += time.thread_time() - cpu
        self._draws += 1
        if samples:  # the pacer's time per sample, from the whole message's draws
            self._pacer.observe_time(samples, time.perf_counter() - started)
        return steps

    def _step(self, runner: ShardRunner,
              keep: Callable[[int, int, np.ndarray, Sequence[Any], int], None],
              take: Callable[[int, int, Frames], None], batch_size: int,
              observe: bool) -> None:
        """One step of ``runner`` (a chunk, or its end of epoch), handed on; the first of
        a message (``observe``) gives the pacer its sample size."""
        shard, ticket, pacer = runner.index, runner.ticket, self._pacer

        def kept(tags: np.ndarray, items: Sequence[Any]) -> None:
            if observe and items:
                pacer.observe_size(items[0])
            keep(shard, ticket, tags, items, len(items) * pacer.item_bytes)

        def send(frames: Frames) -> bool:
            take(shard, ticket, frames)
            return True

        runner.step(send, self.meter, batch_size, keep=kept)

    def encode(self, chunks: list[Drawn]) -> Frames | None:
        """One data message of ``chunks`` (consecutive in merge order, of one epoch), their
        positions those of their shards (the forwarder numbers them); the samples the codec
        refuses are skipped or raised as a worker's would be. None when none is left."""
        config, shm = self._config, self._shm
        with stacking_into(shm.empty if shm is not None and shm.wanted else None):
            if len(chunks) == 1:
                tags, samples = chunks[0]
            else:
                tags = np.concatenate([chunk.tags for chunk in chunks])
                samples = take_samples([(chunk.samples, slice(None)) for chunk in chunks])
            frames, count = encode_batch(tags, samples, config.server_id, 0,
                                          config.on_error == "skip", self.errors,
                                          close_ranks=True)
        self.errors.sent(count)
        return frames or None

    def close(self) -> None:
        """Close the shards' activations (the server stops)."""
        self._runners.close()
