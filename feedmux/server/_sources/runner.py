"""One shard as a worker runs it: its epochs, a message at a time, from where it was handed over.

A worker process runs the shards it owns through one :class:`ShardRunner` each
(kept to the assignment by :class:`SeatRunners`, which the server's own process
uses too at a count of one, so that resuming at a ticket is one code) and
:func:`next_runner` says which draws next: the shard that comes first in the
server's merge order among those whose epoch the server has released, so a
worker's messages reach the server about in the order it takes them. A runner
starts at the point of its assignment (a shard that moved mid-epoch is drawn
again up to there and those items discarded: ``EpochIterator.resume_at``), cuts
its messages at the merge's block boundaries of its own epoch, numbers them in
that epoch (the server renumbers across shards) and tags each with its shard and
ticket (:func:`~feedmux.server._sources.assignment.pack_shard`). It never
decides what it owns (the server's assignment does) and never touches a socket
(``send`` does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from feedmux.protocol import EndOfEpoch, encode, stacking_into
from feedmux.sampling.epochs import EpochIterator
from feedmux.sampling.mux import restart_passes
from feedmux.server._delivery.outbox import Frames
from feedmux.server._sources.assignment import Assignment, pack_shard
from feedmux.server._sources.meters import SamplerMeter
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import Draw, Pacer, encode_batch, skip_epoch
from feedmux.server._sources.shards import ShardRandom
from feedmux.server.config import ServerConfig

__all__ = ["SIZE_EVERY", "SeatRunners", "ShardRunner", "next_runner"]

#: In the server's own process, the chunks whose sample size the pacers look at: one in so
#: many (the time of every chunk counts).
SIZE_EVERY = 8


class ShardRunner:
    """The epochs of one shard under one ticket, drawn a message at a time.

    Parameters
    ----------
    part : Streamer
        The shard.
    index, shards : int
        The shard's index and the run's number of shards.
    ticket : int
        The assignment this runner serves.
    start : (epoch, position)
        Where it starts: (1, 0) from the beginning.
    block : int
        The merge's samples per turn (messages never cross a multiple of it).
    """

    def __init__(self, part: Any, index: int, shards: int, config: ServerConfig, ticket: int,
                 start: tuple[int, int], block: int, drawn: Draw) -> None:
        assert config.seed is not None  # resolved by the server before the pool
        self.index = index
        self.ticket = ticket
        self.block = block
        self.random = ShardRandom(config.seed, index, shards)
        # This process may have run the shard before (it moved away and back): its muxes
        # count passes from the start again, so that epoch e is the pass of epoch e.
        restart_passes(part)
        self.epochs: EpochIterator[Any] = EpochIterator(
            part, max_epochs=config.epochs, on_epoch_start=self.random.start_epoch)
        if start != (1, 0):
            self.epochs.resume_at(*start)
        #: The epoch it draws next, and how many of its samples went out.
        self.epoch, self.count = start
        self.done = False
        self._config = config
        self._drawn = drawn
        self._pacer = Pacer(BatchPolicy.of(config))
        self._seq = pack_shard(index, ticket)
        self._pending: tuple[Any, Any] | None = None
        #: Chunks handed to ``keep`` (:meth:`step`): their size is looked at every
        #: ``SIZE_EVERY``-th only (building a stacked chunk's first sample to measure it
        #: was a tenth of the server's CPU at a count of one).
        self._kept = 0

    def rank(self) -> tuple[int, int, int]:
        """Its place in the merge order: (epoch, blocks sent in it, shard)."""
        return self.epoch, self.count // self.block, self.index

    def at_boundary(self) -> bool:
        """Whether its next draw starts a merge block (a turn may pass on here)."""
        return self.count % self.block == 0

    def step(self, send: Callable[[Frames], bool], meter: SamplerMeter,
             batch_size: int = 0,
             keep: Callable[[np.ndarray, Sequence[Any]], None] | None = None) -> bool:
        """Draw and send its next message (or its end of epoch); False when ``send`` is.

        ``batch_size``: the server cuts the messages into batches of that size, so a
        message is filled up to the merge block (a batch's time to sample, not
        ``max_delay``, bounds it: see the pacer).

        ``keep(tags, samples)``, in the server's own process: takes the drawn chunk as
        it is instead (the server encodes the chunks of several turns into one message:
        :mod:`feedmux.server._sources.inprocess`); its end of epoch is still sent.
        """
        clock = time.perf_counter
        started = clock()
        self.random.enter()
        config = self._config
        limit = min(self._pacer.limit(batch_size), self.block - self.count % self.block)
        if self._pending is not None:
            (chunk, items), self._pending = self._pending, None
        else:
            try:
                chunk, items = self._drawn.take(self.epochs, limit)
            except StopIteration:
                self.done = True
                return True
            except Exception as error:
                skip_epoch(error, config.on_error == "skip", meter, self._drawn.errors)
                return self._end(send)
            if keep is None or not self._kept % SIZE_EVERY:
                self._pacer.observe(items, clock() - started)
            else:  # the server joins the chunks into its own messages, sized by its pacer
                self._pacer.observe_time(len(items), clock() - started)
            if chunk.epoch != self.epoch:
                # Resumed at the very end of its epoch: the server still needs that end,
                # and the next epoch's first chunk waits for the server to release it.
                self._pending = (chunk, items)
                return self._end(send)
        if items:
            tags = np.empty((len(items), 2), dtype=np.int64)
            tags[:, 0] = chunk.epoch
            tags[:, 1] = np.arange(self.count, self.count + len(items))
            if keep is not None:
                keep(tags, items)
                meter.add_busy(clock() - started)
                self.count += len(items)
                self._kept += 1
                return self._end(send) if chunk.last else True
            shm = self._drawn.shm
            # While a trainer maps the pool, a stacked leaf is made in this worker's region:
            # the message goes as references to it, without a copy into the pool on top of
            # the stacking (an image batch's samples were copied twice).
            with stacking_into(shm.empty if shm is not None and shm.wanted else None):
                frames, count = encode_batch(tags, items, config.server_id, self._seq,
                                              config.on_error == "skip", self._drawn.errors,
                                              close_ranks=True)
            meter.add_busy(clock() - started)
            if frames:
                if not send(frames):
                    return False
                self.count += count
                if self._drawn.errors is not None:
                    self._drawn.errors.sent(count)
        return self._end(send) if chunk.last else True

    def _end(self, send: Callable[[Frames], bool]) -> bool:
        sent = send(encode(EndOfEpoch(epoch=self.epoch, count=self.count, worker=self._seq)))
        self.epoch += 1
        self.count = 0
        return sent

    def close(self) -> None:
        """Close the shard's current activation (it moved to another worker)."""
        self.epochs.close()


