"""Stream.epochs(): the epoch loop as a generator, with an optional tqdm progress bar."""

from __future__ import annotations

import io
import itertools
import math
import sys
from typing import Any

import pytest

from feedmux.client import Stream
from feedmux.errors import StreamError, StreamStateError, StreamTypeError, StreamValueError


def test_epochs_with_len_epoch_size() -> None:
    stream = Stream(range(3))
    seen = [(stream.epoch, list(data)) for data in stream.epochs(2)]
    assert seen == [(1, [0, 1, 2]), (2, [0, 1, 2])]
    assert (stream.epoch, stream.iteration) == (2, 6)


def test_epochs_with_custom_size_continue_the_stream() -> None:
    stream = Stream(range(3))
    assert [list(data) for data in stream.epochs(3, epoch_size=2)] == [[0, 1], [2, 0], [1, 2]]


def test_epochs_go_on_from_the_current_epoch() -> None:
    stream = Stream(range(3))
    stream.load_state_dict({"class": "Stream", "epoch": 2, "iteration": 0})
    assert [list(data) for data in stream.epochs(3)] == [[0, 1, 2]]
    assert list(stream.epochs(3)) == []
    assert list(stream.epochs(0)) == []


def test_epochs_inf() -> None:
    stream = Stream(range(3))
    epochs = itertools.islice(stream.epochs(math.inf, epoch_size=math.inf), 4)
    for data in epochs:
        assert len(list(itertools.islice(data, 5))) == 5
    assert (stream.epoch, stream.iteration) == (4, 20)


def test_epochs_epoch_size_none_reads_len_every_epoch() -> None:
    items = [1, 2]
    stream = Stream(items)
    out = []
    for data in stream.epochs(2):
        out.append(list(data))
        items.append(3)
    assert out == [[1, 2], [3, 1, 2]]


def test_unconsumed_epochs_still_count() -> None:
    stream = Stream(range(3))
    for _ in stream.epochs(4):
        pass
    assert (stream.epoch, stream.iteration) == (4, 0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_epoch": 2.5}, StreamStateError),
        ({"max_epoch": "2"}, StreamTypeError),
        ({"max_epoch": None}, StreamTypeError),
        ({"max_epoch": 2, "epoch_size": 1.5}, StreamStateError),
        ({"max_epoch": 2, "epoch_size": "3"}, StreamTypeError),
    ],
    ids=repr,
)
def test_epochs_checks_arguments_at_call_time(kwargs: dict[str, Any], error: type) -> None:
    stream = Stream(range(3))
    with pytest.raises(error):
        stream.epochs(**kwargs)
    assert stream.epoch == 0


def test_epochs_without_length_fails_at_the_epoch() -> None:
    stream = Stream(iter(range(3)))
    epochs = stream.epochs(2)
    with pytest.raises(StreamValueError, match="epoch_size=None means len"):
        next(epochs)


def test_progress_bar_per_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    errors = io.StringIO()
    monkeypatch.setattr(sys, "stderr", errors)
    stream = Stream(range(4))
    bars = []
    out = []
    for data in stream.epochs(2, progress=True):
        out.append(list(data))
        bars.append(data.bar)  # type: ignore[attr-defined]
    assert out == [[0, 1, 2, 3]] * 2
    assert [(bar.n, bar.total, bar.desc) for bar in bars] == [(4, 4, "epoch 1"), (4, 4, "epoch 2")]
    assert "epoch 2" in errors.getvalue()


def test_progress_bar_without_total_and_early_break(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    stream = Stream(range(3))
    epochs = stream.epochs(3, epoch_size=math.inf, progress=True)
    first = next(epochs)
    assert first.bar.total is None  # type: ignore[attr-defined]
    assert list(itertools.islice(first, 2)) == [0, 1]
    second = next(epochs)  # leaving an epoch early closes its bar
    assert list(itertools.islice(second, 1)) == [2]
    epochs.close()
    assert first.bar.n == 2  # type: ignore[attr-defined]


def test_progress_without_tqdm_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    stream = Stream(range(3))
    with pytest.raises(StreamError, match=r"pip install tqdm.*feedmux\[progress\]") as info:
        stream.epochs(2, progress=True)
    assert isinstance(info.value.__cause__, ImportError)
    assert stream.epoch == 0
    assert [list(data) for data in stream.epochs(1)] == [[0, 1, 2]]  # without progress: fine
