"""Stream: the zero 0.0.2 loop semantics on lists, ranges, iterators and generators."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedmux.client import ManualStream, Stream
from feedmux.client import stream as stream_module
from feedmux.errors import StreamError, StreamStateError, StreamTypeError, StreamValueError


class LenRaises:
    """An iterable whose ``len()`` raises, like a DataLoader over an IterableDataset."""

    def __init__(self, items: list[int], error: type[Exception] = TypeError) -> None:
        self.items = items
        self.error = error

    def __iter__(self) -> Iterator[int]:
        return iter(self.items)

    def __len__(self) -> int:
        raise self.error("no length here")


class GetItemOnly:
    """An old-style sequence: iterable through ``__getitem__`` only."""

    def __getitem__(self, index: int) -> int:
        if index >= 3:
            raise IndexError(index)
        return index * 10


# --- construction and properties ---------------------------------------------------------


def test_properties_start_at_zero_and_are_read_only() -> None:
    loader = [7]
    stream = Stream(loader)
    assert (stream.iteration, stream.epoch) == (0, 0)
    assert stream.loader is loader
    for name in ("iteration", "epoch", "loader"):
        with pytest.raises(AttributeError):
            setattr(stream, name, None)


@pytest.mark.parametrize("empty", [[], range(0), (), {}, ""], ids=repr)
def test_empty_sized_loader_is_refused(empty: object) -> None:
    with pytest.raises(StreamStateError, match="empty") as info:
        Stream(empty)  # type: ignore[arg-type]
    assert isinstance(info.value, AssertionError)
    assert isinstance(info.value, StreamError)


@pytest.mark.parametrize(
    "loader",
    [
        iter([]),  # an exhausted-looking iterator is not sized: accepted, as in zero
        (x for x in range(3)),
        itertools.count(),
        LenRaises([1, 2]),
        LenRaises([1, 2], NotImplementedError),
        GetItemOnly(),
        "abc",
    ],
    ids=["iterator", "generator", "count", "len-TypeError", "len-NotImplemented", "getitem", "str"],
)
def test_len_less_and_one_shot_loaders_are_accepted(loader: object) -> None:
    Stream(loader)  # type: ignore[arg-type]


# ids by type: repr(object()) holds an address, which differs between test processes.
@pytest.mark.parametrize("not_iterable", [5, None, 1.5, object()],
                         ids=lambda value: type(value).__name__)
def test_non_iterable_loader_is_a_type_error(not_iterable: object) -> None:
    with pytest.raises(StreamTypeError, match="expected an iterable") as info:
        Stream(not_iterable)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)


def test_getitem_only_loader_cycles() -> None:
    stream: Stream[int] = Stream(GetItemOnly())  # type: ignore[arg-type]
    assert [stream.next() for _ in range(5)] == [0, 10, 20, 0, 10]


def test_repr_names_class_loader_and_counters() -> None:
    stream = ManualStream(range(3))
    stream.next()
    assert repr(stream) == "<ManualStream over range: epoch=0, iteration=1, mstep=0>"


# --- next() -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", range(1, 5))
def test_next_cycles_a_finite_iterable(size: int) -> None:
    stream = Stream(range(size))
    for step in range(3 * size):
        assert stream.next() == step % size
        assert stream.iteration == step + 1
    assert stream.epoch == 0


@pytest.mark.parametrize("size", range(1, 4))
def test_next_on_a_spent_iterator_raises_stop_iteration_every_time(size: int) -> None:
    stream = Stream(iter(range(size)))
    assert [stream.next() for _ in range(size)] == list(range(size))
    for _ in range(3):
        with pytest.raises(StopIteration):
            stream.next()
    assert stream.iteration == size


def test_next_on_an_exhausted_generator() -> None:
    stream = Stream(x * x for x in range(3))
    assert [stream.next() for _ in range(3)] == [0, 1, 4]
    with pytest.raises(StopIteration):
        stream.next()


def test_iterator_is_created_lazily() -> None:
    calls = []

    class Recording:
        def __iter__(self) -> Iterator[int]:
            calls.append("iter")
            return iter([1, 2])

    stream = Stream(Recording())
    assert calls == []
    assert stream.next() == 1
    assert calls == ["iter"]
    assert stream.next() == 2
    assert stream.next() == 1  # one reload per exhaustion
    assert calls == ["iter", "iter"]


def test_next_reloads_only_once_then_propagates() -> None:
    """A re-iterable that turns empty: the reload yields nothing, StopIteration escapes."""
    items = [1, 2]
    stream = Stream(items)
    assert [stream.next(), stream.next()] == [1, 2]
    items.clear()
    with pytest.raises(StopIteration):
        stream.next()
    assert stream.iteration == 2
    items.append(3)
    assert stream.next() == 3


def test_a_loader_error_propagates_and_does_not_count() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise OSError("disk gone")

    stream = Stream(broken())
    assert stream.next() == 1
    with pytest.raises(OSError, match="disk gone"):
        stream.next()
    assert stream.iteration == 1


# --- increment_epoch() ------------------------------------------------------------------


def test_increment_epoch_without_max_always_increments() -> None:
    stream = Stream(range(3))
    for epoch in range(1, 11):
        assert stream.increment_epoch() is True
        assert stream.epoch == epoch
    assert stream.iteration == 0


def test_increment_epoch_with_max() -> None:
    stream = Stream(range(3))
    assert stream.increment_epoch(2) is True
    assert stream.increment_epoch(2) is True
    assert stream.increment_epoch(2) is False
    assert stream.epoch == 2
    assert stream.increment_epoch(0) is False
    assert stream.increment_epoch(-1) is False
    assert stream.increment_epoch(math.inf) is True
    assert stream.increment_epoch(max=3) is False
    assert stream.increment_epoch(-math.inf) is False
    assert stream.epoch == 3


@pytest.mark.parametrize("bad", [1.0, 2.5, -0.5, math.nan])
def test_increment_epoch_refuses_finite_floats(bad: float) -> None:
    stream = Stream(range(3))
    with pytest.raises(StreamStateError, match=r"math\.inf") as info:
        stream.increment_epoch(bad)
    assert isinstance(info.value, AssertionError)
    assert stream.epoch == 0


@pytest.mark.parametrize("bad", ["2", True, [2]], ids=repr)
def test_increment_epoch_refuses_non_numbers(bad: object) -> None:
    with pytest.raises(StreamTypeError, match="max"):
        Stream(range(3)).increment_epoch(bad)  # type: ignore[arg-type]


def test_numpy_counts_are_accepted() -> None:
    stream = Stream(range(5))
    assert stream.increment_epoch(np.int64(1))
    assert list(stream.data(np.int32(2))) == [0, 1]
    assert len(list(itertools.islice(stream.data(np.float64(np.inf)), 4))) == 4
    with pytest.raises(StreamStateError):
        stream.data(np.float32(2.0))


# --- data() -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", range(1, 6))
def test_data_none_is_len_and_sizes_continue_where_the_last_stopped(size: int) -> None:
    for epoch_size in [None, *range(1, 2 * size)]:
        per_epoch = size if epoch_size is None else epoch_size
        stream = Stream(range(size))
        chunks = [list(stream.data(epoch_size)) for _ in range(6)]
        flat = [step % size for step in range(6 * per_epoch)]
        assert chunks == [flat[i * per_epoch : (i + 1) * per_epoch] for i in range(6)]
        assert stream.iteration == 6 * per_epoch


def test_data_zero_yields_nothing() -> None:
    stream = Stream(range(3))
    assert [list(stream.data(0)) for _ in range(3)] == [[], [], []]
    assert stream.iteration == 0


def test_data_negative_yields_nothing_as_in_zero() -> None:
    stream = Stream(range(3))
    assert list(stream.data(-2)) == []
    assert list(stream.data(-math.inf)) == []


def test_data_inf_never_ends() -> None:
    stream = Stream(range(3))
    assert list(itertools.islice(stream.data(math.inf), 100)) == [i % 3 for i in range(100)]
    assert stream.iteration == 100


def test_data_over_an_infinite_iterator() -> None:
    stream = Stream(itertools.count())
    assert [list(stream.data(3)) for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_data_ends_quietly_when_a_one_shot_loader_runs_dry() -> None:
    stream = Stream(iter(range(5)))
    assert list(stream.data(3)) == [0, 1, 2]
    assert list(stream.data(3)) == [3, 4]
    assert list(stream.data(3)) == []
    assert list(stream.data(math.inf)) == []


def test_data_inside_a_generator_does_not_become_runtime_error() -> None:
    stream = Stream(iter(range(3)))

    def twice() -> Iterator[int]:
        for x in stream.data(10):
            yield 2 * x

    assert list(twice()) == [0, 2, 4]
    assert not isinstance(stream.data(1), type(twice()))


@pytest.mark.parametrize(
    "loader",
    [iter(range(3)), itertools.count(), (x for x in range(3)), LenRaises([1])],
    ids=["iterator", "count", "generator", "len-raises"],
)
def test_data_none_without_length_is_a_value_error(loader: object) -> None:
    stream: Stream[object] = Stream(loader)  # type: ignore[arg-type]
    with pytest.raises(StreamValueError, match="n_items") as info:
        stream.data()
    assert isinstance(info.value, ValueError)
    assert stream.iteration == 0


def test_data_none_reads_len_at_call_time() -> None:
    items = [1, 2, 3]
    stream = Stream(items)
    data = stream.data()
    items.append(4)  # too late for `data`, which already decided on 3
    assert list(data) == [1, 2, 3]
    assert list(stream.data()) == [4, 1, 2, 3]


def test_data_none_on_a_loader_whose_length_comes_later() -> None:
    """The RemoteLoader case: len() raises TypeError until the epoch size is known."""

    class LateLength:
        known: int | None = None

        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

        def __len__(self) -> int:
            if self.known is None:
                raise TypeError("epoch size not known yet")
            return self.known

    loader = LateLength()
    stream = Stream(loader)
    with pytest.raises(
        StreamValueError, match=r"loader \(LateLength\) has no length yet \(epoch size not known"
    ) as info:
        stream.data()
    assert isinstance(info.value.__cause__, TypeError)
    assert list(stream.data(2)) == [0, 1]
    loader.known = 3
    assert list(stream.data()) == [2, 3, 0]


@pytest.mark.parametrize("bad", [2.0, 0.5, -1.5, math.nan])
def test_data_refuses_finite_floats(bad: float) -> None:
    with pytest.raises(StreamStateError, match=r"n_items: expected an int or math.inf"):
        Stream(range(3)).data(bad)


@pytest.mark.parametrize("bad", ["3", b"3", [3], False], ids=repr)
def test_data_refuses_non_numbers(bad: object) -> None:
    with pytest.raises(StreamTypeError, match="n_items") as info:
        Stream(range(3)).data(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)


def test_next_calls_count_toward_a_running_data_iterator() -> None:
    stream = Stream(range(10))
    data = stream.data(5)
    assert next(data) == 0
    assert stream.next() == 1
    assert stream.next() == 2
    assert list(data) == [3, 4]
    assert stream.iteration == 5


def test_interleaved_data_iterators_share_the_counter() -> None:
    stream = Stream(range(10))
    first = stream.data(4)
    second = stream.data(6)
    assert [next(first), next(second), next(first), next(second)] == [0, 1, 2, 3]
    assert list(first) == []  # 4 iterations since `first` started
    assert list(second) == [4, 5]  # 6 since `second` started
    late = stream.data(2)
    assert list(late) == [6, 7]
    assert stream.iteration == 8


def test_data_iterator_is_its_own_iterator() -> None:
    data = Stream(range(3)).data(2)
    assert iter(data) is data


# --- reload_iterator() and set_loader() ---------------------------------------------------


def test_reload_iterator_restarts_an_iterable_and_is_a_no_op_for_an_iterator() -> None:
    stream = Stream(range(10))
    for _ in range(5):
        assert stream.next() == 0
        stream.reload_iterator()

    stream = Stream(iter(range(5)))
    for expected in range(5):
        assert stream.next() == expected
        stream.reload_iterator()
    with pytest.raises(StopIteration):
        stream.next()


def test_reload_iterator_in_the_middle_of_data_skips_the_rest_of_the_pass() -> None:
    stream = Stream(range(5))
    out = []
    for x in stream.data(6):
        out.append(x)
        if x == 2:
            stream.reload_iterator()
    assert out == [0, 1, 2, 0, 1, 2]


def test_set_loader_before_start_is_lazy() -> None:
    stream = Stream([1])
    calls = []

    class Recording:
        def __iter__(self) -> Iterator[int]:
            calls.append("iter")
            return iter([5, 6])

    stream.set_loader(Recording())
    assert calls == []
    assert stream.next() == 5
    assert calls == ["iter"]


def test_set_loader_switches_at_once_mid_epoch_and_keeps_counters() -> None:
    stream = Stream(range(5))
    assert stream.increment_epoch()
    data = stream.data()  # 5 items, decided now
    assert [next(data), next(data)] == [0, 1]
    new_loader = range(100, 103)
    stream.set_loader(new_loader)
    assert stream.loader is new_loader
    assert list(data) == [100, 101, 102]  # the rest of range(5)'s pass is dropped
    assert (stream.epoch, stream.iteration) == (1, 5)
    assert list(stream.data()) == [100, 101, 102]  # the new length from now on
    assert stream.iteration == 8


def test_set_loader_alternating_infinite_iterators() -> None:
    zeros, ones = itertools.repeat(0), itertools.repeat(1)
    stream = Stream([2])
    stream.set_loader(zeros)
    for step in range(10):
        assert stream.next() == (1 if step % 2 else 0)
        stream.set_loader(zeros if step % 2 else ones)


def test_set_loader_refuses_an_empty_loader_and_keeps_the_old_one() -> None:
    loader = range(3)
    stream = Stream(loader)
    stream.next()
    with pytest.raises(StreamStateError, match="empty"):
        stream.set_loader([])
    with pytest.raises(StreamTypeError):
        stream.set_loader(3)  # type: ignore[arg-type]
    assert stream.loader is loader
    assert stream.next() == 1


def test_set_loader_accepts_len_less_loaders() -> None:
    stream = Stream(range(3))
    stream.next()
    stream.set_loader(LenRaises([9]))
    assert stream.next() == 9


# --- a model check ---------------------------------------------------------------------


operations = st.lists(
    st.one_of(
        st.just(("next", 0)),
        st.just(("epoch", 0)),
        st.just(("reload", 0)),
        st.tuples(st.just("data"), st.integers(0, 12)),
    ),
    max_size=30,
)


@given(size=st.integers(1, 6), ops=operations)
def test_stream_matches_a_cycling_model(size: int, ops: list[tuple[str, int]]) -> None:
    """Over range(size), the stream is a position that wraps around; nothing else."""
    stream = Stream(range(size))
    position = iteration = epoch = 0
    for name, count in ops:
        if name == "next":
            assert stream.next() == position
            position, iteration = (position + 1) % size, iteration + 1
        elif name == "epoch":
            assert stream.increment_epoch()
            epoch += 1
        elif name == "reload":
            stream.reload_iterator()
            position = 0
        else:
            expected = [(position + k) % size for k in range(count)]
            assert list(stream.data(count)) == expected
            position, iteration = (position + count) % size, iteration + count
        assert (stream.iteration, stream.epoch) == (iteration, epoch)


def test_generic_subscription_works_at_runtime() -> None:
    stream = Stream[int](range(2))
    assert stream.next() == 0
    assert stream_module.__all__ == ["ManualStream", "Stream"]
