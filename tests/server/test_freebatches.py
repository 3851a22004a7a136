"""A free audience's batches cut per batch shape as they are dealt (pure, no sockets)."""

from __future__ import annotations

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


def sent(batches: FreeBatches, shape: tuple[int, bool]) -> list[list[int]]:
    """The positions of each batch built for ``shape``, taken."""
    pending = batches.pending_of(shape)
    out = [read_tags(frames)[:, 1].tolist() for frames, _, _ in pending]
    pending.clear()
    return out


def test_shapes_cut_their_own_batches_never_across_epochs() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False))
    batches.cut((4, False), message(1, [0, 1, 2]))
    batches.cut((2, False), message(1, [3, 4, 5]))
    assert sent(batches, (4, False)) == [] and sent(batches, (2, False)) == [[3, 4]]
    batches.cut((4, False), message(1, [6, 7]))
    assert sent(batches, (4, False)) == [[0, 1, 2, 6]]
    batches.cut((4, False), message(2, [0, 1]))  # a new epoch: the last one's rest, short
    assert sent(batches, (4, False)) == [[7]]
    assert batches.owed() == 2  # both shapes hold rows
    batches.finish_epoch(2)
    assert sent(batches, (4, False)) == [[0, 1]] and sent(batches, (2, False)) == [[5]]
    assert batches.owed() == 0


def test_drop_last_drops_only_an_epochs_last_partial_batch() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False))
    batches.cut((2, True), message(1, [0, 1, 2]))
    batches.cut((2, True), message(1, [0]))  # a lost trainer's rest, earlier: sent short
    assert sent(batches, (2, True)) == [[0, 1], [2]]
    batches.finish_epoch()
    assert sent(batches, (2, True)) == [] and batches.dropped == 1


def test_a_batch_is_stacked_with_every_number_an_array() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False))
    batches.cut((3, False), message(1, [0, 1, 2]))
    [(frames, count, epoch)] = batches.pending_of((3, False))
    decoded = decode(frames)
    assert isinstance(decoded, Data) and (count, epoch) == (3, 1)


def test_rows_that_do_not_stack_are_returned_as_samples() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False))
    batches.cut((4, False), message(1, [0], width=3))
    with pytest.raises(ProtocolError):
        batches.cut((4, False), message(1, [1, 2, 3], width=lambda p: p))
    assert [(shape, read_tags(frames)[:, 1].tolist()) for shape, frames in batches.returned] \
        == [((4, False), [0])]
    assert batches.owed() == 0  # the shape starts afresh


def test_a_shape_without_trainers_gives_its_rows_back() -> None:
    batches = FreeBatches("s", lambda client_id: (0, False))
    batches.cut((2, False), message(1, [0, 1, 2]))
    back = batches.release((2, False))
    assert [read_tags(frames)[:, 1].tolist() for frames in back] == [[0, 1], [2]]
    assert batches.shapes() == [] and batches.owed() == 0


def test_what_the_shapes_hold_and_did_not_send_is_outstanding() -> None:
    # Dealt (counted sent) and in no trainer's ledger: the summary of the hand-outs lists it.
    batches = FreeBatches("s", lambda client_id: (0, False))
    assert batches.outstanding() == []
    batches.cut((4, False), message(1, [0, 1, 2, 3, 4, 5]))
    batches.cut((3, False), message(1, [8, 9]))
    assert sorted(batches.outstanding()) == [(1, 0, 4), (1, 4, 6), (1, 8, 10)]
    sent(batches, (4, False))  # the built batch went to a trainer: its ledger has it now
    assert sorted(batches.outstanding()) == [(1, 4, 6), (1, 8, 10)]
    batches.cut((4, False), message(1, [6]))
    with pytest.raises(ProtocolError):  # rows given back, not dealt again yet: still owed
        batches.cut((4, False), message(1, [7], width=3))
    assert sorted(batches.outstanding()) == [(1, 4, 6), (1, 6, 7), (1, 8, 10)]
    batches.returned.clear()
    batches.finish_epoch()
    sent(batches, (3, False))
    assert batches.outstanding() == []
