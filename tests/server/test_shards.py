"""Each shard's process-wide random state: the draws of a shard do not depend on its neighbours."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from feedmux import worker_info
from feedmux._worker_info import set_worker_info
from feedmux.server._sources.shards import ShardRandom


@pytest.fixture(autouse=True)
def _leave_no_sampling_state() -> Iterator[None]:
    """A shard's epoch publishes worker_info() process-wide: later tests in this process
    (the doctest of worker_info among them) must see none."""
    yield
    ShardRandom.leave_all()
    set_worker_info(None)

SEED = 21
SHARDS = 3
#: The order in which the process runs the shards, a turn each: irregular, with repeats.
TURNS = [0, 1, 2, 2, 0, 1, 0, 0, 2, 1, 1, 2, 0, 2, 1]


def _block(turn: int) -> list[object]:
    """What a sampler draws in one turn, from every process-wide generator.

    Each block draws an odd number of Gaussians from numpy and from ``random``,
    so every other switch comes while numpy keeps the second value of a
    Box-Muller pair and ``random.gauss`` keeps its own.
    """
    count = 2 * (turn % 3) + 1
    info = worker_info()
    assert info is not None
    return [info.id, np.random.random(count).tolist(), np.random.randn(count).tolist(),
            np.random.randint(0, 10**9, count).tolist(),
            np.random.normal(3.0, 2.0, count + 1).tolist(),
            random.random(), random.gauss(0.0, 1.0), random.randrange(10**9),
            torch.rand(count).tolist(), torch.randn(count).tolist()]


def _interleaved(fast: bool) -> Iterator[tuple[int, list[object]]]:
    """(shard, its block) for each of :data:`TURNS`, every shard in this one process."""
    randoms = [ShardRandom(SEED, index, SHARDS, fast=fast) for index in range(SHARDS)]
    started: set[int] = set()
    ShardRandom.leave_all()
    try:
        for turn, index in enumerate(TURNS):
            randoms[index].enter()
            if index not in started:
                randoms[index].start_epoch(1)
                started.add(index)
            yield index, _block(turn)
    finally:
        ShardRandom.leave_all()


def _alone(index: int) -> list[list[object]]:
    """The blocks of shard ``index`` drawn with no other shard in the process."""
    ShardRandom.leave_all()
    shard_random = ShardRandom(SEED, index, SHARDS)
    shard_random.enter()
    shard_random.start_epoch(1)
    blocks = [_block(turn) for turn, turn_index in enumerate(TURNS) if turn_index == index]
    ShardRandom.leave_all()
    return blocks


@pytest.mark.parametrize("fast", [True, False], ids=["in place", "get/set-state"])
def test_interleaved_shards_draw_what_each_draws_alone(fast: bool) -> None:
    drawn: dict[int, list[list[object]]] = {index: [] for index in range(SHARDS)}
    for index, block in _interleaved(fast):
        drawn[index].append(block)
    for index in range(SHARDS):
        assert drawn[index] == _alone(index), f"shard {index}, fast={fast}"


def test_the_fallback_draws_what_the_copies_in_place_draw() -> None:
    assert list(_interleaved(fast=True)) == list(_interleaved(fast=False))


def test_one_shard_in_a_process_never_saves() -> None:
    ShardRandom.leave_all()
    only = ShardRandom(SEED, 0, 1)
    only.enter()
    only.start_epoch(1)
    only.enter()
    assert only._saved is None
    ShardRandom.leave_all()


def test_closing_a_merged_activation_closes_every_shard_it_opened() -> None:
    """The merge hands its blocks out through a C chain: closing it still closes the shards."""
    from feedmux.sampling import Streamer
    from feedmux.server._sources.shards import MergedShards

    closed: list[int] = []

    def numbers(first: int) -> Iterator[int]:
        try:
            yield from range(first, first + 100)
        finally:
            closed.append(first)

    merged = MergedShards([Streamer(numbers, 0), Streamer(numbers, 1000)], block=4, seed=SEED)
    merged.start_epoch(1)
    stream = merged.iterate()
    assert [next(stream) for _ in range(6)] == [0, 1, 2, 3, 1000, 1001]
    stream.close()  # type: ignore[attr-defined]
    assert sorted(closed) == [0, 1000]
