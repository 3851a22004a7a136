"""Compressed data messages (kind 15): golden bytes, round trips and the decode limits."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    Codec,
    Data,
    Kind,
    Limits,
    compress_frames,
    decode,
    encode,
    inflate_frames,
    packed,
    read_tags,
    replace_tags,
)
from feedmux.protocol import parse_compress as parse

#: Two samples of 1024 float32 (zeros, ones), lz4: the samples are inline in the header
#: (8246 bytes, compressed), the tags frame (32 bytes) is stored.
GOLDEN = [bytes.fromhex(frame) for frame in (
    # {"v": 1, "k": 15, "c": [1, 0], "n": [8246, 32]}
    "84 a1 76 01 a1 6b 0f a1 63 92 01 00 a1 6e 92 cd 20 36 20",
    "ff 27 86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a0 a3 73 65 71 00 a1 6e 02 a5"
    " 62 61 74 63 68 81 a1 78 c8 20 0f 05 c8 20 0b 01 0a 92 a3 3c 66 34 92 02 cd 04 00 01 00"
    " ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff fe 2f 80 3f 04 00 ff ff ff ff ff ff ff ff"
    " ff ff ff ff ff ff ff f3 50 3f 00 00 80 3f",
    "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 01 00 00 00 00"
    " 00 00 00",
)]


def golden_message() -> Data:
    return Data(np.array([[1, 0], [1, 1]]),
                [{"x": np.zeros(1024, np.float32)}, {"x": np.ones(1024, np.float32)}])


def test_the_compressed_header_matches_its_golden_bytes() -> None:
    wire = compress_frames(encode(golden_message()), Codec("lz4"))
    assert bytes(wire[0]) == GOLDEN[0]
    assert bytes(wire[2]) == GOLDEN[2]  # stored: under the smallest frame worth compressing
    assert msgpack.unpackb(GOLDEN[0])["k"] == int(Kind.COMPRESSED) == 15


def test_golden_bytes_decode_to_the_message() -> None:
    decoded = decode([bytearray(frame) for frame in GOLDEN])
    assert isinstance(decoded, Data)
    assert decoded.tags.tolist() == [[1, 0], [1, 1]]
    assert [float(sample["x"].sum()) for sample in decoded.samples] == [0.0, 1024.0]


@pytest.mark.parametrize("codec", [Codec("lz4"), Codec("zstd", 1), Codec("zstd", -3)],
                         ids=lambda codec: codec.label)
def test_a_message_with_array_frames_round_trips_and_its_arrays_are_writable(
        codec: Codec) -> None:
    image = np.tile(np.arange(256, dtype=np.uint8), (64, 64))  # compressible, 1 MiB
    noise = np.random.default_rng(0).random(1 << 16)  # incompressible: stored
    frames = encode(Data(np.array([[2, 5]]), [{"image": image, "noise": noise, "y": 3}]),
                    inline_threshold=1024)
    wire = compress_frames(frames, codec)
    assert sum(map(len, wire)) < sum(len(memoryview(frame).cast("B")) for frame in frames) / 2
    decoded = decode(wire)
    assert isinstance(decoded, Data)
    sample = decoded.samples[0]
    assert np.array_equal(sample["image"], image) and np.array_equal(sample["noise"], noise)
    assert sample["y"] == 3 and decoded.tags.tolist() == [[2, 5]]
    sample["image"][0, 0] = 7  # writable: a view of the inflated buffer
    assert sample["image"].flags.writeable


def header(codecs: list[int], sizes: list[int]) -> bytes:
    return msgpack.packb({"v": 1, "k": 15, "c": codecs, "n": sizes})


def test_a_decompression_bomb_is_refused_before_it_is_inflated() -> None:
    zeros = bytes(64 << 20)  # 64 MiB of zeros: a few KiB compressed
    bomb = compress_frames([*encode(Data(np.array([[1, 0]]), [{"y": 0}]))[:2], zeros],
                           Codec("zstd", 3))
    assert sum(map(len, bomb)) < 64 << 10
    with pytest.raises(ProtocolError, match=r"inflate to 67108.* bytes, limit is 16777216: "
                                            r"refused before inflating"):
        decode(bomb, limits=Limits(max_message_bytes=16 << 20))
    # Sizes that lie: declared far beyond what any limit allows, nothing is allocated.
    with pytest.raises(ProtocolError, match="refused before inflating"):
        decode([header([2], [1 << 60]), bomb[3]])


def test_a_frame_that_inflates_past_or_short_of_its_declared_size_is_refused() -> None:
    data = bytes(range(256)) * 64
    packed = Codec("lz4").squeeze(data)
    for declared in (len(data) - 1, len(data) + 1):
        with pytest.raises(ProtocolError, match="compressed frame 0"):
            decode([header([1], [declared]), packed])
    zpacked = Codec("zstd", 1).squeeze(data)
    with pytest.raises(ProtocolError, match="compressed frame 0"):
        decode([header([2], [len(data) // 2]), zpacked])


@pytest.mark.parametrize(("frames", "expected"), [
    ([header([0], [3]), b"abcd"], "stored frame 0 has 4 bytes, its size says 3"),
    ([header([9], [4]), b"abcd"], "unknown codec 9 of frame 0"),
    ([header([0, 0], [4]), b"abcd"], "expected 1 values under 'c'"),
    ([header([0], [-1]), b"abcd"], "non-negative ints under 'n'"),
    ([header([], [])], "compressed message of 0 frames"),
    ([header([1], [4]), b"\xff\xff\xff"], "compressed frame 0 does not inflate"),
])
def test_malformed_compressed_messages_say_what_was_expected(
        frames: list[bytes], expected: str) -> None:
    with pytest.raises(ProtocolError, match=expected):
        decode(frames)


def test_a_compressed_message_inside_a_compressed_message_is_refused() -> None:
    inner = compress_frames(encode(golden_message()), Codec("lz4"))
    outer = [header([0] * len(inner), [len(frame) for frame in inner]), *inner]
    with pytest.raises(ProtocolError, match="inside a compressed message"):
        decode(outer)


def test_the_compress_option_is_parsed_or_refused_with_what_was_expected() -> None:
    assert parse("auto") == "auto" and parse("off") is None
    assert parse("lz4") == Codec("lz4") and parse("zstd") == Codec("zstd", 1)
    assert parse("zstd:-5") == Codec("zstd", -5)
    for wrong in ("gzip", "zstd:99", "zstd:x", "lz4:3", ""):
        with pytest.raises(ValueError, match=f"expected auto, off, lz4, zstd or zstd:LEVEL.*"
                                             f"got {wrong!r}"):
            parse(wrong)


def test_a_relay_reads_and_rewrites_the_tags_of_a_compressed_message_without_inflating() -> None:
    # 300 samples: a tags frame of 4800 bytes, over the smallest frame worth compressing,
    # stored all the same; the stacked samples are compressed.
    samples = [{"x": np.full(64, index, np.float32)} for index in range(300)]
    tags = np.array([[3, index] for index in range(300)])
    wire = compress_frames(encode(Data(tags, samples)), Codec("lz4"), seq=41)
    header = packed(wire)
    assert header is not None and header["s"] == 41 and header["c"][1:] == [0, 1]
    assert read_tags(wire).tolist() == tags.tolist()
    renumbered = replace_tags(wire, tags + np.array([0, 1000]))
    assert packed(renumbered) == header  # the same sizes: the compressed header holds
    decoded = decode(renumbered)
    assert isinstance(decoded, Data)
    assert decoded.tags[:, 1].tolist() == list(range(1000, 1300))
    assert [float(sample["x"][0]) for sample in decoded.samples] == list(range(300))
    assert decode(inflate_frames(wire)).tags.tolist() == tags.tolist()


def test_packed_says_none_of_a_message_that_is_not_compressed() -> None:
    frames = encode(golden_message())
    assert packed(frames) is None
    with pytest.raises(ProtocolError, match="not a compressed message"):
        inflate_frames(frames)
