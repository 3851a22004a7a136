"""ManualStream: everything of Stream plus an independent manual-step counter."""

from __future__ import annotations

import itertools
import math

import pytest

from feedmux.client import ManualStream, Stream
from feedmux.errors import StreamStateError, StreamTypeError, StreamValueError


def test_is_a_stream_with_mstep_starting_at_zero() -> None:
    stream = ManualStream(range(3))
    assert isinstance(stream, Stream)
    assert (stream.mstep, stream.iteration, stream.epoch) == (0, 0, 0)
    with pytest.raises(AttributeError):
        stream.mstep = 1  # type: ignore[misc]


def test_constructor_checks_like_stream() -> None:
    with pytest.raises(StreamStateError):
        ManualStream([])
    ManualStream(iter([]))


def test_mstep_and_iteration_are_independent() -> None:
    stream = ManualStream(range(3))
    stream.increment_mstep()
    stream.increment_mstep()
    assert (stream.mstep, stream.iteration) == (2, 0)
    assert [stream.next() for _ in range(4)] == [0, 1, 2, 0]
    assert (stream.mstep, stream.iteration, stream.epoch) == (2, 4, 0)


def test_data_n_msteps_yields_until_mstep_advanced() -> None:
    stream = ManualStream(range(5))
    data = stream.data(n_msteps=1)
    assert [next(data), next(data), next(data)] == [0, 1, 2]
    assert stream.iteration == 3
    stream.increment_mstep()
    with pytest.raises(StopIteration):
        next(data)
    assert stream.iteration == 3


def test_data_n_msteps_counts_from_the_call() -> None:
    stream = ManualStream(range(5))
    stream.increment_mstep()
    data = stream.data(n_msteps=2)
    assert next(data) == 0
    stream.increment_mstep()
    assert next(data) == 1
    stream.increment_mstep()
    assert list(data) == []
    assert stream.mstep == 3


def test_data_n_msteps_zero_and_inf() -> None:
    stream = ManualStream(range(2))
    assert list(stream.data(n_msteps=0)) == []
    assert list(itertools.islice(stream.data(n_msteps=math.inf), 5)) == [0, 1, 0, 1, 0]


def test_data_n_iterations_behaves_like_stream_data() -> None:
    stream = ManualStream(range(5))
    assert list(stream.data(n_iterations=7)) == [0, 1, 2, 3, 4, 0, 1]
    assert list(stream.data(n_iterations=0)) == []
    assert list(itertools.islice(stream.data(n_iterations=math.inf), 3)) == [2, 3, 4]
    assert stream.mstep == 0


def test_data_n_msteps_ends_quietly_on_a_spent_iterator() -> None:
    stream = ManualStream(iter(range(3)))
    assert list(stream.data(n_msteps=1)) == [0, 1, 2]


@pytest.mark.parametrize(
    "kwargs", [{}, {"n_iterations": 1, "n_msteps": 1}, {"n_iterations": None, "n_msteps": None}]
)
def test_data_needs_exactly_one_argument(kwargs: dict[str, int]) -> None:
    with pytest.raises(StreamStateError, match="exactly one of n_iterations and n_msteps") as info:
        ManualStream(range(3)).data(**kwargs)
    assert isinstance(info.value, AssertionError)


def test_data_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        ManualStream(range(3)).data(3)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["n_iterations", "n_msteps"])
def test_data_refuses_finite_floats_and_non_numbers(name: str) -> None:
    stream = ManualStream(range(3))
    with pytest.raises(StreamStateError, match=name):
        stream.data(**{name: 1.5})
    with pytest.raises(StreamTypeError, match=name):
        stream.data(**{name: "2"})  # type: ignore[arg-type]


def test_data_needs_n_iterations_not_len() -> None:
    """There is no "len(loader)" default in ManualStream.data: None is "not given"."""
    with pytest.raises(StreamStateError):
        ManualStream(range(3)).data(n_iterations=None)


def test_epochs_count_iterations_not_msteps() -> None:
    stream = ManualStream(range(3))
    assert [list(epoch) for epoch in stream.epochs(2)] == [[0, 1, 2], [0, 1, 2]]
    assert [list(epoch) for epoch in stream.epochs(3, epoch_size=2)] == [[0, 1]]
    assert stream.mstep == 0


def test_epochs_on_a_len_less_loader_need_an_epoch_size() -> None:
    stream = ManualStream(iter(range(3)))
    epochs = stream.epochs(1)
    with pytest.raises(StreamValueError, match="epoch_size"):
        next(epochs)
