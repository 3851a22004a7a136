"""Sources that go wrong, for the tests of how a server reports and skips errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

import feedmux


class Picture:
    """Stands for a PIL image: an object the codec refuses."""


def _records(path: str, count: int, bad_at: int | None, kind: str) -> Iterator[Any]:
    for i in range(count):
        if i == bad_at:
            if kind == "raise":
                raise OSError(f"cannot read record {i} of {path}")
            if kind == "object":
                yield {"id": np.int64(-1), "x": np.array([1, "a"], dtype=object)}
                continue
            yield {"id": np.int64(-1), "x": Picture()}
            continue
        yield {"id": np.int64(i), "x": np.full(3, i, dtype=np.float32)}


def files(count: int = 20, bad_at: int | None = 5, kind: str = "raise",
          files: int = 1) -> feedmux.StochasticMux:
    """An exhaustive mux of one "file" per streamer; the first has a bad record at
    ``bad_at`` (``kind``: raise an OSError, or yield a ``Picture`` / an object array)."""
    streams = [feedmux.Streamer(_records, f"/data/shard-{n}.rec", count,
                                bad_at if n == 0 else None, kind) for n in range(files)]
    return feedmux.StochasticMux(streams, 2, rate=None, mode="exhaustive", random_state=0)


def _always_failing(path: str) -> Iterator[Any]:
    raise OSError(f"cannot open {path}")
    yield  # a generator


def all_failing(files: int = 4) -> feedmux.StochasticMux:
    """An exhaustive mux whose every streamer raises at its first pull."""
    streams = [feedmux.Streamer(_always_failing, f"/data/missing-{n}.rec") for n in range(files)]
    return feedmux.StochasticMux(streams, 2, rate=None, mode="exhaustive", random_state=0)


def lengths(count: int = 64) -> feedmux.Streamer:
    """Variable-length sequences: samples that do not stack into one batch."""
    return feedmux.Streamer(_sequences, count)


def _sequences(count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"id": np.int64(i), "tokens": np.arange(1 + i % 7, dtype=np.int64)}


def fixed(count: int = 64) -> feedmux.Streamer:
    """Samples that stack."""
    return feedmux.Streamer(_fixed, count)


def _fixed(count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"id": np.int64(i), "x": np.zeros(4, dtype=np.float32)}


def one_odd(count: int = 64, odd_at: int = 13) -> feedmux.Streamer:
    """Samples that stack but for one (at position ``odd_at``), whose array is longer."""
    return feedmux.Streamer(_one_odd, count, odd_at)


def _one_odd(count: int, odd_at: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"id": np.int64(i), "x": np.zeros(5 if i == odd_at else 4, dtype=np.float32)}
