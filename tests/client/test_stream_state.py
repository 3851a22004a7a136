"""state_dict() / load_state_dict(): plain data, nested loader state, loud failures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from feedmux.client import ManualStream, Stream
from feedmux.errors import StreamError, StreamTypeError, StreamValueError


class ResumableRange:
    """A loader with its own state, resuming mid-pass like torchdata's StatefulDataLoader.

    ``state_dict()`` records how far the current pass has gone; after
    ``load_state_dict()`` the next ``iter()`` starts from there.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.position = 0
        self._resume_at = 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        start, self._resume_at = self._resume_at, 0
        self.position = start
        return self._run(start)

    def _run(self, start: int) -> Iterator[int]:
        for value in range(start, self.size):
            self.position = value + 1
            yield value

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["size"] != self.size:
            raise ValueError(f"expected a state for size {self.size}, got {state['size']}")
        self._resume_at = self.position = state["position"]


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(state))
    return loaded


def test_state_of_a_fresh_stream() -> None:
    assert Stream(range(3)).state_dict() == {"class": "Stream", "epoch": 0, "iteration": 0}
    assert ManualStream(range(3)).state_dict() == {
        "class": "ManualStream",
        "epoch": 0,
        "iteration": 0,
        "mstep": 0,
    }


def test_state_is_json_plain_data_and_round_trips() -> None:
    stream = ManualStream(range(4))
    stream.increment_epoch()
    list(stream.data(n_iterations=6))
    stream.increment_mstep()
    state = stream.state_dict()
    assert (
        roundtrip(state)
        == state
        == {
            "class": "ManualStream",
            "epoch": 1,
            "iteration": 6,
            "mstep": 1,
        }
    )
    restored = ManualStream(range(4))
    restored.load_state_dict(roundtrip(state))
    assert restored.state_dict() == state


def test_state_dict_is_a_snapshot() -> None:
    stream = Stream(range(3))
    state = stream.state_dict()
    stream.next()
    assert state["iteration"] == 0


def test_restore_continues_counting_and_starts_a_fresh_pass_for_a_plain_loader() -> None:
    stream = Stream(range(10))
    stream.increment_epoch()
    assert list(stream.data(3)) == [0, 1, 2]
    restored = Stream(range(10))
    restored.load_state_dict(stream.state_dict())
    assert restored.next() == 0
    assert (restored.epoch, restored.iteration) == (1, 4)
    # the restore also drops an iterator already running
    stream.load_state_dict({"class": "Stream", "epoch": 1, "iteration": 3})
    assert stream.next() == 0


def test_loader_state_is_nested_under_a_constant_key() -> None:
    loader = ResumableRange(5)
    stream = Stream(loader)
    stream.increment_epoch()
    assert [stream.next(), stream.next()] == [0, 1]
    assert stream.state_dict() == {
        "class": "Stream",
        "epoch": 1,
        "iteration": 2,
        "loader": {"position": 2, "size": 5},
    }


def test_save_and_restore_mid_epoch_resumes_exactly() -> None:
    """An interrupted run, restored from JSON, yields what the uninterrupted run yields."""

    def run(stream: Stream[int], max_epoch: int, stop_after: int | None = None) -> list[int]:
        out: list[int] = []
        # The partial epoch of a restored stream: finish it first.
        loader = stream.loader
        assert isinstance(loader, ResumableRange)
        if 0 < loader.position < loader.size:
            out.extend(stream.data(loader.size - loader.position))
        while stream.increment_epoch(max_epoch):
            for x in stream.data():
                out.append(x)
                if stop_after is not None and stream.iteration == stop_after:
                    return out
        return out

    reference = run(Stream(ResumableRange(5)), 3)
    assert reference == [0, 1, 2, 3, 4] * 3

    first = Stream(ResumableRange(5))
    before = run(first, 3, stop_after=7)  # two items into epoch 2
    saved = json.dumps(first.state_dict())
    assert json.loads(saved)["loader"] == {"position": 2, "size": 5}

    second = Stream(ResumableRange(5))
    second.load_state_dict(json.loads(saved))
    assert (second.epoch, second.iteration) == (2, 7)
    after = run(second, 3)
    assert before + after == reference
    assert (second.epoch, second.iteration) == (3, 15)


