"""The ranked dealing rule, without sockets: equal shares, the position rule, pad and drop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedmux.errors import ConfigurationError
from feedmux.server._dealing import RankDealer, rank_steps


def deal_epochs(dealer: RankDealer, sizes: list[int], chunks: list[int]) -> dict[int, list]:
    """Every (epoch, position, item) each rank gets, epoch after epoch."""
    got: dict[int, list] = {rank: [] for rank in range(dealer.world_size)}
    for epoch, size in enumerate(sizes, start=1):
        items = list(range(size))
        start, turn = 0, 0
        while start < size:
            step = max(1, chunks[turn % len(chunks)])
            turn += 1
            for share in dealer.deal(epoch, items[start:start + step]):
                got[share.rank] += list(zip(share.tags[:, 0].tolist(), share.tags[:, 1].tolist(),
                                            share.items, strict=True))
            start += step
        for share in dealer.finish_epoch(epoch):
            got[share.rank] += list(zip(share.tags[:, 0].tolist(), share.tags[:, 1].tolist(),
                                        share.items, strict=True))
    return got


@given(world_size=st.integers(1, 5), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       chunks=st.lists(st.integers(1, 17), min_size=1, max_size=4),
       uneven=st.sampled_from(["pad", "drop"]))
def test_every_rank_gets_its_equal_share_by_the_position_rule(
    world_size: int, sizes: list[int], chunks: list[int], uneven: str
) -> None:
    got = deal_epochs(RankDealer(world_size, uneven), sizes, chunks)
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
