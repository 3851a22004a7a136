"""The ranked dealing rule, without sockets: equal shares, the position rule, pad and drop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.errors import ConfigurationError
from feedmux.protocol import Data, SampleBatch, decode, encode
from feedmux.server._delivery.dealing import RankDealer, rank_steps


def deal_epochs(dealer: RankDealer, sizes: list[int], chunks: list[int],
                together: int = 1) -> dict[int, list]:
    """Every (epoch, position, item) each rank gets, epoch after epoch (``together``
    chunks at a time)."""
    got: dict[int, list] = {rank: [] for rank in range(dealer.world_size)}
    for epoch, size in enumerate(sizes, start=1):
        items = list(range(size))
        start, turn = 0, 0
        while start < size:
            group = []
            for _ in range(together):
                step = max(1, chunks[turn % len(chunks)])
                turn += 1
                group.append(items[start:start + step])
                start += step
            for share in dealer.deal(epoch, *group):
                got[share.rank] += list(zip(share.tags[:, 0].tolist(), share.tags[:, 1].tolist(),
                                            share.items, strict=True))
        for share in dealer.finish_epoch(epoch):
            got[share.rank] += list(zip(share.tags[:, 0].tolist(), share.tags[:, 1].tolist(),
                                        share.items, strict=True))
    return got


@settings(deadline=None)  # a loaded machine is slow, not wrong
@given(world_size=st.integers(1, 5), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       chunks=st.lists(st.integers(1, 17), min_size=1, max_size=4),
       uneven=st.sampled_from(["pad", "drop"]), together=st.integers(1, 3))
def test_every_rank_gets_its_equal_share_by_the_position_rule(
    world_size: int, sizes: list[int], chunks: list[int], uneven: str, together: int
) -> None:
    got = deal_epochs(RankDealer(world_size, uneven), sizes, chunks, together)
    for epoch, size in enumerate(sizes, start=1):
        steps = rank_steps(size, world_size, uneven)
        for rank, rows in got.items():
            mine = [(position, item) for e, position, item in rows if e == epoch]
            assert len(mine) == steps
            # Position p belongs to rank p % n; a padded position repeats position p % E.
            assert [position for position, _ in mine] == [rank + world_size * step
                                                          for step in range(steps)]
            assert all(item == position % size for position, item in mine)
        delivered = [item for rows in got.values() for e, _, item in rows if e == epoch]
        if uneven == "pad":
            assert set(delivered) == set(range(size))
            assert len(delivered) - size == world_size * steps - size
        else:
            assert sorted(delivered) == list(range(world_size * (size // world_size)))


def test_pad_repeats_the_first_samples_of_the_epoch() -> None:
    got = deal_epochs(RankDealer(3, "pad"), [7], [2, 3])
    assert got[0] == [(1, 0, 0), (1, 3, 3), (1, 6, 6)]
    assert got[1] == [(1, 1, 1), (1, 4, 4), (1, 7, 0)]
    assert got[2] == [(1, 2, 2), (1, 5, 5), (1, 8, 1)]


def test_bad_settings_are_refused_naming_the_value() -> None:
    with pytest.raises(ConfigurationError, match="expected uneven 'pad' or 'drop', got 'even'"):
        RankDealer(2, "even")
    with pytest.raises(ConfigurationError, match="expected world_size an int >= 1, got 0"):
        RankDealer(0)


def decoded_batch(first: int, count: int) -> Any:
    """Samples ``first .. first + count - 1`` as a server gets them from its workers."""
    samples = [{"x": np.full(3, at, np.float32), "y": np.int64(at), "name": str(at)}
               for at in range(first, first + count)]
    tags = np.stack([np.ones(count), np.arange(first, first + count)], axis=1).astype(np.int64)
    message = decode([bytes(frame) for frame in encode(Data(tags, samples))])
    assert isinstance(message, Data)
    return message.samples


@settings(deadline=None)  # a loaded machine is slow, not wrong
@given(world_size=st.integers(1, 4), chunks=st.lists(st.integers(1, 9), min_size=1, max_size=6),
       uneven=st.sampled_from(["pad", "drop"]), ahead=st.integers(0, 12),
       together=st.integers(1, 3))
def test_decoded_batches_are_dealt_as_rows_into_the_same_messages(
    world_size: int, chunks: list[int], uneven: str, ahead: int, together: int
) -> None:
    """Dealt as rows (a worker's batch sliced, never a sample built; several batches
    joined), each rank's message holds the samples, and has the bytes, that dealing
    the built samples gives."""
    rows, items = RankDealer(world_size, uneven), RankDealer(world_size, uneven)
    rows.ahead = {0: (1, ahead)}
    items.ahead = {0: (1, ahead)}
    pairs = []
    position = 0
    for first in range(0, len(chunks), together):
        batches = []
        for count in chunks[first:first + together]:
            batches.append(decoded_batch(position, count))
            position += count
        pairs += zip(rows.deal(1, *batches), items.deal(1, *map(list, batches)), strict=True)
    pairs += zip(rows.finish_epoch(1), items.finish_epoch(1), strict=True)
    assert pairs or sum(chunks) < world_size
    for dealt, built in pairs:
        assert dealt.rank == built.rank
        assert dealt.tags.tolist() == built.tags.tolist()
        if len(built.items) > 1 and min(chunks) > 1:  # a one-sample message is no batch
            assert isinstance(dealt.items, SampleBatch)
        assert _wire(dealt.tags, dealt.items) == _wire(built.tags, built.items)
        assert [sample["name"] for sample in dealt.items] == [
            str(position % sum(chunks)) for position in dealt.tags[:, 1]]


def _wire(tags: Any, items: Any) -> list[bytes]:
    """The frames of a message of ``items``; rows of a batch fewer than two are compared
    as the samples they decode to (a stacked batch stays a batch on the wire even with one
    row, so that a trainer asking for batches gets one)."""
    if type(items) is SampleBatch and len(items) < 2:
        items = list(decode(encode(Data(tags, items))).samples)
    return [bytes(frame) for frame in encode(Data(tags, items))]
