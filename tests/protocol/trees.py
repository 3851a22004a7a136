"""Exact comparison of sample trees for the protocol tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def assert_same(expected: Any, actual: Any, path: str = "sample") -> None:
    """Assert ``actual`` is ``expected`` after a round trip: same types, dtypes, values.

    Containers must match exactly (a tuple stays a tuple, dict keys keep their
    order); numpy arrays must have the same dtype, shape and bytes; numpy
    scalars the same type and bytes; floats may both be NaN.
    """
    if isinstance(expected, np.ndarray):
        assert type(actual) is np.ndarray, f"{path}: {type(actual)} is not an ndarray"
        assert actual.dtype == expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        # Bytes in C order: exact for every dtype (NaN payloads, -0.0, NaT, padding aside).
        assert _values(actual) == _values(expected), f"{path}: values differ"
        return
    if isinstance(expected, np.generic):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert actual.dtype == expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert _values(np.asarray(actual)) == _values(np.asarray(expected)), f"{path}: differ"
        return
    if type(expected) is bytearray:
        assert actual == bytes(expected), f"{path}: {actual!r} != {expected!r}"
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            assert_same(want, got, f"{path}[{index}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), f"{path}: {actual} is not NaN"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def _values(array: np.ndarray) -> list[Any]:
    """Compare arrays field by field so padding bytes of structured dtypes do not count."""
    if array.dtype.names is not None:
        return [_values(np.ascontiguousarray(array[name])) for name in array.dtype.names]
    if array.dtype.subdtype is not None:
        return _values(np.ascontiguousarray(array))
    return [np.ascontiguousarray(array).tobytes(), array.shape]
