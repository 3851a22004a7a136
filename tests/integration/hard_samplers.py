"""Sources for the hardening tests (imported by server processes as MODULE:ATTR)."""

from __future__ import annotations

import itertools
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import feedmux


def _second_item_raises() -> Iterator[dict[str, Any]]:
    yield {"id": np.int64(0)}
    raise ValueError("the second item always fails")


def first_pull_fails() -> feedmux.Streamer:
    """Split by items over 2 workers, shard 1's first pull of every epoch raises."""
    return feedmux.Streamer(_second_item_raises)


#: What the stuck streamer writes to stderr once the server runs it.
STUCK_LINE = "the stuck streamer is running"


def _stuck() -> Iterator[dict[str, Any]]:
    print(STUCK_LINE, file=sys.stderr, flush=True)
    while True:  # user code that never yields (and sleeps through every signal)
        time.sleep(3600)
    yield {}


def stuck() -> feedmux.Streamer:
    return feedmux.Streamer(_stuck)


def _spinning() -> Iterator[dict[str, Any]]:
    print(STUCK_LINE, file=sys.stderr, flush=True)
    while True:  # user code that never yields: a busy loop
        pass
    yield {}


def spinning() -> feedmux.Streamer:
    return feedmux.Streamer(_spinning)


def _draws(count: int) -> Iterator[dict[str, Any]]:
    for _ in range(count):
        yield {"np": np.float64(np.random.random()), "py": random.random()}


def draws(streams: int = 2, count: int = 10) -> feedmux.ChainMux:
    """Streams of draws from the global RNGs, one stream per worker.

    Seeded here, in the server process before it forks its workers, as a sampler
    module that seeds at import would be: every worker then starts from this state.
    """
    np.random.seed(0)
    random.seed(0)
    return feedmux.ChainMux([feedmux.Streamer(_draws, count) for _ in range(streams)],
                            mode="exhaustive")


def _reused(count: int, megabytes: int) -> Iterator[dict[str, Any]]:
    buffer = np.empty(megabytes * (1 << 20) // 8, dtype=np.int64)
    for i in range(count):
        buffer[:] = i
        yield {"id": np.int64(i), "x": buffer}


def reused(count: int = 300, megabytes: int = 4) -> feedmux.Streamer:
    """A streamer that writes every sample into the same array."""
    return feedmux.Streamer(_reused, count, megabytes)


#: What the GIL-bound streamer writes to stderr as its long sample starts.
LONG_SAMPLE_LINE = "the streamer's long sample starts"


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # pure Python: holds the GIL (but at each switch interval)
        pass


def _gil_bound(ms: float, long_at: int, long_s: float) -> Iterator[dict[str, Any]]:
    for i in itertools.count():
        if i == long_at:
            print(LONG_SAMPLE_LINE, file=sys.stderr, flush=True)
            _spin(long_s)
        else:
            _spin(ms / 1000)
        yield {"id": np.int64(i), "x": np.zeros(16, dtype=np.float32)}


def gil_bound(ms: float = 50.0, long_at: int = -1, long_s: float = 0.0) -> feedmux.Streamer:
    """Endless small samples, each ``ms`` ms of pure Python (the GIL held, as a decoder
    written in Python holds it), and sample ``long_at`` ``long_s`` seconds of it (a huge
    image), announced on stderr (:data:`LONG_SAMPLE_LINE`)."""
    return feedmux.Streamer(_gil_bound, float(ms), int(long_at), float(long_s))
