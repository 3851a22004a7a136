"""The order in which the server merges its sampling workers' messages.

This module owns the rule that makes a seeded server with ``--workers N`` a
deterministic sequence of (epoch, position, sample): the forwarder takes the
next message from the worker chosen by :meth:`MergeOrder.next_worker`, a rule
of each worker's own sample counts in the epoch only (never of arrival times),
and numbers positions in that order. The workers cut their messages at
multiples of the block (``produce(..., align=block)``), so the merged order of
samples does not depend on how many samples each message happened to carry.
:class:`Merge` holds the messages read ahead of their turn and hands them out
in that order, or in arrival order for an unseeded run, which asked for no
repeatable sequence and so pays nothing for one. It is pure (no sockets, no
clocks) and must never decide anything but which message comes next.

What the fixed order costs: the forwarder forwards only the worker whose turn
it is while the others' messages wait; they wait in their queues (``hwm``
messages each way) and in a read-ahead of :data:`READ_AHEAD_BYTES` per worker
here, so a worker that is descheduled for a moment holds the others back only
once they have filled all of that; a worker that is slower for good still
holds the server to about N times its rate instead of the sum of the rates.
Without a fixed ``samples_per_message`` a message holds at most one turn
(:data:`MERGE_BLOCK` samples), which costs small, fast samples some
per-message overhead.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from feedmux.errors import FeedmuxError

__all__ = ["MERGE_BLOCK", "MIN_READ_AHEAD_BYTES", "READ_AHEAD_BYTES", "Merge", "MergeOrder",
           "merge_block"]

T = TypeVar("T")

#: Samples a worker contributes per turn when the message size is not fixed. Small,
#: because a worker waiting for its turn must be able to queue a whole turn: with
#: slow samples every message holds one sample, and the queues hold ``2 * hwm``
#: messages (the worker's send queue and the server's receive queue).
MERGE_BLOCK = 16


#: Bytes of messages the forwarder reads ahead of their turn, per worker (beyond the
#: ``hwm`` queues), so that a worker descheduled on a busy machine does not stall the
#: others at once. Each message counts :data:`MESSAGE_OVERHEAD` more, for its objects.
READ_AHEAD_BYTES = 32 << 20
#: The least read-ahead per shard when :data:`READ_AHEAD_BYTES` is shared among many.
MIN_READ_AHEAD_BYTES = 4 << 20
MESSAGE_OVERHEAD = 512


def merge_block(samples_per_message: int | None, hwm: int) -> int:
    """The samples of one worker's turn: one fixed-size message, else what the queues hold.

    With a fixed message size a turn is one message. Otherwise it is
    :data:`MERGE_BLOCK` samples, or fewer when the queues are shorter
    (``2 * hwm`` messages of at least one sample), so that the workers not
    on turn keep sampling instead of waiting for theirs.

    Examples
    --------
    >>> merge_block(None, hwm=8), merge_block(100, hwm=8), merge_block(None, hwm=2)
    (16, 100, 4)
    """
    return samples_per_message or min(MERGE_BLOCK, 2 * hwm)


class MergeOrder:
    """Whose message the forwarder takes next: workers in turn, a block of samples each.

    The next worker is the one with the fewest complete blocks forwarded in
    this epoch (the lowest index on a tie) among those that have not ended
    the epoch: 0, 1, ..., N-1, 0, 1, ... while every shard lasts, the others
    in the same rotation once one has ended. When every worker has ended the
    epoch, the counts start again for the next one.

    Parameters
    ----------
    workers : int >= 1
        The number of sampling workers.
    block : int >= 1
        Samples per worker per turn.

    Examples
    --------
    >>> order = MergeOrder(workers=2, block=3)
    >>> turns = []
    >>> for count in (2, 1, 3, 3, 1):  # worker 1's shard ends after 4 samples
    ...     worker = order.next_worker()
    ...     turns.append(worker)
    ...     order.took(worker, count)
    >>> turns
    [0, 0, 1, 0, 1]
    >>> order.ended(1), order.next_worker(), order.ended(0)
    (False, 0, True)
    >>> order.next_worker()  # the next epoch starts with worker 0
    0
    """

    def __init__(self, workers: int, block: int) -> None:
        if workers < 1 or block < 1:
            raise ValueError(f"expected workers >= 1 and block >= 1, got {workers} and {block}")
        self.workers = workers
        self.block = block
        self._counts = [0] * workers
        self._ended = [False] * workers
        # The answer of next_worker until took() or ended() changes it: asked once per
        # turn by the merge and once by the turn's check, it is worked out once.
        self._next: int | None = None

    def next_worker(self) -> int:
        """The worker whose next message must be forwarded now."""
        found = self._next
        if found is None:
            block, counts, ended = self.block, self._counts, self._ended
            found, fewest = -1, 0
            for index in range(self.workers):
                if not ended[index]:
                    turns = counts[index] // block
                    if found < 0 or turns < fewest:
                        found, fewest = index, turns
            self._next = found
        return found

    def took(self, worker: int, samples: int) -> None:
        """Record that ``samples`` samples of ``worker`` were forwarded."""
        self._check_turn(worker, "sent data")
        self._counts[worker] += samples
        self._next = None

    def ended(self, worker: int) -> bool:
        """Record that ``worker`` ended the epoch; True when every worker has (then reset)."""
        self._check_turn(worker, "ended the epoch")
        self._ended[worker] = True
        self._next = None
        if not all(self._ended):
            return False
        self._counts = [0] * self.workers
        self._ended = [False] * self.workers
        return True

    def _check_turn(self, worker: int, what: str) -> None:
        # The forwarder reads only the socket of the worker whose turn it is.
        expected = self.next_worker()
        if worker != expected:
            raise FeedmuxError(
                f"expected a message from sampling worker {expected}, got one from worker "
                f"{worker} ({what}) out of turn"
            )


class Merge(Generic[T]):
    """Messages read from the workers, handed out in merge order.

    With a ``block``, in the fixed order of :class:`MergeOrder`; the
    forwarder reads ahead from every worker whose read-ahead holds less than
    ``read_ahead`` bytes (:meth:`readable`), and the worker whose turn it is
    is always readable, so the merge never waits on a full buffer. Without a
    block, in arrival order (nothing is held back). Either way it tells when
    every worker has ended the epoch.

    Parameters
    ----------
    workers : int >= 1
        The number of sampling workers.
    block : int >= 1 or None
        Samples per worker per turn; None merges in arrival order.
    read_ahead : int
        Bytes held per worker before its socket is no longer read ahead of its turn.

    Examples
    --------
    >>> merge = Merge(workers=2, block=1)
    >>> merge.put(1, "b0", samples=1, nbytes=10); merge.next()  # worker 0's turn
    >>> merge.put(0, "a0", samples=1, nbytes=10); merge.next(), merge.next()
    (('a0', False), ('b0', False))
    >>> merge.put(0, "end", samples=None, nbytes=0); merge.put(1, "end", samples=None, nbytes=0)
    >>> merge.next(), merge.next()
    (('end', False), ('end', True))
    >>> arrival = Merge(workers=2, block=None)
    >>> arrival.put(1, "b0", samples=1, nbytes=10); arrival.next()
    ('b0', False)
    """

    def __init__(self, workers: int, block: int | None,
                 read_ahead: int = READ_AHEAD_BYTES) -> None:
        self.workers = workers
        self.order = None if block is None else MergeOrder(workers, block)
        self.read_ahead = read_ahead
        # Per worker: (item, samples or None for its end of epoch, bytes held).
        self._queues: list[deque[tuple[T, int | None, int]]] = [
            deque() for _ in range(workers)
        ]
        self._held = [0] * workers
        self._arrivals: deque[int] = deque()  # arrival order: whose item came next
        self._ended: set[int] = set()

    def readable(self) -> list[int]:
        """The workers whose sockets the forwarder should read now."""
        if self.order is None:
            return list(range(self.workers))
        turn = self.order.next_worker()
        return [worker for worker in range(self.workers)
                if worker == turn or self._held[worker] < self.read_ahead]

    def put(self, worker: int, item: T, samples: int | None, nbytes: int) -> None:
        """Hold ``item`` from ``worker``: ``samples`` data samples, or None for its end of epoch."""
        held = nbytes + MESSAGE_OVERHEAD
        self._queues[worker].append((item, samples, held))
        self._held[worker] += held
        if self.order is None:
            self._arrivals.append(worker)

    def next(self) -> tuple[T, bool] | None:
        """The next item in merge order and whether every worker has now ended the epoch.

        None while that item has not arrived.
        """
        if self.order is None:
            if not self._arrivals:
                return None
            worker = self._arrivals.popleft()
        else:
            worker = self.order.next_worker()
            if not self._queues[worker]:
                return None
        item, samples, held = self._queues[worker].popleft()
        self._held[worker] -= held
        if samples is not None:
            if self.order is not None:
                self.order.took(worker, samples)
            return item, False
        return item, self._end(worker)

    def drain(self) -> list[T]:
        """Every item held, in no particular order; the merge holds nothing after.

        >>> merge = Merge(workers=2, block=1)
        >>> merge.put(1, "b0", samples=1, nbytes=10); merge.drain(), merge.readable()
        (['b0'], [0, 1])
        """
        items = [item for queue in self._queues for item, _, _ in queue]
        for queue in self._queues:
            queue.clear()
        self._held = [0] * self.workers
        self._arrivals.clear()
        return items

    def _end(self, worker: int) -> bool:
        if self.order is not None:
            return self.order.ended(worker)
        self._ended.add(worker)
        if len(self._ended) < self.workers:
            return False
        self._ended.clear()
        return True
