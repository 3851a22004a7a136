"""Argument checks of the muxes and of ``shard``: what is accepted, and the error otherwise.

This module owns the validation of pescador-style arguments (streamer lists,
weights, modes, ``n_active``, ``rate``, shard indexes): each check returns the
value in the form the muxes use, or raises :class:`~feedmux.errors.SamplingError`
with a message that names the argument, what was expected and what came. It
only checks: it must never start a streamer or draw a random number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from feedmux.errors import SamplingError
from feedmux.sampling.streamer import Streamer, is_integer, is_real

__all__ = [
    "check_choice",
    "check_positive_int",
    "check_rate",
    "check_shard",
    "check_streamers",
    "check_weights",
]


def check_choice(value: object, argument: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    if isinstance(value, str) and value in choices:
        return value
    allowed = ", ".join(repr(choice) for choice in choices)
    raise SamplingError(f"{argument} must be one of {allowed}, got {argument}={value!r}")


def _as_streamer(item: object, argument: str) -> Streamer[Any]:
    if isinstance(item, Streamer):
        return item
    try:
        return Streamer(item)
    except SamplingError as error:
        raise SamplingError(f"invalid element of {argument}: {error}") from None


def check_streamers(
    streamers: object, argument: str = "streamers", *, allow_empty: bool = False
) -> list[Streamer[Any]]:
    """Wrap each element of ``streamers`` in a Streamer; refuse a one-shot iterator."""
    if isinstance(streamers, Iterator):
        raise SamplingError(
            f"{argument} must be a list of streamers or re-iterables, got "
            f"{argument}={streamers!r}, which is a one-shot iterator; pass a list (ChainMux "
            "also takes the function that yields the streamers, called at each activation)"
        )
    if not isinstance(streamers, Iterable):
        raise SamplingError(
            f"{argument} must be a list of streamers or re-iterables, got "
            f"{argument}={streamers!r}, which is not iterable"
        )
    checked = [_as_streamer(item, argument) for item in streamers]
    if not checked and not allow_empty:
        raise SamplingError(f"{argument} must not be empty, got {argument}={streamers!r}")
    return checked


def check_weights(weights: object, n_streams: int) -> np.ndarray:
    """Return the weights normalized to sum 1 (uniform when None)."""
    if weights is None:
        return np.full(n_streams, 1.0 / n_streams)
    try:
        array = np.atleast_1d(np.asarray(weights, dtype=np.float64))
    except (TypeError, ValueError):
        raise SamplingError(
            f"weights must be a sequence of {n_streams} numbers >= 0, got weights={weights!r}"
        ) from None
    if array.ndim != 1 or len(array) != n_streams:
        raise SamplingError(
            f"weights must have one weight per streamer ({n_streams}), got "
            f"{array.size} in weights={weights!r}"
        )
    if not np.isfinite(array).all():
        raise SamplingError(f"weights must be finite, got weights={weights!r}")
    if (array < 0).any():
        index = int(np.flatnonzero(array < 0)[0])
        raise SamplingError(
            f"weights must be >= 0, got weights[{index}]={float(array[index])!r} in "
            f"weights={weights!r}"
        )
    if not (array > 0).any():
        raise SamplingError(
            f"weights must contain at least one positive value, got weights={weights!r}"
        )
    normalized: np.ndarray = array / array.sum()
    return normalized


def check_positive_int(value: object, argument: str) -> int:
    """Return ``value`` as an int if it is an integer >= 1."""
    if is_integer(value) and int(value) >= 1:
        return int(value)
    raise SamplingError(f"{argument} must be an int >= 1, got {argument}={value!r}")


def check_rate(rate: object) -> float | None:
    """Return ``rate`` as a float, or None for no cap."""
    if rate is None:
        return None
    if is_real(rate):
        value = float(rate)
        if value > 0 and math.isfinite(value):
            return value
    raise SamplingError(f"rate must be None or a finite number > 0, got rate={rate!r}")


def check_shard(index: object, count: object) -> None:
    """Refuse a worker ``index`` outside ``[0, count)`` or a ``count`` below 1."""
    if not (is_integer(count) and int(count) >= 1):
        raise SamplingError(f"count must be an int >= 1, got count={count!r}")
    if not (is_integer(index)):
        raise SamplingError(f"index must be an int, got index={index!r}")
    if not 0 <= int(index) < int(count):
        raise SamplingError(f"index must be in [0, {count}), got index={index!r}")
