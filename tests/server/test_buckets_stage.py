"""The ranked stage with ``bucket_by``: rows in, one encoded, padded batch per rank and step."""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.apps.cli import build_parser
from feedmux.errors import ConfigurationError
from feedmux.protocol import Data, Hello, SampleBatch, decode, ragged_tree
from feedmux.protocol._batch import stack_samples
from feedmux.server._delivery.batches import Batches, BatchRequest
from feedmux.server._delivery.bucketstage import BucketStage, sample_length
from feedmux.server._delivery.dealing import RankDealer
from feedmux.server._delivery.ranking import RankedStage
from feedmux.server.config import BucketSpec, ServerConfig

WORLD, BATCH = 3, 4


def sample(i: int) -> dict[str, Any]:
    length = 1 + (i * 7919) % 23
    return {"id": np.int64(i), "tokens": np.full(length, i, np.int16), "n": length}


def run(stage: RankedStage, epoch: int, count: int, chunks: Sequence[int],
        first: int = 0) -> list[tuple[int, list[int], list[int]]]:
    """Feed ``count`` samples of ``epoch`` in chunks; every message as (rank, positions,
    ids), decoded as a trainer would, its tokens checked."""
    out = []
    messages: list[Any] = []
    index, turn = first, 0
    while index < count:
        stop = min(count, index + chunks[turn % len(chunks)])
        messages += stage.deal(epoch, index, [sample(i) for i in range(index, stop)])
        index, turn = stop, turn + 1
    messages += stage.finish_epoch(epoch)
    for message in messages:
        decoded = decode([bytes(frame) for frame in message.frames])
        assert isinstance(decoded, Data)
        tree = ragged_tree(decoded.samples.stacked(), pad=False)
        ids = tree["id"].tolist()
        assert [len(t) for t in tree["tokens"]] == tree["n"].tolist()
        assert all((t == i).all() for t, i in zip(tree["tokens"], ids, strict=True))
        out.append((message.rank, decoded.tags[:, 1].tolist(), ids))
    return out


def stage_of(start: tuple[int, int] | None = None, drop_last: bool = False,
             uneven: str = "pad", key: str = "tokens") -> RankedStage:
    batches = Batches(BATCH, drop_last, BucketSpec(key, window=36, seed=4))
    return RankedStage(RankDealer(WORLD, uneven), "srv", batches=batches, start=start)


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 150), chunks=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       steps=st.integers(0, 12), key=st.sampled_from(["tokens", "n"]))
def test_a_resumed_stage_deals_exactly_what_the_uninterrupted_one_dealt_after_the_position(
        count: int, chunks: list[int], steps: int, key: str) -> None:
    whole = run(stage_of(key=key), 2, count, [count])
    position = steps * WORLD * BATCH
    stage = stage_of(start=(2, position), key=key)
    assert stage.resamples_resumed_epoch
    resumed = run(stage, 2, count, chunks)

    def by_rank(got: list[tuple[int, list[int], list[int]]]) -> list[list[tuple[int, int]]]:
        return [[row for r, positions, ids in got if r == rank
                 for row in zip(positions, ids, strict=True)] for rank in range(WORLD)]

    assert by_rank(resumed) == [[(p, i) for p, i in rank if p >= position]
                                for rank in by_rank(whole)]
    # A message holds whole batches (the trainer cuts it every batch_size rows).
    for _, positions, _ in resumed:
        assert len(positions) % BATCH == 0 or positions[-1] >= count - WORLD * BATCH
    # Each rank's positions ascend and are those of ranked batches: k*n*B + j*n + r.
    for rank in range(WORLD):
        positions = [p for r, got, _ in whole if r == rank for p in got]
        assert positions == list(range(rank, rank + WORLD * len(positions), WORLD))


def test_the_last_partial_batches_are_dropped_and_counted_with_drop_last() -> None:
    stage = stage_of(drop_last=True)
    got = run(stage, 1, 50, [9])
    assert {len(ids) for _, _, ids in got} == {BATCH}
    assert len(got) == 4 * WORLD  # 50 = 4 steps of 12, the last 2 padded to 3, dropped
    assert stage.batches is not None and stage.batches.dropped == 3