def test_manual_stream_save_and_restore_mid_step() -> None:
    stream = ManualStream(ResumableRange(4))
    data = stream.data(n_msteps=2)
    assert [next(data), next(data), next(data)] == [0, 1, 2]
    stream.increment_mstep()
    state = roundtrip(stream.state_dict())
    restored = ManualStream(ResumableRange(4))
    restored.load_state_dict(state)
    assert (restored.mstep, restored.iteration) == (1, 3)
    assert list(restored.data(n_iterations=3)) == [3, 0, 1]


def test_restore_calls_the_loader_and_its_errors_propagate_unchanged() -> None:
    stream = Stream(ResumableRange(5))
    state = {"class": "Stream", "epoch": 2, "iteration": 9, "loader": {"position": 1, "size": 6}}
    with pytest.raises(ValueError, match="size 5"):
        stream.load_state_dict(state)
    assert (stream.epoch, stream.iteration) == (0, 0)  # nothing changed


def test_state_from_another_class_is_refused() -> None:
    manual_state = ManualStream(range(3)).state_dict()
    with pytest.raises(StreamValueError, match="expected the state of a Stream, got the state of"):
        Stream(range(3)).load_state_dict(manual_state)

    with pytest.raises(StreamValueError) as info:
        ManualStream(range(3)).load_state_dict(Stream(range(3)).state_dict())
    message = str(info.value)
    assert "expected the state of a ManualStream" in message
    assert "'mstep'" in message


@pytest.mark.parametrize("key", ["class", "epoch", "iteration"])
def test_missing_key_is_named(key: str) -> None:
    state = Stream(range(3)).state_dict()
    del state[key]
    with pytest.raises(StreamValueError, match=f"missing key '{key}'") as info:
        Stream(range(3)).load_state_dict(state)
    assert isinstance(info.value, StreamError)


def test_several_missing_keys_are_all_named() -> None:
    with pytest.raises(
        StreamValueError, match="missing keys 'class', 'epoch', 'iteration', 'mstep'"
    ):
        ManualStream(range(3)).load_state_dict({})


def test_missing_loader_state_is_named_when_the_loader_needs_it() -> None:
    stream = Stream(ResumableRange(3))
    with pytest.raises(StreamValueError, match="missing key 'loader'"):
        stream.load_state_dict({"class": "Stream", "epoch": 0, "iteration": 0})


def test_loader_state_for_a_loader_without_state_is_refused() -> None:
    state = Stream(ResumableRange(3)).state_dict()
    with pytest.raises(StreamValueError, match=r"loader \(range\) has no state_dict"):
        Stream(range(3)).load_state_dict(state)


def test_unknown_keys_are_refused() -> None:
    state = {"class": "Stream", "epoch": 0, "iteration": 0, "position": 3}
    with pytest.raises(StreamValueError, match="unknown keys"):
        Stream(range(3)).load_state_dict(state)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("3", StreamTypeError),
        (3.0, StreamTypeError),
        (True, StreamTypeError),
        (-1, StreamValueError),
    ],
    ids=repr,
)
def test_bad_counter_values_are_refused_and_nothing_changes(
    value: object, error: type[StreamError]
) -> None:
    stream = Stream(range(3))
    stream.next()
    with pytest.raises(error, match="'iteration'"):
        stream.load_state_dict({"class": "Stream", "epoch": 5, "iteration": value})
    assert (stream.epoch, stream.iteration) == (0, 1)
    assert stream.next() == 1  # the iterator was not reset either


def test_a_non_mapping_state_is_a_type_error() -> None:
    with pytest.raises(StreamTypeError, match="expected a mapping"):
        Stream(range(3)).load_state_dict([("epoch", 1)])  # type: ignore[arg-type]


def test_data_iterators_made_before_a_restore_keep_their_start() -> None:
    stream = Stream(range(10))
    data = stream.data(3)
    assert next(data) == 0
    stream.load_state_dict({"class": "Stream", "epoch": 0, "iteration": 100})
    assert list(data) == []  # 100 iterations since `data` started
