"""Who runs each shard, from where, and which of its messages the server takes.

The server process owns the assignment: each shard has an owner (a worker slot),
a *ticket* (a number new at every assignment of it) and the point its owner
starts at, (epoch, position in the shard's epoch). :class:`Assignment` carries it
to the forked workers in shared memory (written by the server only, read under a
sequence lock, so a worker never sees half of a change). A worker tags each
message of a shard with its ticket (:func:`pack_shard`); :class:`ShardLedger`,
in the server, takes a shard's messages only under its current ticket, counts
what it took, and so says where a new owner must resume: nothing lost, nothing
taken twice, whatever the old owner still had on its way. :func:`plan_owners`
moves as few shards as it can when the workers change. Pure but for the shared
memory; never sockets, never sampling.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from feedmux.errors import FeedmuxError

__all__ = ["SHARD_BITS", "Assignment", "ShardLedger", "pack_shard", "plan_owners",
           "unpack_shard"]

#: A shard's index fits in this many low bits of a message's ``seq`` (its ticket above).
SHARD_BITS = 16


def pack_shard(shard: int, ticket: int) -> int:
    """The ``seq`` (and ``EndOfEpoch.worker``) of a shard's message under ``ticket``.

    >>> unpack_shard(pack_shard(3, 7))
    (3, 7)
    """
    return (ticket << SHARD_BITS) | shard


def unpack_shard(value: int) -> tuple[int, int]:
    """(shard, ticket) of a message's ``seq``."""
    return value & ((1 << SHARD_BITS) - 1), value >> SHARD_BITS


def plan_owners(owners: list[int], slots: list[int]) -> list[int]:
    """Owners for every shard over the worker ``slots``, moving as few shards as it can.

    A shard stays with its owner while that owner is among ``slots`` and holds
    no more than its share (``ceil(shards / len(slots))``, the first slots
    taking the larger shares); the others go to the slots with the fewest.

    Examples
    --------
    >>> plan_owners([0, 0, 0, 0, 0, 0], [0, 1, 2])
    [0, 0, 1, 2, 1, 2]
    >>> plan_owners([0, 0, 1, 1, 2, 2], [0, 2])
    [0, 0, 0, 2, 2, 2]
    >>> plan_owners([-1, -1, -1], [4])
    [4, 4, 4]
    """
    if not slots:
        raise FeedmuxError("expected at least one worker to run the shards, got none")
    count, width = len(owners), len(slots)
    share = {slot: count // width + (1 if rank < count % width else 0)
             for rank, slot in enumerate(sorted(slots))}
    held = {slot: 0 for slot in slots}
    planned = list(owners)
    homeless = []
    for index, owner in enumerate(owners):
        if owner in held and held[owner] < share[owner]:
            held[owner] += 1
        else:
            homeless.append(index)
    for index in homeless:
        slot = min(slots, key=lambda each: (held[each] - share[each], each))
        planned[index] = slot
        held[slot] += 1
    return planned


class Assignment:
    """The shards' owners, tickets and start points, shared with the forked workers.

    Built before the fork from ``shared(typecode, size)`` (``RawArray``); the
    server writes (:meth:`write`), the workers read (:meth:`read`).
    """

    def __init__(self, shards: int, shared: Any) -> None:
        self.shards = shards
        self._version = shared("q", 1)
        self._owner = shared("q", shards)
        self._ticket = shared("q", shards)
        self._epoch = shared("q", shards)
        self._position = shared("q", shards)
        for index in range(shards):
            self._owner[index] = -1

    @property
    def version(self) -> int:
        """Even when stable; a worker re-reads when it changes."""
        return int(self._version[0])

    def write(self, changes: dict[int, tuple[int, int, int, int]]) -> None:
        """Set shard -> (owner, ticket, epoch, position) for each of ``changes``."""
        self._version[0] += 1  # odd: being written
        for index, (owner, ticket, epoch, position) in changes.items():
            self._owner[index] = owner
            self._ticket[index] = ticket
            self._epoch[index] = epoch
            self._position[index] = position
        self._version[0] += 1

    def read(self, slot: int) -> tuple[int, dict[int, tuple[int, int, int]]]:
        """(version, shard -> (ticket, epoch, position)) of the shards ``slot`` owns."""
        while True:
            version = self.version
            if version % 2 == 0:
                owned = {index: (int(self._ticket[index]), int(self._epoch[index]),
                                 int(self._position[index]))
                         for index in range(self.shards) if self._owner[index] == slot}
                if self.version == version:
                    return version, owned
            time.sleep(0.0005)

    def owners(self) -> list[int]:
        """Every shard's owner (-1: none yet)."""
        return [int(owner) for owner in self._owner]


class ShardLedger:
    """What the server took of each shard in its current epoch, under which ticket.

    Examples
    --------
    >>> ledger = ShardLedger(2)
    >>> ledger.assign(0, epoch=1, position=0)
    1
    >>> ledger.take_data(0, ticket=1, epoch=1, start=0, count=5)
    True
    >>> ledger.take_data(0, ticket=0, epoch=1, start=0, count=5)  # an old owner's
    False
    >>> ledger.resume_point(0), ledger.take_end(0, ticket=1, epoch=1), ledger.resume_point(0)
    ((1, 5), True, (2, 0))
    """

    def __init__(self, shards: int, tickets: Iterator[int] | None = None) -> None:
        self.tickets = [0] * shards
        self._epoch = [1] * shards
        self._taken = [0] * shards
        #: Where new tickets come from: one count for every run of a server, so a ticket
        #: is never given twice (an earlier run's messages may still be on their way).
        self._new_tickets = itertools.count(1) if tickets is None else tickets
        #: Shards assigned whose new owner has sent nothing yet (it replays up to its start).
        self.settling: set[int] = set()

    def assign(self, shard: int, epoch: int, position: int) -> int:
        """A new ticket for ``shard``, whose new owner starts at (``epoch``, ``position``)."""
        ticket = next(self._new_tickets)
        self.tickets[shard] = ticket
        self._epoch[shard], self._taken[shard] = epoch, position
        self.settling.add(shard)
        return ticket

    def resume_point(self, shard: int) -> tuple[int, int]:
        """Where a new owner of ``shard`` starts: after everything the server took."""
        return self._epoch[shard], self._taken[shard]

    def take_data(self, shard: int, ticket: int, epoch: int, start: int, count: int) -> bool:
        """Whether to take a data message of ``shard`` (False: an earlier owner's, dropped)."""
        if ticket != self.tickets[shard]:
            return False
        if (epoch, start) != (self._epoch[shard], self._taken[shard]):
            raise FeedmuxError(
                f"expected shard {shard}'s samples from epoch {self._epoch[shard]} position "
                f"{self._taken[shard]}, got epoch {epoch} position {start}"
            )
        self._taken[shard] += count
        self.settling.discard(shard)
        return True

    def take_end(self, shard: int, ticket: int, epoch: int) -> bool:
        """Whether to take ``shard``'s end of ``epoch`` (False: an earlier owner's)."""
        if ticket != self.tickets[shard]:
            return False
        if epoch != self._epoch[shard]:
            raise FeedmuxError(f"expected shard {shard}'s end of epoch {self._epoch[shard]}, "
                               f"got the end of epoch {epoch}")
        self._epoch[shard] += 1
        self._taken[shard] = 0
        self.settling.discard(shard)
        return True
