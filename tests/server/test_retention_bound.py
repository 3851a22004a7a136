"""What a server keeps for a rank's successor stays bounded over a long run: no sockets.

A ranked job's ledger (recovery: replay to the rank's successor) is driven as the
server drives it for many epochs: each rank's holder is sent messages while its lane
has room, hands them out with a lag and marks them as the acknowledging thread does;
one rank's holder is killed mid-message again and again and its successor takes its
lane over. What the ledger holds after every epoch (messages, bytes, lanes) must not
grow with the epochs, and the ranks' steps are checked against a model of the
uninterrupted job (every position of a rank's share handed out once, in order).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from feedmux.protocol import Data, encode, read_tags
from feedmux.server._delivery.ledger import Ledger, Recovery

WORLD_SIZE = 2
MESSAGES = 12  # per rank and epoch
SAMPLES = 5  # per message
LIMIT = 8  # messages a lane may keep (the server's: 4 x hwm + 64)
LAG = 3  # messages a holder has received and not handed out yet, at most
EPOCHS = 60


def share(epoch: int, rank: int, index: int) -> list[object]:
    """Rank ``rank``'s ``index``-th message of ``epoch`` (positions p with p % 2 == rank)."""
    first = index * SAMPLES * WORLD_SIZE + rank
    positions = range(first, first + SAMPLES * WORLD_SIZE, WORLD_SIZE)
    tags = np.array([[epoch, p] for p in positions])
    return list(encode(Data(tags, [f"{epoch}.{p}" for p in positions])))


class Holder:
    """A trainer holding a rank: its received messages, handed out in order, marked."""

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.queue: deque[list[object]] = deque()
        self.handed: list[tuple[int, int]] = []

    def receive(self, frames: list[object]) -> None:
        self.queue.append(frames)

    def hand_out(self, ledger: Ledger, rank: int, samples: int | None = None) -> None:
        """Hand out the oldest message (or its first ``samples``), and mark it."""
        tags = read_tags(self.queue[0])
        taken = [tuple(int(v) for v in row) for row in tags[:samples]]
        self.handed += taken
        if samples is None or samples >= len(tags):
            self.queue.popleft()
        ledger.record_mark(rank, self.name, taken[-1])


@pytest.mark.parametrize("kill_every", [0, 3, 1], ids=["never-dies", "dies-every-3-epochs",
                                                       "dies-every-epoch"])
def test_what_is_kept_for_a_successor_does_not_grow_with_the_epochs(kill_every: int) -> None:
    ledger = Ledger(Recovery.REPLAY, limit=LIMIT)
    holders = [Holder(f"rank{rank}-0".encode()) for rank in range(WORLD_SIZE)]
    handed: list[list[tuple[int, int]]] = [[] for _ in range(WORLD_SIZE)]
    successors = 0
    kept_after_epoch = []
    most_kept = []  # per epoch: the most messages the ledger held at any step
    for epoch in range(1, EPOCHS + 1):
        pending = [deque(share(epoch, rank, i) for i in range(MESSAGES))
                   for rank in range(WORLD_SIZE)]
        most = 0
        while any(pending) or any(holder.queue for holder in holders):
            for rank, holder in enumerate(holders):
                # Sent while the lane has room (the sender waits for marks otherwise).
                while pending[rank] and ledger.room(rank) and len(holder.queue) < LAG:
                    frames = pending[rank].popleft()
                    ledger.record(rank, holder.name, frames)
                    holder.receive(frames)
                if holder.queue:
                    holder.hand_out(ledger, rank)
            if rank_dies := (kill_every and epoch % kill_every == 0 and holders[1].queue
                             and len(pending[1]) == MESSAGES // 2):
                # Rank 1's holder hands out 2 samples of a message, marks them and is killed
                # (what it received and did not hand out dies with it); a successor takes
                # the rank over and is re-sent its predecessor's rest first.
                holders[1].hand_out(ledger, 1, samples=2)
                handed[1] += holders[1].handed
                successors += 1
                holders[1] = Holder(f"rank1-{successors}".encode())
                assert ledger.owed(1, holders[1].name)
                for entry in ledger.take_over(1, holders[1].name):
                    ledger.resent(1, entry, holders[1].name)
                    holders[1].receive(entry.frames)
            assert rank_dies or (ledger.count(0) <= LIMIT and ledger.count(1) <= LIMIT)
            most = max(most, ledger.held())
        most_kept.append(most)
        kept_after_epoch.append((ledger.held(), ledger.nbytes, len(ledger.lanes())))
    for rank, holder in enumerate(holders):
        handed[rank] += holder.handed
    # Each rank's steps, across its holders, are its share of every epoch in order, once.
    for rank in range(WORLD_SIZE):
        assert handed[rank] == [(epoch, p) for epoch in range(1, EPOCHS + 1)
                                for p in range(rank, MESSAGES * SAMPLES * WORLD_SIZE,
                                               WORLD_SIZE)]
    # What is kept never exceeds what is in flight, the same in the last epochs as in the
    # first; once the holders handed everything out, nothing is kept, in any lane.
    assert max(most_kept) <= WORLD_SIZE * LAG
    assert max(most_kept[-10:]) <= max(most_kept[:10])
    assert kept_after_epoch == [(0, 0, 0)] * EPOCHS
    assert successors == (0 if not kill_every else EPOCHS // kill_every)
