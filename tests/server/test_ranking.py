"""The ranked dealing stage without sockets: rows of epochs in, one encoded message per rank out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.client._link import batch_steps
from feedmux.protocol import Data, SampleBatch, decode
from feedmux.server._delivery.batches import Batches
from feedmux.server._delivery.dealing import RankDealer, rank_steps
from feedmux.server._delivery.ranking import RankedStage, RankMessage

#: rank -> the messages it got, each as (epoch, [(position, sample id), ...]).
Got = dict[int, list[tuple[int, list[tuple[int, int]]]]]


def samples(start: int, count: int) -> list[dict[str, Any]]:
    return [{"id": np.int64(i), "x": np.full(2, i, np.float32)}
            for i in range(start, start + count)]


def ids(items: Sequence[Any]) -> list[int]:
    if type(items) is SampleBatch:
        return [int(i) for i in items.stacked()["id"]]
    return [int(sample["id"]) for sample in items]


def collect(got: Got, messages: Iterable[RankMessage], server_id: str = "srv") -> None:
    """Decode each message as a trainer would and file it under its rank."""
    for message in messages:
        decoded = decode([bytes(frame) for frame in message.frames])
        assert isinstance(decoded, Data) and decoded.server_id == server_id
        assert message.samples == len(decoded.tags) == len(decoded.samples) > 0
        assert set(decoded.tags[:, 0].tolist()) == {message.epoch}
        rows = list(zip(decoded.tags[:, 1].tolist(), ids(decoded.samples), strict=True))
        got.setdefault(message.rank, []).append((message.epoch, rows))


def split(size: int, chunks: Sequence[int], start: int = 0) -> list[tuple[int, int]]:
    """``(first position, count)`` of each chunk of positions ``start .. size - 1``,
    sized in turn by ``chunks``."""
    out, position, turn = [], start, 0
    while position < size:
        count = min(size - position, max(1, chunks[turn % len(chunks)]))
        out.append((position, count))
        position += count
        turn += 1
    return out


def run(stage: RankedStage, sizes: Sequence[int], chunks: Sequence[int], *,
        first_epoch: int = 1, start: int = 0, hold: bool = False) -> Got:
    """Feed ``stage`` epochs of ``sizes`` samples (sample id = position), the first of them
    from position ``start`` on, cut into ``chunks``; what each rank got."""
    got: Got = {}
    for epoch, size in enumerate(sizes, start=first_epoch):
        feed = stage.hold if hold else stage.deal
        for position, count in split(size, chunks, start if epoch == first_epoch else 0):
            collect(got, feed(epoch, position, samples(position, count)))
        collect(got, stage.finish_epoch(epoch))
    return got


def rows_of(got: Got, rank: int, epoch: int) -> list[tuple[int, int]]:
    return [row for e, rows in got.get(rank, []) if e == epoch for row in rows]


def expected_rows(rank: int, world_size: int, size: int, uneven: str,
                  start: int = 0) -> list[tuple[int, int]]:
    """The rank's (position, sample id) of an epoch of ``size`` dealt from ``start``: the
    rounds counted from there, a padded position past the end repeating the first."""
    steps = rank_steps(size - start, world_size, uneven)
    positions = [start + rank + world_size * step for step in range(steps)]
    return [(p, p if p < size else (p - size) % size) for p in positions]


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_every_rank_gets_its_exact_equal_share_of_every_epoch(world_size: int,
                                                              uneven: str) -> None:
    sizes = [11, 1, 15, 2, 10]
    got = run(RankedStage(RankDealer(world_size, uneven), "srv"), sizes, [4, 1, 7])
    for epoch, size in enumerate(sizes, start=1):
        for rank in range(world_size):
            assert rows_of(got, rank, epoch) == expected_rows(rank, world_size, size, uneven)
        steps = {len(rows_of(got, rank, epoch)) for rank in range(world_size)}
        assert steps == {rank_steps(size, world_size, uneven)}  # equal steps: no DDP hang
        dealt = {i for rank in range(world_size) for _, i in rows_of(got, rank, epoch)}
        if uneven == "pad":
            assert dealt == set(range(size))  # every sample, a few twice
        else:
            assert dealt == set(range(world_size * (size // world_size)))


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize(("old", "new", "position"), [(2, 3, 6), (4, 2, 8), (3, 4, 1), (2, 2, 0)])
def test_a_job_resumed_with_another_world_size_shares_the_rest_of_the_epoch_evenly(
    old: int, new: int, position: int, uneven: str
) -> None:
    """Resumed at a position its ranks announce (taken with ``old`` ranks), a job of
    ``new`` ranks gets the rest of that epoch dealt from there, evenly, padded with the
    epoch's first samples; whether the source cut the epoch itself (the producer) or
    the stage cuts it (the merged workers' stream), the messages are the same."""
    size = 13
    cut = run(RankedStage(RankDealer(new, uneven), "srv", start=(2, position)), [size, 9],
              [5, 2], first_epoch=2)
    skipping = RankedStage(RankDealer(new, uneven), "srv", start=(2, position))
    skipping.skipped(2, samples(0, min(new - 1, position)))
    skipped = run(skipping, [size, 9], [5, 2], first_epoch=2, start=position)
    for rank in range(new):
        assert [rows_of(skipped, rank, e) for e in (2, 3)] == [rows_of(cut, rank, e)
                                                              for e in (2, 3)]
    for rank in range(new):
        mine = rows_of(cut, rank, 2)
        assert mine == expected_rows(rank, new, size, uneven, start=position)
        assert len(mine) == rank_steps(size - position, new, uneven)
        assert rows_of(cut, rank, 3) == expected_rows(rank, new, 9, uneven)  # the next: whole
    assert not any(p < position for rank in range(new) for p, _ in rows_of(cut, rank, 2))


def test_a_rank_that_is_ahead_gets_nothing_it_had() -> None:
    dealer = RankDealer(2, "pad", ahead={0: (1, 6)})
    got = run(RankedStage(dealer, "srv"), [9, 4], [3])
    assert rows_of(got, 0, 1) == [(6, 6), (8, 8)]  # 0, 2, 4 it had
    assert rows_of(got, 1, 1) == expected_rows(1, 2, 9, "pad")
    assert rows_of(got, 0, 2) == expected_rows(0, 2, 4, "pad")  # past it: everything


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_each_rank_gets_the_same_batches_of_its_share(uneven: str, drop_last: bool) -> None:
    world_size, batch_size, sizes = 3, 4, [23, 5, 24]
    batches = Batches(batch_size, drop_last)
    got = run(RankedStage(RankDealer(world_size, uneven), "srv", batches=batches), sizes,
              [7, 2, 11])
    for epoch, size in enumerate(sizes, start=1):
        share = rank_steps(size, world_size, uneven)
        kept = batch_steps(share, batch_size, drop_last) * batch_size if drop_last else share
        cuts = set()
        for rank in range(world_size):
            messages = [rows for e, rows in got.get(rank, []) if e == epoch]
            # A message holds whole batches, but for the epoch's last, short one, at its end.
            assert all(len(rows) % batch_size == 0 for rows in messages[:-1])
            mine = [row for rows in messages for row in rows]
            assert mine == expected_rows(rank, world_size, size, uneven)[:kept]
            cuts.add(tuple(len(rows) for rows in messages))
        assert len(cuts) == 1  # every rank the same batches, of the same sizes
    assert batches.dropped == (sum(rank_steps(s, world_size, uneven) % batch_size
                                   for s in sizes) * world_size if drop_last else 0)


def test_held_rows_are_dealt_together_once_every_rank_can_have_a_full_message() -> None:
    stage = RankedStage(RankDealer(3, "drop"), "srv")
    got: Got = {}
    for position in (0, 4):
        collect(got, stage.hold(1, position, samples(position, 4)))
        assert not got and stage.holding
    collect(got, stage.hold(1, 8, samples(8, 4)))  # 12 rows: 3 ranks x 4
    assert not stage.holding
    assert {rank: [len(rows) for _, rows in got[rank]] for rank in got} == {0: [4], 1: [4],
                                                                            2: [4]}
    collect(got, stage.hold(1, 12, samples(12, 5)))
    assert stage.holding
    collect(got, stage.flush())  # nothing more comes soon: dealt now, the rest carried
    assert [len(rows) for _, rows in got[0]] == [4, 1] and not stage.holding
    collect(got, stage.finish_epoch(1))
    assert [rows_of(got, rank, 1) for rank in range(3)] == [expected_rows(rank, 3, 17, "drop")
                                                           for rank in range(3)]
    collect(got, stage.hold(2, 0, samples(0, 3)))
    assert stage.holding and not rows_of(got, 0, 2)
    collect(got, stage.hold(3, 0, samples(0, 2)))  # another epoch: never dealt together
    assert [rows_of(got, rank, 2) for rank in range(3)] == [[(0, 0)], [(1, 1)], [(2, 2)]]
    collect(got, stage.finish_epoch(3))
    assert not any(rows_of(got, rank, 3) for rank in range(3))  # 2 < 3 rows: dropped


@settings(deadline=None, max_examples=60)  # a loaded machine is slow, not wrong
@given(world_size=st.integers(1, 4), uneven=st.sampled_from(["pad", "drop"]),
       sizes=st.lists(st.integers(1, 30), min_size=1, max_size=3),
       chunks=st.lists(st.integers(1, 12), min_size=1, max_size=5),
       other=st.lists(st.integers(1, 12), min_size=1, max_size=5),
       batch_size=st.integers(0, 5), drop_last=st.booleans(), position=st.integers(0, 10),
       hold=st.booleans())
def test_any_chunking_of_the_same_epochs_gives_every_rank_the_same_samples(
    world_size: int, uneven: str, sizes: list[int], chunks: list[int], other: list[int],
    batch_size: int, drop_last: bool, position: int, hold: bool
) -> None:
    """Whatever the chunk sizes (and whether rows are held or dealt at once), each rank
    gets the same samples at the same positions, cut into the same training batches."""
    position = min(position, sizes[0] - 1)

    def dealt(split_by: list[int]) -> dict[int, list[list[tuple[int, int]]]]:
        batches = Batches(batch_size, drop_last and batch_size > 0) if batch_size else None
        stage = RankedStage(RankDealer(world_size, uneven), "srv", batches=batches,
                            start=(1, position) if position else None)
        got = run(stage, sizes, split_by, hold=hold)
        step = batch_size or 1 << 30  # without batches: one run of rows per epoch
        return {rank: [rows[at:at + step] for epoch in range(1, len(sizes) + 1)
                       for rows in [rows_of(got, rank, epoch)]
                       for at in range(0, len(rows), step)]
                for rank in got}

    assert dealt(chunks) == dealt(other)
