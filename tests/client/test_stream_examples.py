"""The documented examples, verbatim: they print what zero 0.0.2 prints.

The same examples run as doctests in ``feedmux/client/stream.py`` and in
``docs/stream.md``; both are run from here too, so ``pytest tests/client`` covers
them without the doctest collection of the whole package.
"""

from __future__ import annotations

import doctest
import math
from itertools import repeat
from pathlib import Path

import pytest

from feedmux.client import ManualStream, Stream
from feedmux.client import stream as stream_module

DOCS = Path(__file__).resolve().parents[2] / "docs" / "stream.md"


def test_epochs_of_len_loader(capsys: pytest.CaptureFixture[str]) -> None:
    stream = Stream(range(5))
    while stream.increment_epoch(2):
        for x in stream.data():
            print(stream.epoch, stream.iteration, x)
    assert capsys.readouterr().out.split("\n") == [
        "1 1 0",
        "1 2 1",
        "1 3 2",
        "1 4 3",
        "1 5 4",
        "2 6 0",
        "2 7 1",
        "2 8 2",
        "2 9 3",
        "2 10 4",
        "",
    ]
    assert (stream.epoch, stream.iteration) == (2, 10)


def test_custom_epoch_size_does_not_start_over() -> None:
    stream = Stream(range(5))
    epochs = []
    while stream.increment_epoch(3):
        epochs.append(list(stream.data(3)))
    assert epochs == [[0, 1, 2], [3, 4, 0], [1, 2, 3]]
    assert (stream.epoch, stream.iteration) == (3, 9)


def test_epoch_larger_than_the_loader() -> None:
    stream = Stream(range(5))
    assert list(stream.data(7)) == [0, 1, 2, 3, 4, 0, 1]
    assert list(stream.data(7)) == [2, 3, 4, 0, 1, 2, 3]


def test_one_shot_iterator_runs_dry() -> None:
    stream = Stream(iter(range(5)))
    epochs = []
    while stream.increment_epoch(3):
        epochs.append(list(stream.data(4)))
    assert epochs == [[0, 1, 2, 3], [4], []]
    assert stream.epoch == 3


def test_infinite_loop_with_data_inf() -> None:
    stream = Stream(range(5))
    seen = []
    for x in stream.data(math.inf):
        seen.append((stream.iteration, x))
        if stream.iteration == 12:
            break
    assert seen == [(i, (i - 1) % 5) for i in range(1, 13)]


def test_infinite_loop_with_next() -> None:
    stream = Stream(range(5))
    seen = []
    while True:
        x = stream.next()
        seen.append((stream.iteration, x))
        if stream.iteration == 12:
            break
    assert seen == [(i, (i - 1) % 5) for i in range(1, 13)]


def test_set_loader_inside_the_loop(capsys: pytest.CaptureFixture[str]) -> None:
    stream = Stream(repeat(0))
    for x in stream.data(5):
        print(stream.iteration, x)
        if stream.iteration == 2:
            stream.set_loader(repeat(1))
    assert capsys.readouterr().out == "1 0\n2 0\n3 1\n4 1\n5 1\n"


def test_manual_stream_two_items_per_step() -> None:
    stream = ManualStream(range(5))
    steps = []
    batch: list[int] = []
    for x in stream.data(n_msteps=3):
        batch.append(x)
        if len(batch) == 2:
            steps.append(tuple(batch))
            batch.clear()
            stream.increment_mstep()
    assert steps == [(0, 1), (2, 3), (4, 0)]
    assert (stream.mstep, stream.iteration) == (3, 6)


def test_docstring_examples() -> None:
    result = doctest.testmod(stream_module, optionflags=doctest.ELLIPSIS, raise_on_error=False)
    assert result.attempted >= 20
    assert result.failed == 0


def test_docs_page_examples() -> None:
    result = doctest.testfile(
        str(DOCS), module_relative=False, optionflags=doctest.ELLIPSIS, raise_on_error=False
    )
    assert result.attempted >= 10
    assert result.failed == 0
