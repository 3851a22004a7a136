"""Sources the integration tests serve (imported by server processes as MODULE:ATTR)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import feedmux


def _numbered(start: int, count: int, width: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + count):
        yield {"id": np.int64(i), "x": np.full(width, i, dtype=np.float32)}


def numbered(streams: int = 4, per_stream: int = 50, width: int = 4, seed: int = 0,
             n_active: int = 2, delay: float = 0.0) -> feedmux.StochasticMux:
    """An exhaustive mux whose samples carry unique ids 0 .. streams*per_stream-1."""
    source = _slow_numbered if delay else _numbered
    args: tuple[Any, ...] = (width, delay) if delay else (width,)
    return feedmux.StochasticMux(
        [feedmux.Streamer(source, s * per_stream, per_stream, *args) for s in range(streams)],
        n_active, rate=None, mode="exhaustive", random_state=seed,
    )


def _slow_numbered(start: int, count: int, width: int, delay: float) -> Iterator[dict[str, Any]]:
    for sample in _numbered(start, count, width):
        time.sleep(delay)
        yield sample


def _augmented(start: int, count: int) -> Iterator[dict[str, Any]]:
    info = feedmux.worker_info()
    assert info is not None, "worker_info() is None in a sampling process"
    for i in range(start, start + count):
        # Random augmentations drawn from the global RNGs, as user code does.
        yield {"id": np.int64(i), "noise": np.random.random(), "py": random.random(),
               "worker": np.int64(info.id), "epoch": np.int64(info.epoch),
               "seed": str(info.seed)}


def augmented(streams: int = 4, per_stream: int = 30,
              seed: int | None = 0) -> feedmux.StochasticMux:
    """An exhaustive mux whose samples carry np.random / random draws and worker_info()."""
    return feedmux.StochasticMux(
        [feedmux.Streamer(_augmented, s * per_stream, per_stream) for s in range(streams)],
        2, rate=None, mode="exhaustive", random_state=seed,
    )


def _failing(after: int) -> Iterator[dict[str, Any]]:
    for i in range(after):
        yield {"id": np.int64(i)}
    raise ValueError(f"boom after {after} samples")


def failing(after: int = 10) -> feedmux.Streamer:
    """A streamer that raises ValueError after ``after`` samples."""
    return feedmux.Streamer(_failing, after)


def _big(megabytes: int) -> Iterator[dict[str, Any]]:
    block = np.ones(megabytes * (1 << 20) // 4, dtype=np.float32)
    i = 0
    while True:
        yield {"id": np.int64(i), "x": block}
        i += 1


def big(megabytes: int = 1) -> feedmux.Streamer:
    """Endless samples of ``megabytes`` MiB each."""
    return feedmux.Streamer(_big, megabytes)


not_a_streamer = 42


def partly_failing(after: int = 5, good: int = 20) -> feedmux.StochasticMux:
    """An exhaustive mux of a stream that fails after ``after`` items and a good one."""
    def good_items() -> Iterator[dict[str, Any]]:
        for i in range(100, 100 + good):
            yield {"id": np.int64(i)}

    return feedmux.StochasticMux([feedmux.Streamer(_failing, after), feedmux.Streamer(good_items)],
                                 2, rate=None, mode="exhaustive", random_state=1)


def _large(count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"id": np.int64(i), "x": np.full(1 << 18, i, dtype=np.float32)}  # 1 MiB


def large(count: int = 40) -> feedmux.Streamer:
    """1 MiB samples whose every value is their id: the shared-memory path."""
    return feedmux.Streamer(_large, count)


def _shaped(start: int, count: int) -> Iterator[tuple[Any, ...]]:
    for i in range(start, start + count):
        # A tuple holding a dict (arrays of two ranks, a numpy scalar, a plain float and a
        # string) and a list (a plain int, a 0-d array): every kind of leaf a batch stacks.
        yield ({"image": np.full((2, 3), i, dtype=np.uint8), "id": np.int64(i),
                "weight": i / 4, "name": f"s{i}"}, [i, np.array(float(i))])


def shaped(streams: int = 3, per_stream: int = 20, seed: int = 0) -> feedmux.StochasticMux:
    """An exhaustive mux of nested samples (see ``_shaped``) with ids 0 .. streams*per_stream-1."""
    return feedmux.StochasticMux(
        [feedmux.Streamer(_shaped, s * per_stream, per_stream) for s in range(streams)],
        2, rate=None, mode="exhaustive", random_state=seed,
    )


def photo(index: int, height: int = 64, width: int = 96) -> np.ndarray:
    """Sample ``index``'s RGB uint8 image: a smooth gradient with a little noise (what the
    delta filter of ``--compress zstd:1+delta`` is for), the same every time it is made."""
    ramp = np.indices((height, width, 3)).sum(axis=0) * 2 + index
    noise = np.random.default_rng(index).integers(0, 6, ramp.shape)
    return (ramp + noise).astype(np.uint8)


def _photos(start: int, count: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + count):
        yield {"id": np.int64(i), "image": photo(i)}


def photos(streams: int = 4, per_stream: int = 16, seed: int = 0) -> feedmux.StochasticMux:
    """An exhaustive mux of :func:`photo` images with ids 0 .. streams*per_stream-1."""
    return feedmux.StochasticMux(
        [feedmux.Streamer(_photos, s * per_stream, per_stream) for s in range(streams)],
        2, rate=None, mode="exhaustive", random_state=seed,
    )
