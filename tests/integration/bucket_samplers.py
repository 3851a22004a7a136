"""Samplers of variable-length samples for the coordinated-steps tests (``module:attr``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

import feedmux


def length_of(sample_id: int) -> int:
    """The length of sample ``sample_id``: long-tailed (lognormal), fixed per id."""
    return 1 + int(np.random.default_rng(sample_id).lognormal(2.5, 0.8))


def ragged(streams: int = 4, per_stream: int = 75, seed: int = 0) -> feedmux.StochasticMux:
    """An exhaustive mux of samples ``{"id", "tokens"}``, ``tokens`` an int32 array of
    ``length_of(id)`` copies of the id, every id 0 .. streams*per_stream-1 once per pass."""
    return feedmux.StochasticMux(
        [feedmux.Streamer(_ragged, s * per_stream, per_stream) for s in range(streams)],
        2, rate=None, mode="exhaustive", random_state=seed,
    )


def _ragged(start: int, count: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + count):
        yield {"id": np.int64(i), "tokens": np.full(length_of(i), i, dtype=np.int32)}
