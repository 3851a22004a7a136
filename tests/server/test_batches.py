"""The server's batch pieces without sockets: the assembler, the ranks' batches, admission."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from feedmux.client._link import batch_steps, rank_steps
from feedmux.protocol import Hello
from feedmux.server._control.ranks import RankTables
from feedmux.server._delivery.batches import MAX_BATCH_SIZE, BatchAssembler, Batches, BatchRequest
from feedmux.server._delivery.dealing import RankDealer
from feedmux.server._delivery.ranking import batched_shares


def tagged(epoch: int, start: int, count: int) -> np.ndarray:
    tags = np.empty((count, 2), dtype=np.int64)
    tags[:, 0], tags[:, 1] = epoch, np.arange(start, start + count)
    return tags


def samples(start: int, count: int) -> list[dict[str, Any]]:
    return [{"id": np.int64(i), "x": np.full(2, i, np.float32)}
            for i in range(start, start + count)]


def pieces(total: int, rng: random.Random) -> list[int]:
    sizes = []
    while total:
        sizes.append(min(total, rng.randint(1, 13)))
        total -= sizes[-1]
    return sizes


def cut(batch_size: int, ids: Sequence[Any]) -> list[list[int]]:
    """A message's rows as the trainer hands them out: every batch_size rows a batch."""
    values = [int(i) for i in ids]
    return [values[start:start + batch_size] for start in range(0, len(values), batch_size)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 4, 7])
