"""Compressed data messages (kind 15): golden bytes, round trips and the decode limits."""

from __future__ import annotations

import re

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

#: One sample of a 32x64 RGB uint8 gradient (6144 bytes, in its own frame), zstd:1 after
#: the delta filter of one pixel (3 bytes) then one row (192 bytes): codec 3 and ``f``.
FILTERED_GOLDEN = [bytes.fromhex(frame) for frame in (
    # {"v": 1, "k": 15, "c": [0, 0, 3], "n": [55, 16, 6144], "f": [[], [], [3, 192]]}
    "85 a1 76 01 a1 6b 0f a1 63 93 00 00 03 a1 6e 93 37 10 cd 18 00 a1 66 93 90 90 92 03 cc"
    " c0",
    "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a0 a3 73 65 71 00 a1 6e 01 a7 73 61"
    " 6d 70 6c 65 73 91 81 a5 69 6d 61 67 65 c7 0a 02 93 a3 7c 75 31 93 20 40 03 02",
    "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
    "28 b5 2f fd 60 00 17 95 00 00 40 00 01 02 01 c3 c2 c1 00 02 00 39 07 7a 92 a3 00 11",
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
    assert parse("zstd+delta") == Codec("zstd", 1, delta=True)
    assert parse("zstd:-2+delta") == Codec("zstd", -2, delta=True)
    for codec in (Codec("lz4"), Codec("zstd", 7), Codec("zstd", 7, delta=True)):
        assert parse(codec.label) == codec
    for wrong in ("gzip", "zstd:99", "zstd:x", "lz4:3", "", "lz4+delta", "zstd+delta:3",
                  "zstd:1+delta+delta", "auto+delta"):
        with pytest.raises(ValueError, match=f"expected auto, off, lz4, zstd or zstd:LEVEL.*"
                                             f"got {re.escape(repr(wrong))}"):
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


def gradient(shape: tuple[int, ...], dtype: type = np.uint8) -> np.ndarray:
    """A smooth image (what the delta filter is for), with a little noise."""
    ramp = np.indices(shape).sum(axis=0) * 7
    noise = np.random.default_rng(5).integers(0, 3, shape)
    return (ramp + noise).astype(dtype)


def test_the_filtered_header_matches_its_golden_bytes_and_they_decode() -> None:
    image = ((np.indices((32, 64, 3)) * np.array([2, 1, 1])[:, None, None, None]).sum(axis=0)
             % 256).astype(np.uint8)
    frames = encode(Data(np.array([[1, 0]]), [{"image": image}]), inline_threshold=1024)
    wire = compress_frames(frames, Codec("zstd", 1, delta=True))
    assert [bytes(frame) for frame in wire[:3]] == FILTERED_GOLDEN[:3]
    for golden in (FILTERED_GOLDEN, wire):
        decoded = decode([bytearray(frame) for frame in golden])
        assert isinstance(decoded, Data) and decoded.tags.tolist() == [[1, 0]]
        assert np.array_equal(decoded.samples[0]["image"], image)


@pytest.mark.parametrize(("name", "array", "strides"), [
    ("rgb-batch", gradient((6, 48, 40, 3)), [3, 120]),
    ("rgba-u16", gradient((40, 56, 4), np.uint16), [8, 448]),
    ("gray-2d-i16", gradient((96, 80), np.int16), [2, 160]),
    ("gray-stack", gradient((4, 64, 50)), [1, 50]),
])
def test_filtered_frames_round_trip_to_the_same_bytes_writable(
        name: str, array: np.ndarray, strides: list[int]) -> None:
    frames = encode(Data(np.array([[1, 0]]), [{"x": array, "y": 4}]), inline_threshold=1024)
    wire = compress_frames(frames, Codec("zstd", 1, delta=True))
    header = packed(wire)
    assert header is not None and header["c"][2] == 3 and header["f"][2] == strides
    plain = compress_frames(frames, Codec("zstd", 1))
    assert "f" not in packed(plain)  # type: ignore[operator]
    assert len(wire[3]) < len(plain[3])  # the filter is what it is for: fewer bytes
    decoded = decode(wire)
    assert isinstance(decoded, Data)
    x = decoded.samples[0]["x"]
    assert x.dtype == array.dtype and np.array_equal(x, array) and decoded.samples[0]["y"] == 4
    x[0] = 0  # writable: a view of the inflated, unfiltered buffer
    assert inflate_frames(wire)[2] == bytes(memoryview(frames[2]).cast("B"))


def test_a_batch_of_images_is_filtered_as_its_stacked_leaf() -> None:
    samples = [{"image": gradient((32, 48, 3)) + index, "label": index} for index in range(8)]
    wire = compress_frames(encode(Data(np.array([[1, i] for i in range(8)]), samples)),
                           Codec("zstd", 3, delta=True))
    assert packed(wire)["f"][2] == [3, 144]  # type: ignore[index]
    decoded = decode(wire)
    assert isinstance(decoded, Data)
    for index, sample in enumerate(decoded.samples):
        assert np.array_equal(sample["image"], samples[index]["image"])


def test_arrays_that_suit_no_filter_are_compressed_as_zstd_alone() -> None:
    floats = np.linspace(0, 1, 1 << 14, dtype=np.float32).reshape(128, 128)
    ints = np.arange(1 << 13, dtype=np.int64)  # one dimension: no rows
    frames = encode(Data(np.array([[1, 0]]), [{"f": floats, "i": ints}]), inline_threshold=1024)
    wire = compress_frames(frames, Codec("zstd", 1, delta=True))
    assert wire[0] == compress_frames(frames, Codec("zstd", 1))[0]  # no "f", codecs 2
    assert np.array_equal(decode(wire).samples[0]["f"], floats)  # type: ignore[union-attr]


def filtered_header(codecs: list[int], sizes: list[int], filters: object) -> bytes:
    return msgpack.packb({"v": 1, "k": 15, "c": codecs, "n": sizes, "f": filters})


FILTERED_FRAME = Codec("zstd", 1).squeeze(bytes(range(256)) * 48)  # 12288 bytes inflated


@pytest.mark.parametrize(("filters", "codec", "expected"), [
    ([[0]], 3, r"filter of frame 0 as at most 4 strides from 1 to 16777216 that divide"),
    ([[-3]], 3, "filter of frame 0"),
    ([[5]], 3, "divide its 12288 bytes, got \\[5\\]"),
    ([[1 << 25]], 3, "filter of frame 0"),
    ([[1, 2, 3, 4, 6]], 3, "at most 4 strides"),
    ([["3"]], 3, "filter of frame 0"),
    ([3], 3, "filter of frame 0"),
    ([[3], [3]], 3, "expected 1 filters under 'f'"),
    ({"0": [3]}, 3, "expected 1 filters under 'f'"),
    ([[]], 3, "frame 0 of codec 3 has no filter"),
    ([[3]], 2, "frame 0 of codec 2 has filter"),
    (None, 3, "expected 1 filters under 'f'"),
])
def test_malformed_filters_are_refused_before_inflating(
        filters: object, codec: int, expected: str) -> None:
    fields = {"v": 1, "k": 15, "c": [codec], "n": [12288]}
    if filters is not None:
        fields["f"] = filters
    with pytest.raises(ProtocolError, match=expected):
        decode([msgpack.packb(fields), FILTERED_FRAME])


def test_a_filtered_decompression_bomb_is_refused_before_it_is_inflated() -> None:
    zeros = np.zeros((4096, 4096, 4), np.uint8)  # 64 MiB: a few KiB compressed
    bomb = compress_frames(encode(Data(np.array([[1, 0]]), [{"x": zeros}])),
                           Codec("zstd", 3, delta=True))
    assert packed(bomb)["f"][2] == [4, 16384] and sum(map(len, bomb)) < 64 << 10  # type: ignore[index]
    with pytest.raises(ProtocolError, match="limit is 16777216: refused before inflating"):
        decode(bomb, limits=Limits(max_message_bytes=16 << 20))
    with pytest.raises(ProtocolError, match="refused before inflating"):
        decode([filtered_header([3], [1 << 60], [[4]]), bomb[3]])
