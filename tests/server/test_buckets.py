"""The bucketing window without sockets: lengths and rows in, coordinated steps out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.errors import ConfigurationError
from feedmux.server._delivery.buckets import MAX_WAIT_WINDOWS, BucketWindow, Step
from feedmux.server._delivery.dealing import rank_steps


def run_epoch(window: BucketWindow, epoch: int, lengths: Sequence[int],
              chunks: Sequence[int] = (7,)) -> list[Step]:
    """Feed one epoch of rows (each row its index) in chunks of the given sizes, cycled."""
    steps: list[Step] = []
    index, turn = 0, 0
    while index < len(lengths):
        size = max(1, chunks[turn % len(chunks)])
        stop = min(len(lengths), index + size)
        steps += window.add(epoch, lengths[index:stop], list(range(index, stop)))
        assert window.held <= window.window
        index, turn = stop, turn + 1
    return steps + window.finish_epoch(epoch)


def lognormal(count: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(4, 0.8, count)).astype(int).tolist()


@settings(max_examples=60, deadline=None)
@given(world_size=st.integers(1, 4), batch_size=st.integers(1, 5),
       window_steps=st.integers(1, 4), count=st.integers(0, 90),
       uneven=st.sampled_from(["pad", "drop"]), with_edges=st.booleans(),
       chunks=st.lists(st.integers(1, 30), min_size=1, max_size=4), seed=st.integers(0, 3))
def test_every_row_once_equal_steps_and_the_window_bounded(
        world_size: int, batch_size: int, window_steps: int, count: int, uneven: str,
        with_edges: bool, chunks: list[int], seed: int) -> None:
    lengths = lognormal(count, seed)
    edges = (20, 60, 200) if with_edges else ()
    window = BucketWindow(world_size, batch_size, window_steps * world_size * batch_size,
                          edges, uneven, seed)
    steps = run_epoch(window, 1, lengths, chunks)
    per_rank = [[row for step in steps for row in step.ranks[rank]]
                for rank in range(world_size)]
    # Equal shares, of the size the dealing without buckets gives.
    assert {len(share) for share in per_rank} == {rank_steps(count, world_size, uneven)}
    dealt = Counter(row for share in per_rank for row in share)
    if uneven == "pad":
        assert set(dealt) == set(range(count))  # every row, the padding repeats a few
        assert sum(dealt.values()) - count == window.padded < world_size
    else:
        assert all(times == 1 for times in dealt.values())
        assert len(dealt) + window.dropped == count and window.dropped < world_size
    # Every step: n batches of the same size; all but the last of B; positions counted.
    start = 0
    for step in steps:
        sizes = {len(rows) for rows in step.ranks}
        assert len(sizes) == 1
        assert step.start == start
        start += sum(map(len, step.ranks))
        for rank in range(world_size):
            assert step.positions(rank).tolist() == [
                step.start + j * world_size + rank for j in range(len(step.ranks[rank]))]
    assert all(len(rows) == batch_size for step in steps[:-1] for rows in step.ranks)
    assert window.held == 0


@settings(max_examples=25, deadline=None)
@given(chunks=st.lists(st.integers(1, 200), min_size=1, max_size=5), seed=st.integers(0, 5),
       with_edges=st.booleans())
def test_the_steps_depend_on_the_rows_and_the_seed_not_on_the_chunks(
        chunks: list[int], seed: int, with_edges: bool) -> None:
    lengths = lognormal(700, seed)
    edges = (30, 90) if with_edges else ()

    def steps(pieces: Sequence[int], run_seed: int) -> list[tuple[int, list[list[int]]]]:
        window = BucketWindow(3, 4, 60, edges, "pad", run_seed)
        return [(step.start, step.ranks) for step in run_epoch(window, 2, lengths, pieces)]

    assert steps(chunks, seed) == steps([700], seed) == steps([1], seed)
    assert steps(chunks, seed) != steps(chunks, seed + 10)  # the ranks' turns are drawn


def test_a_step_from_a_full_bucket_holds_that_bucket_only() -> None:
    window = BucketWindow(2, 2, window=100, edges=(10, 100))
    lengths = [5, 50, 500, 6, 60, 7, 70, 8]
    steps = window.add(1, lengths, list(range(len(lengths))))
    assert len(steps) == 1 and window.bucket_steps == 1
    rows = sorted(row for rank in steps[0].ranks for row in rank)
    assert rows == [0, 3, 5, 7]  # the four of bucket [1, 10): the first to fill
    assert window.held == 4


def test_coordinated_steps_pad_far_less_than_dealing_in_order() -> None:
    world_size, batch_size = 4, 16
    lengths = np.asarray(lognormal(20000))
    window = BucketWindow(world_size, batch_size)
    steps = run_epoch(window, 1, lengths.tolist(), [500])

    def waste(batches: list[np.ndarray]) -> float:
        real = sum(int(batch.sum()) for batch in batches)
        return 1 - real / sum(len(batch) * int(batch.max()) for batch in batches)

    bucketed = [lengths[rows] for step in steps for rows in step.ranks if rows]
    step = world_size * batch_size
    in_order = [lengths[start + rank:start + step:world_size]
                for start in range(0, len(lengths) - step + 1, step)
                for rank in range(world_size)]
    assert waste(bucketed) < 0.15 < 0.4 < waste(in_order)


def test_a_long_sample_waits_a_bounded_number_of_rows() -> None:
    world_size, batch_size = 2, 4
    # One very long sample among short ones of similar length: never the cheapest run.
    lengths = [1000] + [10 + i % 3 for i in range(3000)]
    window = BucketWindow(world_size, batch_size, window=16)
    out: list[int] = []
    for index, length in enumerate(lengths):
        for step in window.add(1, [length], [index]):
            out += [row for rows in step.ranks for row in rows]
            if 0 in out:
                break
        if 0 in out:
            break
    assert 0 in out and index <= (MAX_WAIT_WINDOWS + 1) * window.window
    assert window.late_steps == 1


def test_bad_settings_are_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match=r"ascending ints >= 1, got \[4, 4\]"):
        BucketWindow(2, 2, edges=(4, 4))
    with pytest.raises(ConfigurationError, match="uneven 'pad' or 'drop', got 'even'"):
        BucketWindow(2, 2, uneven="even")
    window = BucketWindow(2, 2)
    with pytest.raises(ValueError, match="a length per row, got 1 for 2"):
        window.add(1, [3], ["a", "b"])
    window.add(1, [3], ["a"])
    with pytest.raises(ValueError, match=r"finish_epoch\(1\) before rows of 2"):
        window.add(2, [3], ["b"])