def next_runner(runners: Iterable[ShardRunner], released: int) -> ShardRunner | None:
    """The runner to draw from next: the first in merge order whose epoch is released.

    >>> next_runner([], released=1) is None
    True
    """
    ready = [runner for runner in runners if not runner.done and runner.epoch <= released]
    return min(ready, key=ShardRunner.rank, default=None)


class SeatRunners:
    """The runners of the shards one seat owns, kept to the assignment.

    A worker process has one for its seat, and so has the server at a count of one
    (:mod:`feedmux.server._sources.inprocess`): both follow the same assignment with
    the same code, so a shard that comes to either resumes at its ticket's point
    (replaying up to it) the same way, and one that leaves is closed the same way.
    """

    def __init__(self, parts: list[Any], config: ServerConfig, seat: int, block: int,
                 drawn: Draw) -> None:
        self.parts, self.config, self.seat, self.block = parts, config, seat, block
        self.drawn = drawn
        self.runners: dict[int, ShardRunner] = {}
        self._seen = -1

    def follow(self, assignment: Assignment) -> None:
        """Close the runners of the shards that left (or got a new ticket) and start those
        of the shards that came, when the assignment changed since last looked at."""
        if assignment.version == self._seen:
            return
        self._seen, owned = assignment.read(self.seat)
        runners = self.runners
        for index in list(runners):
            if owned.get(index, (0,))[0] != runners[index].ticket:
                runners.pop(index).close()
        for index, (ticket, epoch, position) in owned.items():
            if index not in runners:
                runners[index] = ShardRunner(self.parts[index], index, len(self.parts),
                                             self.config, ticket, (epoch, position),
                                             self.block, self.drawn)

    def next(self, released: int) -> ShardRunner | None:
        """The runner to draw from next (:func:`next_runner`)."""
        return next_runner(self.runners.values(), released)

    def close(self) -> None:
        """Close every runner (the seat ends)."""
        for runner in self.runners.values():
            runner.close()
        self.runners.clear()
