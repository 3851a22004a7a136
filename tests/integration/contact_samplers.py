"""Sources for the first-contact tests (imported by server processes as MODULE:ATTR)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import feedmux


def killed_after(seconds: float = 2.0) -> feedmux.Streamer:
    """A factory that works a while, then its process dies without a word (SIGKILL)."""
    time.sleep(seconds)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def exits_after(seconds: float = 2.0) -> feedmux.Streamer:
    """A factory that works a while, then raises SystemExit (not an Exception)."""
    time.sleep(seconds)
    raise SystemExit("the factory gave up")


def _blocks(count: int, kib: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"id": np.int64(i), "x": np.full(kib * 128, i, dtype=np.int64)}


def blocks(count: int = 1000, kib: int = 512) -> feedmux.Streamer:
    """``count`` samples of ``kib`` KiB each: large enough to go through the shared pool."""
    return feedmux.Streamer(_blocks, count, kib)
