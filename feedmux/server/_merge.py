"""The fixed order in which the server merges its sampling workers' messages.

This module owns the rule that makes a server with ``--workers N`` a
deterministic sequence of (epoch, position, sample): the forwarder reads the
next message from the worker chosen by :meth:`MergeOrder.next_worker`, a rule
of each worker's own sample counts in the epoch only (never of arrival times),
and numbers positions in that order. The workers cut their messages at
multiples of the block (``produce(..., align=block)``), so the merged order of
samples does not depend on how many samples each message happened to carry.
It is pure (no sockets, no clocks) and must never decide anything but whose
message comes next.

What it costs: the forwarder waits for the worker whose turn it is while the
others' messages queue up; a slow worker holds the others back by at most their
queues (``hwm`` messages each way), so the server runs at about N times the
slowest worker's rate instead of the sum of their rates; and without a fixed
``samples_per_message`` a message holds at most one turn (:data:`MERGE_BLOCK`
samples), which costs small, fast samples some per-message overhead.
"""

from __future__ import annotations

from feedmux.errors import FeedmuxError

__all__ = ["MERGE_BLOCK", "MergeOrder", "merge_block"]

#: Samples a worker contributes per turn when the message size is not fixed. Small,
#: because a worker waiting for its turn must be able to queue a whole turn: with
#: slow samples every message holds one sample, and the queues hold ``2 * hwm``
#: messages (the worker's send queue and the server's receive queue).
MERGE_BLOCK = 16


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

    def next_worker(self) -> int:
        """The worker whose next message must be forwarded now."""
        block = self.block
        live = [index for index in range(self.workers) if not self._ended[index]]
        return min(live, key=lambda index: (self._counts[index] // block, index))

    def took(self, worker: int, samples: int) -> None:
        """Record that ``samples`` samples of ``worker`` were forwarded."""
        self._check_turn(worker, "sent data")
        self._counts[worker] += samples

    def ended(self, worker: int) -> bool:
        """Record that ``worker`` ended the epoch; True when every worker has (then reset)."""
        self._check_turn(worker, "ended the epoch")
        self._ended[worker] = True
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
