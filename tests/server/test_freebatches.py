"""A free audience's batches cut per batch shape as they are dealt (pure, no sockets)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import Data, decode, encode, read_tags
from feedmux.server._delivery.freebatches import FreeBatches


def message(epoch: int, positions: list[int], width: Any = 2) -> list[Any]:
    """Samples ``{"id": p, "x": zeros(width)}`` (``width`` a function of p: variable)."""
    tags = np.array([[epoch, p] for p in positions], dtype=np.int64)
    samples = [{"id": p, "x": np.zeros(width(p) if callable(width) else width)}
               for p in positions]
    return list(encode(Data(tags, samples, "s")))


def sent(batches: FreeBatches, shape: tuple[int, bool, str]) -> list[list[int]]:
    """The positions of each batch built for ``shape``, taken."""
    pending = batches.pending_of(shape)
    out = [read_tags(frames)[:, 1].tolist() for frames, _, _ in pending]
    pending.clear()
    return out


def test_shapes_cut_their_own_batches_never_across_epochs() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False, ""))
    batches.cut((4, False, ""), message(1, [0, 1, 2]))
    batches.cut((2, False, ""), message(1, [3, 4, 5]))
    assert sent(batches, (4, False, "")) == [] and sent(batches, (2, False, "")) == [[3, 4]]
    batches.cut((4, False, ""), message(1, [6, 7]))
    assert sent(batches, (4, False, "")) == [[0, 1, 2, 6]]
    batches.cut((4, False, ""), message(2, [0, 1]))  # a new epoch: the last one's rest, short
    assert sent(batches, (4, False, "")) == [[7]]
    assert batches.owed() == 2  # both shapes hold rows
    batches.finish_epoch(2)
    assert sent(batches, (4, False, "")) == [[0, 1]] and sent(batches, (2, False, "")) == [[5]]
    assert batches.owed() == 0


def test_drop_last_drops_only_an_epochs_last_partial_batch() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False, ""))
    batches.cut((2, True, ""), message(1, [0, 1, 2]))
    batches.cut((2, True, ""), message(1, [0]))  # a lost trainer's rest, earlier: sent short
    assert sent(batches, (2, True, "")) == [[0, 1], [2]]
    batches.finish_epoch()
    assert sent(batches, (2, True, "")) == [] and batches.dropped == 1


def test_a_batch_is_stacked_with_every_number_an_array() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False, ""))
    batches.cut((3, False, ""), message(1, [0, 1, 2]))
    [(frames, count, epoch)] = batches.pending_of((3, False, ""))
    decoded = decode(frames)
    assert isinstance(decoded, Data) and (count, epoch) == (3, 1)


def test_rows_that_do_not_stack_are_returned_as_samples() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False, ""))
    batches.cut((4, False, ""), message(1, [0], width=3))
    with pytest.raises(ProtocolError):
        batches.cut((4, False, ""), message(1, [1, 2, 3], width=lambda p: p))
    assert [(shape, read_tags(frames)[:, 1].tolist()) for shape, frames in batches.returned] \
        == [((4, False, ""), [0])]
    assert batches.owed() == 0  # the shape starts afresh


def test_a_shape_without_trainers_gives_its_rows_back() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False, ""))
    batches.cut((2, False, ""), message(1, [0, 1, 2]))
    back = batches.release((2, False, ""))
    assert [read_tags(frames)[:, 1].tolist() for frames in back] == [[0, 1], [2]]
    assert batches.shapes() == [] and batches.owed() == 0


def test_what_the_shapes_hold_and_did_not_send_is_outstanding() -> None:
    # Dealt (counted sent) and in no trainer's ledger: the summary of the hand-outs lists it.
    batches = FreeBatches("s", lambda client_id: (0, False, ""))
    assert batches.outstanding() == []
    batches.cut((4, False, ""), message(1, [0, 1, 2, 3, 4, 5]))
    batches.cut((3, False, ""), message(1, [8, 9]))
    assert sorted(batches.outstanding()) == [(1, 0, 4), (1, 4, 6), (1, 8, 10)]
    sent(batches, (4, False, ""))  # the built batch went to a trainer: its ledger has it now
    assert sorted(batches.outstanding()) == [(1, 4, 6), (1, 8, 10)]
    batches.cut((4, False, ""), message(1, [6]))
    with pytest.raises(ProtocolError):  # rows given back, not dealt again yet: still owed
        batches.cut((4, False, ""), message(1, [7], width=3))
    assert sorted(batches.outstanding()) == [(1, 4, 6), (1, 6, 7), (1, 8, 10)]
    batches.returned.clear()
    batches.finish_epoch()
    sent(batches, (3, False, ""))
    assert batches.outstanding() == []


# -- a free trainer's buckets (bucket_by=) ----------------------------------------------------
def length_of(position: int) -> int:
    return 1 + (position * 7919) % 23  # 1 .. 23, scattered over the positions


def bucketed(batches: FreeBatches, shape: tuple[int, bool, str]) -> list[tuple[list[int], Any]]:
    """Each batch built for ``shape``, taken: its positions and its decoded samples."""
    pending = batches.pending_of(shape)
    out = []
    for frames, count, _ in pending:
        decoded = decode(frames)
        assert isinstance(decoded, Data) and count == len(decoded.tags)
        out.append((decoded.tags[:, 1].tolist(), decoded.samples.stacked()))
    pending.clear()
    return out


@pytest.mark.parametrize("edges", [(), (6, 12)])
def test_a_bucket_shape_cuts_each_epoch_into_batches_of_similar_length_every_row_once(
        edges: tuple[int, ...]) -> None:
    from feedmux.server.config import BucketSpec
    shape = (4, False, "x")
    batches = FreeBatches("s", lambda client_id: shape, BucketSpec("", window=16, edges=edges))
    got: list[tuple[list[int], Any]] = []
    for epoch in (1, 2):
        for start in range(0, 70, 7):
            batches.cut(shape, message(epoch, list(range(start, start + 7)), width=length_of))
            got += bucketed(batches, shape)
        batches.finish_epoch(epoch)
        got += bucketed(batches, shape)
        assert batches.outstanding() == [] and batches.owed() == 0
    positions = [p for batch, _ in got for p in batch]
    assert sorted(positions) == sorted(list(range(70)) * 2)  # each epoch's rows once
    for batch, tree in got:
        assert batch == sorted(batch)  # a batch's rows in position order: marks cut it
        lengths = [length_of(p) for p in batch]
        assert tree["id"].tolist() == batch
        padded = tree["x"]["__feedmux_padded__"]
        assert tree["x"]["__feedmux_lengths__"].tolist() == lengths
        assert padded.shape == (len(batch), max(lengths))
        if edges:  # each batch of one bucket
            assert len({sum(length >= edge for edge in edges) for length in lengths}) == 1
    assert max(max(length_of(p) for p in batch) - min(length_of(p) for p in batch)
               for batch, _ in got) < 12  # similar lengths, not 1 .. 23 as dealt
    short = [len(batch) for batch, _ in got if len(batch) < 4]
    assert len(short) <= 2 * (len(edges) + 1)  # an epoch's last of each bucket at most


def test_a_bucket_shape_with_drop_last_drops_the_short_batches_at_the_epochs_end() -> None:
    from feedmux.server.config import BucketSpec
    shape = (4, True, "x")
    batches = FreeBatches("s", lambda client_id: shape, BucketSpec("", window=8, edges=(12,)))
    batches.cut(shape, message(1, list(range(30)), width=length_of))
    batches.finish_epoch(1)
    got = bucketed(batches, shape)
    assert all(len(batch) == 4 for batch, _ in got)
    assert batches.dropped == 30 - 4 * len(got) > 0


def test_what_a_bucket_shape_holds_is_outstanding_and_given_back_as_its_samples() -> None:
    from feedmux.server.config import BucketSpec
    shape = (4, False, "x")
    batches = FreeBatches("s", lambda client_id: shape, BucketSpec("", window=64))
    batches.cut(shape, message(1, [0, 1, 2, 3, 4], width=length_of))
    batches.cut(shape, message(1, [9, 10], width=length_of))
    assert batches.pending_of(shape) == deque() and batches.owed() == 1
    assert batches.outstanding() == [(1, 0, 5), (1, 9, 11)]
    back = batches.release(shape)
    assert [read_tags(frames)[:, 1].tolist() for frames in back] == [[0, 1, 2, 3, 4], [9, 10]]
    for frames in back:
        decoded = decode(frames)
        assert isinstance(decoded, Data)
        for sample in decoded.samples:
            assert sample["x"].shape == (length_of(int(sample["id"])),)
    assert batches.owed() == 0 and batches.outstanding() == []


def test_a_bucketed_batch_dealt_again_is_cut_as_its_samples() -> None:
    # A lost bucketing trainer's batch goes to the others: a shape cuts its samples (their
    # own arrays, not the padded leaf), a plain shape stacks them when they are alike.
    from feedmux.server.config import BucketSpec
    shape = (2, False, "x")
    batches = FreeBatches("s", lambda client_id: shape, BucketSpec("", window=2))
    batches.cut(shape, message(1, [0, 1, 2, 3], width=lambda p: 3 + p % 2))
    padded = [frames for frames, _, _ in batches.pending_of(shape)]
    assert len(padded) == 2
    other = (3, False, "x")
    for frames in padded:
        batches.cut(other, frames)
    batches.finish_epoch(1)
    [(positions, tree)] = bucketed(batches, other)[-1:]
    assert tree["x"]["__feedmux_lengths__"].tolist() == [3 + p % 2 for p in positions]
    alike = FreeBatches("s", lambda client_id: shape, BucketSpec("", window=2))
    alike.cut(shape, message(1, [0, 2], width=3))
    [(frames, _, _)] = alike.pending_of(shape)
    alike.cut((2, False, ""), frames)
    assert [batch for batch in sent(alike, (2, False, ""))] == [[0, 2]]


def test_samples_without_the_bucket_field_are_the_trainers_error_and_come_back() -> None:
    from feedmux.server.config import BucketSpec
    shape = (2, False, "length")
    batches = FreeBatches("s", lambda client_id: shape, BucketSpec("", window=8))
    with pytest.raises(ProtocolError, match=r"bucket_by='length': expected each sample a dict"):
        batches.cut(shape, message(1, [0, 1, 2]))
    assert batches.returned == [] and batches.owed() == 0