def test_batches_are_consecutive_never_span_epochs_and_end_short_or_dropped(
    batch_size: int, drop_last: bool
) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    assembler = BatchAssembler(batch_size, drop_last)
    dropped = 0
    for epoch, size in ((1, 30), (2, 28), (3, 3)):
        got: list[list[int]] = []
        start = 0
        for count in pieces(size, rng):
            for run in assembler.add(tagged(epoch, start, count), samples(start, count)):
                assert set(run.tags[:, 0].tolist()) == {epoch}
                assert run.tags[:, 1].tolist() == run.items.stacked()["id"].tolist()
                got += cut(batch_size, run.items.stacked()["id"])
            start += count
        for run in assembler.finish_epoch():
            got += cut(batch_size, run.items.stacked()["id"])
        whole = size // batch_size * batch_size
        expected = [list(range(at, min(at + batch_size, size)))
                    for at in range(0, size, batch_size)]
        if drop_last:
            expected = expected[: size // batch_size]
            dropped += size - whole
        assert got == expected
    assert assembler.dropped == dropped


def test_a_run_holds_whole_batches_but_for_the_epoch_end() -> None:
    assembler = BatchAssembler(4, drop_last=False)
    runs = assembler.add(tagged(1, 0, 10), samples(0, 10))
    assert [len(run.tags) for run in runs] == [8]  # two batches in one message
    runs = assembler.add(tagged(1, 10, 3), samples(10, 3))
    assert [run.tags[:, 1].tolist() for run in runs] == [[8, 9, 10, 11]]
    assert [run.tags[:, 1].tolist() for run in assembler.finish_epoch()] == [[12]]
    assert assembler.finish_epoch() == []


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_gets_the_same_batches_per_epoch_of_the_same_sizes(
    world_size: int, drop_last: bool, uneven: str
) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    batch_size = 4
    for epoch_size in (1, 5, 23, 24, 40):
        dealer, batches = RankDealer(world_size, uneven), Batches(batch_size, drop_last)
        got: dict[int, list[list[int]]] = {rank: [] for rank in range(world_size)}
        start, sizes = 0, pieces(epoch_size, rng)
        for index, count in enumerate(sizes):
            shares = dealer.deal(1, samples(start, count))
            last = index == len(sizes) - 1
            if last:
                shares += dealer.finish_epoch(1)
            for share in batched_shares(batches, shares, last):
                got[share.rank] += cut(batch_size, share.items.stacked()["id"])
            start += count
        share = rank_steps(epoch_size, world_size, uneven)
        steps = batch_steps(share, batch_size, drop_last)
        for rank in range(world_size):
            assert len(got[rank]) == steps, (epoch_size, rank, got)
            # Step k of a rank holds its rounds k*B .. (k+1)*B - 1 of the epoch.
            flat = [i for batch in got[rank] for i in batch]
            expected = [(rank + world_size * step) % epoch_size for step in range(len(flat))]
            assert flat == expected
        assert len({tuple(len(batch) for batch in got[rank]) for rank in got}) == 1
        everything = {i for batch_list in got.values() for batch in batch_list for i in batch}
        if uneven == "pad" and not drop_last:
            assert everything == set(range(epoch_size))  # every sample, once or padded


def test_a_jobs_first_rank_fixes_its_batch_shape_and_another_rank_is_refused_naming_both(
) -> None:
    request = BatchRequest()
    assert request.assemblers() is None
    assert request.admit(Hello("a", batch_size=8, drop_last=True, rank=0, world_size=2)) is None
    assert request.admit(Hello("b", batch_size=8, drop_last=True, rank=1, world_size=2)) is None
    refused = request.admit(Hello("c", batch_size=8, rank=1, world_size=2))
    assert refused is not None
    assert refused[1] == (
        "the ranks of this job are dealt batches of batch_size=8, drop_last=True (its first "
        "rank asked for them): expected the same from rank 1 (trainer c), got batch_size=8, "
        "drop_last=False")
    assert request.admit(Hello("d", rank=0, world_size=2)) is not None  # single samples
    made = request.assemblers()
    assert made is not None and (made.batch_size, made.drop_last) == (8, True)


def test_a_free_trainers_batch_shape_is_its_own() -> None:
    # Before: the first trainer's hello fixed the server's batches, and a free trainer
    # asking for another batch_size (or none) was refused.
    request = BatchRequest()
    assert request.admit(Hello("a", batch_size=32)) is None
    assert request.admit(Hello("b")) is None
    assert request.admit(Hello("c", batch_size=16, drop_last=True)) is None
    assert request.assemblers() is None  # no ranked job asked for batches
    assert request.admit(Hello("r", batch_size=4, rank=0, world_size=1)) is None
    assert request.admit(Hello("d", batch_size=8)) is None  # a free trainer still may


@pytest.mark.parametrize(("hello", "message"), [
    (Hello("a", batch_size=-1), "expected batch_size 1 .. 1048576 (or 0 and drop_last False), "
                                "got batch_size=-1, drop_last=False"),
    (Hello("a", batch_size=MAX_BATCH_SIZE + 1), "got batch_size=1048577"),
    (Hello("a", drop_last=True), "got batch_size=0, drop_last=True"),
])
def test_a_malformed_batch_shape_is_refused(hello: Hello, message: str) -> None:
    refused = BatchRequest().admit(hello)
    assert refused is not None and message in refused[1]


def test_consumer_groups_take_batches_each_ranked_group_its_own_shape() -> None:
    # Before: "a group's messages are shared as sampled", refused.
    tables = RankTables(grouped=True, retention_limit=4)
    def admit(client_id: str, **options: Any) -> Any:
        return tables.admit(client_id.encode(), Hello(client_id, **options), lambda i: True)

    assert admit("a", batch_size=4, group="g") is None  # a free member, its own shape
    assert admit("e", group="g") is None
    assert admit("r0", batch_size=16, group="train", rank=0, world_size=2) is None
    assert admit("s0", batch_size=8, group="eval", rank=0, world_size=1) is None
    refused = admit("r1", batch_size=8, group="train", rank=1, world_size=2)
    assert refused is not None and "batch_size=16" in refused[1] and "batch_size=8" in refused[1]
    assert tables.batches_of("train").batch_size == 16
    assert tables.batches_of("eval").batch_size == 8
    assert tables.batches.batch_size == 0  # the server's own job asked for none


def test_the_samples_dropped_are_counted_across_runs() -> None:
    request = BatchRequest()
    request.admit(Hello("a", batch_size=4, drop_last=True, rank=0, world_size=1))
    for run in range(2):  # a job restarted from a checkpoint samples again: a new run
        batches = request.assemblers()
        assert batches is not None
        batches.of(0).add(tagged(1, 0, 6), samples(0, 6))
        assert batches.finish_epoch() == []
        assert request.dropped == 2 * (run + 1)
