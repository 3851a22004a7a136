"""A ranked loader's positions: what it saves, restores and announces."""

from __future__ import annotations

import numpy as np
import pytest

from feedmux.client._resume import RankPositions
from feedmux.errors import StreamValueError
from feedmux.protocol import RESUME_CHECKPOINT, RESUME_LIVE


def test_the_position_is_the_jobs_next_round_whatever_the_rank() -> None:
    # 3 ranks, an epoch resumed at position 7: rank r's k-th sample is at 7 + 3k + r.
    announced = set()
    for rank in range(3):
        positions = RankPositions(1, rank=rank, world_size=3, current=lambda: None)
        positions.handed(0, np.array([2, 7 + 3 * 4 + rank]))  # each rank's 5th sample
        announced.add(positions.announce(0))
    assert announced == {(2, 22, 3, RESUME_LIVE)}


def test_the_current_message_counts_up_to_what_was_handed_out() -> None:
    tags = np.array([[1, 0], [1, 2], [1, 4]])
    current = (0, tags, 2)
    positions = RankPositions(2, rank=0, world_size=2, current=lambda: current)
    assert positions.state() == [[1, 4, 2], None]
    current = (0, tags, 0)  # nothing of a new message handed out yet
    positions = RankPositions(2, rank=0, world_size=2, current=lambda: current)
    assert positions.state() == [None, None] and positions.announce(1) == ()


def test_a_restored_position_is_announced_as_a_checkpoint_until_something_is_handed_out() -> None:
    positions = RankPositions(1, rank=1, world_size=3, current=lambda: None)
    positions.restore([[2, 74, 2]])
    assert positions.announce(0) == (2, 74, 2, RESUME_CHECKPOINT)
    positions.handed(0, np.array([2, 75]))
    assert positions.announce(0) == (2, 77, 3, RESUME_LIVE)


@pytest.mark.parametrize("saved", [[[2, 74]], [[0, 1, 2]], "x", [[2, 74, 2], None],
                                   [["2", 74, 2]]])
def test_a_bad_saved_position_is_refused_with_what_was_expected(saved: object) -> None:
    positions = RankPositions(1, rank=0, world_size=2, current=lambda: None)
    with pytest.raises(StreamValueError, match="expected a saved position"):
        positions.restore(saved)  # type: ignore[arg-type]


def test_a_free_trainer_announces_its_latest_ranges_and_the_current_messages_part() -> None:
    from feedmux.client._resume import HANDED_RANGES, HandedRanges

    current: tuple[int, np.ndarray, int] | None = None
    handed = HandedRanges(1, current=lambda: current)
    for start in range(0, 8 * (HANDED_RANGES + 5), 8):  # messages of 8, every other one
        handed.handed(0, np.array([[1, position] for position in range(start, start + 4)]))
    announced = handed.announce(0)
    assert len(announced) == 3 * HANDED_RANGES  # bounded: the oldest ones are behind
    assert announced[-3:] == (1, 8 * (HANDED_RANGES + 4), 8 * (HANDED_RANGES + 4) + 4)
    current = (0, np.array([[2, 0], [2, 1], [2, 2]]), 2)  # two of three handed out
    assert handed.announce(0)[-3:] == (2, 0, 2)
    assert handed.next_message(fresh=True)
    current = None  # the loader takes the next message
    assert handed.announce(0)[-6:] == (
        1, 8 * (HANDED_RANGES + 4), 8 * (HANDED_RANGES + 4) + 4, 2, 0, 2)


def test_a_bucketing_trainers_scattered_hand_outs_of_seconds_fit_its_hello() -> None:
    """A trainer taking length-bucketed batches hands out scattered positions: a batch of
    7 is up to 7 ranges. The chaos test's bucketing trainer, about 300 batches a second,
    kept only its last 32 ranges (5 batches): a server restarted after a summary dealt the
    rest of what it handed out since again (repeats in 3 of 4 runs). Its hello now reports
    a few seconds of them, and fits the server's control frame."""
    import msgpack

    from feedmux._plumbing.sockets import CONTROL_INBOUND_FRAME_BYTES
    from feedmux.client._resume import HANDED_RANGES, HandedRanges
    from feedmux.server._delivery.ledger import MAX_SUMMARY_RUNS

    handed = HandedRanges(1, current=lambda: None)
    rng = np.random.default_rng(0)
    batches = [np.sort(rng.choice(320, 7, replace=False)) for _ in range(100)]
    for epoch, positions in enumerate(batches, 1):
        handed.handed(0, np.array([[epoch, int(position)] for position in positions]))
    announced = handed.announce(0)
    reported = {(announced[i], position) for i in range(0, len(announced), 3)
                for position in range(announced[i + 1], announced[i + 2])}
    every = {(epoch, int(position)) for epoch, positions in enumerate(batches, 1)
             for position in positions}
    assert reported == every  # 100 batches of 7: 700 ranges, all reported
    # The largest hello: every range kept, at large positions, and the largest summary.
    big = [(1 << 31) + i for i in range(3 * HANDED_RANGES + 3 * MAX_SUMMARY_RUNS + 2)]
    assert len(msgpack.packb(big)) + 1024 < CONTROL_INBOUND_FRAME_BYTES


def test_a_summary_that_came_after_the_trainer_handed_its_run_out_leaves_that_run_out() -> None:
    from feedmux.client._resume import HandedRanges

    # The soak's repeats: the server summed up while the trainer's acknowledgement of
    # 5:256-500 was still on its way; the trainer had handed those out already, kept the
    # summary as its last, and a restarted server dealt 5:256-500 again.
    handed = HandedRanges(1, current=lambda: None)
    handed.handed(0, np.array([[5, position] for position in range(256, 500)]))
    handed.summarized(0, (6, 10, 5, 256, 500, 6, 4, 6))
    assert handed.below(0) == (6, 10, 6, 4, 6)
