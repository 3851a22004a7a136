"""The flat-dict fast path of stacking agrees with the general one on every mismatch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import Data, SampleBatch, decode, encode
from feedmux.protocol._batch import stack_samples
from tests.protocol.trees import assert_same


def roundtrip(samples: list[Any]) -> Any:
    tags = np.stack([np.ones(len(samples)), np.arange(len(samples))], axis=1).astype(np.int64)
    message = decode(encode(Data(tags, samples)))
    assert isinstance(message, Data)
    return message.samples


def base(index: int) -> dict[str, Any]:
    return {"X": np.full(4, index, np.float32), "y": np.int64(index), "name": f"s{index}"}


MISMATCHES: dict[str, Any] = {
    "key order": {"y": np.int64(9), "X": np.zeros(4, np.float32), "name": "s9"},
    "missing key": {"X": np.zeros(4, np.float32), "y": np.int64(9)},
    "shape": {**base(9), "X": np.zeros(5, np.float32)},
    "array dtype": {**base(9), "X": np.zeros(4, np.float64)},
    "scalar type": {**base(9), "y": np.int32(9)},
    "scalar becomes array": {**base(9), "y": np.array(9)},
    "not a dict": [np.zeros(4, np.float32)],
    "array subclass": {**base(9), "X": np.ma.masked_array(np.zeros(4, np.float32))},
    "plain leaf becomes list": {**base(9), "name": ["s", "9"]},
}


@pytest.mark.parametrize("odd", list(MISMATCHES.values()), ids=list(MISMATCHES))
def test_a_mismatch_falls_back_and_round_trips(odd: Any) -> None:
    samples = [base(i) for i in range(5)] + [odd]
    if isinstance(odd, dict) and type(odd.get("X")) is np.ma.MaskedArray:
        with pytest.raises(ProtocolError, match="masked arrays are not supported"):
            roundtrip(samples)
        return
    assert stack_samples(samples) is None
    assert_same(list(roundtrip(samples)), samples)


def test_uniform_flat_dicts_stack_and_keep_types() -> None:
    samples = [base(i) for i in range(6)]
    samples[3]["name"] = 7  # plain leaves may change type: they travel as a list
    template = stack_samples(samples)
    assert template is not None and list(template) == ["X", "y", "name"]
    decoded = roundtrip(samples)
    assert isinstance(decoded, SampleBatch)
    assert_same(list(decoded), samples)
    assert type(decoded[2]["y"]) is np.int64


def test_structured_dtypes_that_are_equal_but_not_identical_stack() -> None:
    def dtype() -> np.dtype[Any]:
        return np.dtype([("a", "<i4"), ("b", "<f8")])

    samples = [{"r": np.zeros(2, dtype=dtype())} for _ in range(4)]
    assert stack_samples(samples) is not None
    assert_same(list(roundtrip(samples)), samples)
