"""Golden bytes: fixed messages must encode to exactly these frames, and decode back.

A failure here means the wire format changed. That is only allowed together with
a new PROTOCOL_VERSION and an update of docs/protocol.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from feedmux.protocol import Data, EndOfEpoch, Hello, SampleBatch, decode, encode
from tests.protocol.trees import assert_same


def frames_of(*hex_frames: str) -> list[bytes]:
    return [bytes.fromhex(frame) for frame in hex_frames]


GOLDEN: list[tuple[str, Any, dict[str, Any], list[bytes]]] = [
    (
        "hello",
        Hello(client_id="trainer-0", role="trainer", world_size=2),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "trainer-0", "role": "trainer", "world_size": 2}
            "85 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a9 74 72 61 69 6e 65 72 2d 30"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 02",
        ),
    ),
    (
        "end-of-epoch",
        EndOfEpoch(epoch=3, count=1000, worker=1),
        {},
        frames_of(
            "85 a1 76 01 a1 6b 08 a5 65 70 6f 63 68 03 a5 63 6f 75 6e 74 cd 03 e8"
            " a6 77 6f 72 6b 65 72 01",
        ),
    ),
    (
        "data-inline-array",
        Data(
            np.array([[1, 0]]),
            [{"x": np.array([1.5, -2.0], dtype="<f4"), "label": 3, "name": "cat"}],
            server_id="s1",
            seq=7,
        ),
        {},
        frames_of(
            # header: ... "samples": [{"x": ext 1 (fixext16), "label": 3, "name": "cat"}]
            # ext 1 payload: 07 = descriptor length, 92 a3 "<f4" 91 02 = ["<f4", [2]], 8 raw bytes
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 a3 73 65 71 07"
            " a1 6e 01 a7 73 61 6d 70 6c 65 73 91 83 a1 78 d8 01 07 92 a3 3c 66 34 91 02"
            " 00 00 c0 3f 00 00 00 c0 a5 6c 61 62 65 6c 03 a4 6e 61 6d 65 a3 63 61 74",
            # tags: one row (epoch 1, position 0) of little-endian int64
            "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
        ),
    ),
    (
        "data-frame-array",
        Data(np.array([[2, 5]]), [np.arange(3, dtype=">i2")], server_id="s1", seq=8),
        {"inline_threshold": 0},
        frames_of(
            # "samples": [ext 2 (fixext4): [">i2", [3], 2]] -- the array is in frame 2
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 a3 73 65 71 08"
            " a1 6e 01 a7 73 61 6d 70 6c 65 73 91 d7 02 93 a3 3e 69 32 91 03 02",
            "02 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00",
            "00 00 00 01 00 02",
        ),
    ),
    (
        "data-stacked-batch",
        Data(
            np.array([[1, 0], [1, 1]]),
            [
                {"x": np.array([1, 2], dtype="<u1"), "y": np.float32(0.5), "s": "a"},
                {"x": np.array([3, 4], dtype="<u1"), "y": np.float32(1.5), "s": "b"},
            ],
        ),
        {},
        frames_of(
            # "batch": {"x": ext 5 [inline (2, 2) u1], "y": ext 6 [inline (2,) <f4],
            #           "s": ext 7 ["a", "b"]}
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a0 a3 73 65 71 00 a1 6e 02"
            " a5 62 61 74 63 68 83 a1 78 d8 05 c7 0d 01 08 92 a3 7c 75 31 92 02 02 01 02 03"
            " 04 a1 79 c7 12 06 d8 01 07 92 a3 3c 66 34 91 02 00 00 00 3f 00 00 c0 3f a1 73"
            " c7 05 07 92 a1 61 a1 62",
            "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
            " 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00",
        ),
    ),
    (
        "data-tuple-and-scalars",
        Data(np.array([[1, 0]]), [(np.int64(-1), np.datetime64("2024-01-01", "D"))]),
        {},
        frames_of(
            # a tuple is an array whose first item is ext 4 (empty); then two ext 3 scalars
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a0 a3 73 65 71 00 a1 6e 01"
            " a7 73 61 6d 70 6c 65 73 91 93 c7 00 04 c7 0d 03 04 a3 3c 69 38 ff ff ff ff ff"
            " ff ff ff d8 03 07 a6 3c 4d 38 5b 44 5d 0b 4d 00 00 00 00 00 00",
            "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
        ),
    ),
]


@pytest.mark.parametrize(
    ("name", "message", "options", "golden"), GOLDEN, ids=[g[0] for g in GOLDEN]
)
def test_encode_matches_golden_bytes(
    name: str, message: Any, options: dict[str, Any], golden: list[bytes]
) -> None:
    assert [bytes(frame) for frame in encode(message, **options)] == golden


@pytest.mark.parametrize(
    ("name", "message", "options", "golden"), GOLDEN, ids=[g[0] for g in GOLDEN]
)
def test_golden_bytes_decode_to_the_message(
    name: str, message: Any, options: dict[str, Any], golden: list[bytes]
) -> None:
    decoded = decode(golden)
    assert type(decoded) is type(message)
    if not isinstance(message, Data):
        assert decoded == message
        return
    assert isinstance(decoded, Data)
    assert decoded.tags.tolist() == np.asarray(message.tags).tolist()
    assert (decoded.server_id, decoded.seq) == (message.server_id, message.seq)
    assert len(decoded.samples) == len(message.samples)
    if name == "data-stacked-batch":
        assert isinstance(decoded.samples, SampleBatch)
    for expected, actual in zip(message.samples, decoded.samples, strict=True):
        assert_same(expected, actual)