def test_a_pass_goes_out_in_turns_across_the_ranks_so_a_stalled_rank_holds_up_one_message(
        ) -> None:
    # Variable-length samples do not stack: one message per batch. Dealt rank by rank, a
    # pass put all its messages for rank 0 before any of rank 1's, and a rank 0 that
    # stopped reading (its lane full) kept ranks 1 and 2 from their batches of that pass.
    got = run(stage_of(), 1, 150, [150])
    ranks = [rank for rank, _, _ in got]
    assert len(ranks) >= 4 * WORLD
    for before, after in itertools.pairwise(ranks):
        assert after == (before + 1) % WORLD, ranks


def test_a_rank_that_is_ahead_gets_nothing_it_had() -> None:
    batches = Batches(BATCH, False, BucketSpec("tokens", window=24))
    stage = BucketStage(WORLD, "pad", batches, ahead={1: (1, 13)})
    shares = stage.deal(1, [sample(i) for i in range(60)]) + stage.finish_epoch(1)
    rank1 = [p for share in shares if share.rank == 1 for p in share.tags[:, 1].tolist()]
    assert rank1 and min(rank1) >= 13 and 13 in rank1
    rank0 = [p for share in shares if share.rank == 0 for p in share.tags[:, 1].tolist()]
    assert rank0[:2] == [0, 3]


def test_a_sample_without_its_length_field_is_refused_clearly() -> None:
    assert sample_length({"tokens": np.zeros((5, 2))}, "tokens") == 5
    with pytest.raises(ConfigurationError, match=r"bucket_by='tokens': expected each sample a "
                       r"dict whose 'tokens' is its length .* got 'tokens': str 'abc'"):
        sample_length({"tokens": "abc"}, "tokens")
    with pytest.raises(ConfigurationError, match=r"got a tuple"):
        sample_length((1, 2), "tokens")
    with pytest.raises(ConfigurationError, match=r"got 'n': int -1"):
        sample_length({"n": -1}, "n")


def test_the_window_bounds_what_the_stage_holds_in_memory() -> None:
    window, size = 96, 1 << 14  # 96 samples of 16 KiB held at most: 1.5 MiB

    def peak(count: int) -> int:
        stage = BucketStage(WORLD, "pad", Batches(BATCH, False, BucketSpec("x", window)))
        rng = np.random.default_rng(0)
        tracemalloc.start()
        try:
            for _ in range(0, count, 24):
                rows = [{"x": np.ones(size - int(rng.integers(0, 64)), np.uint8)}
                        for _row in range(24)]
                assert all(share.items for share in stage.deal(1, rows))
                assert stage.window.held <= window
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    # Ten times the samples, the same peak: what is held is bounded by the window.
    small, large = peak(400), peak(4000)
    assert large < 1.3 * small and large < 4 * window * size


def test_the_first_ranks_hello_fixes_the_bucket_field_and_others_must_ask_the_same() -> None:
    request = BatchRequest()
    request.default_bucket_by = "n"  # the server's --bucket-by: for ranks that name none
    assert request.admit(Hello("a", world_size=2, rank=0, batch_size=4)) is None
    assert request.bucket_by == "n"
    refused = request.admit(Hello("b", world_size=2, rank=1, batch_size=4, bucket_by="tokens"))
    assert refused is not None and refused[1].endswith(
        "expected the same from rank 1 (trainer b), got batch_size=4, drop_last=False, "
        "bucket_by='tokens'")
    assert request.admit(Hello("c", world_size=2, rank=1, batch_size=4, bucket_by="n")) is None
    spec = request.assemblers(BucketSpec("", window=50, edges=(8,), seed=2))
    assert spec is not None and spec.buckets == BucketSpec("n", 50, (8,), 2)


@pytest.mark.parametrize(("hello", "said"), [
    (Hello("f", bucket_by="n"), "expected batch_size= with bucket_by='n', got batch_size=0 "
     "from trainer f"),
    (Hello("r", world_size=2, rank=0, bucket_by="n"), "expected batch_size= with "
     "bucket_by='n', got batch_size=0 from trainer r"),
    (Hello("r", world_size=3, rank=0, batch_size=4, bucket_by="n", resume=(1, 24, 2, 1)),
     "resumes with the world size of its checkpoint (its steps hold world_size x batch_size "
     "samples): expected world_size 2, got 3 from rank 0"),
])
def test_what_bucketed_dealing_cannot_serve_is_refused_clearly(hello: Hello, said: str) -> None:
    refused = BatchRequest().admit(hello)
    assert refused is not None and said in refused[1]


def test_a_free_trainer_may_ask_for_buckets_its_own() -> None:
    # Before: "bucket_by deals the steps of a data-parallel job: expected a ranked trainer".
    request = BatchRequest()
    request.default_bucket_by = "n"  # the server's --bucket-by is for the ranks that name none
    assert request.admit(Hello("f", batch_size=4, bucket_by="tokens")) is None
    assert request.key_of(Hello("f", batch_size=4, bucket_by="tokens")) == "tokens"
    assert request.key_of(Hello("g", batch_size=4)) == ""
    assert request.admit(Hello("r", world_size=2, rank=0, batch_size=8)) is None
    assert request.bucket_by == "n"  # the ranked job's, untouched by the free trainer's


def test_the_server_options_are_checked_and_parsed() -> None:
    config = ServerConfig("m:f", bucket_by="tokens", bucket_window=256, bucket_edges=[8, 64],
                          seed=3)
    assert config.buckets == BucketSpec("tokens", 256, (8, 64), 3)
    with pytest.raises(ConfigurationError, match=r"strictly ascending ints >= 1, got \[64, 8\]"):
        ServerConfig("m:f", bucket_edges=(64, 8))
    with pytest.raises(ConfigurationError, match="bucket_window an int >= 0 samples"):
        ServerConfig("m:f", bucket_window=-1)
    args = build_parser().parse_args(["serve", "m:f", "--bucket-by", "tokens",
                                      "--bucket-window", "512", "--bucket-edges", "16,128"])
    assert (args.bucket_by, args.bucket_window, args.bucket_edges) == ("tokens", 512, (16, 128))


@pytest.mark.parametrize("key", ["n", "x"])
def test_stacked_chunks_are_dealt_as_their_samples_are(key: str) -> None:
    def chunk(start: int, stop: int, stacked: bool) -> Sequence[Any]:
        rows = [{"id": np.int64(i), "n": 1 + (i * 7919) % 23, "x": np.full(3, i)}
                for i in range(start, stop)]
        return SampleBatch(stack_samples(rows), len(rows)) if stacked else rows

    def dealt(stacked: bool) -> list[tuple[int, list[int], list[int]]]:
        stage = stage_of(key=key)
        messages = [m for start in range(0, 100, 30)
                    for m in stage.deal(1, start, chunk(start, min(100, start + 30), stacked))]
        got = []
        for message in messages + list(stage.finish_epoch(1)):
            decoded = decode([bytes(frame) for frame in message.frames])
            assert isinstance(decoded, Data)
            tree = ragged_tree(decoded.samples.stacked(), pad=False)
            xs = tree["x"]  # the field bucketed by is length-led: a list of the arrays
            assert (type(xs) is list) == (key == "x")
            xs = [x.tolist() for x in xs] if key == "x" else xs.tolist()
            assert xs == [[i] * 3 for i in tree["id"].tolist()]
            got += [(message.rank, p, i) for p, i in zip(decoded.tags[:, 1].tolist(),
                                                         tree["id"].tolist(), strict=True)]
        return sorted(got)

    assert dealt(stacked=True) == dealt(stacked=False)


def test_the_servers_stats_count_what_the_window_did() -> None:
    request = BatchRequest()
    assert request.admit(Hello("a", world_size=WORLD, rank=0, batch_size=BATCH,
                               bucket_by="tokens")) is None
    batches = request.assemblers(BucketSpec("", window=36))
    assert batches is not None and request.bucket_stats() == {}  # no stage yet
    stage = RankedStage(RankDealer(WORLD, "pad"), "srv", batches=batches)
    run(stage, 1, 50, [9])
    stats = request.bucket_stats()
    assert stats["bucket_window"] == 36 and stats["bucket_held"] == 0
    assert stats["bucket_padded"] == 1  # 50 = 4 steps of 12 and 2, padded to a round of 3
    assert stats["bucket_window_steps"] >= 1 and stats["bucket_uneven_dropped"] == 0
