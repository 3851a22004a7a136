"""Fuzzing the decoder: whatever arrives, decode raises ProtocolError or returns a message.

Random frames, mutations of real messages (bit flips, truncation, extra or missing
frames) and random msgpack headers built to look almost right. Every run is
bounded in time; the seeded loops print their seed so a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    CONTROL_LIMITS,
    Data,
    Hello,
    Limits,
    SampleBatch,
    Stats,
    decode,
    encode,
    read_tags,
)

SEED = int(os.environ.get("FEEDMUX_FUZZ_SEED", random.randrange(2**32)))
LIMITS = Limits(max_header_bytes=1 << 20, max_frames=64, max_message_bytes=1 << 24)


def decode_or_protocol_error(frames: list[Any]) -> None:
    """Decode ``frames``; anything but a message or a ProtocolError fails the test."""
    try:
        message = decode(frames, limits=LIMITS)
    except ProtocolError:
        return
    if isinstance(message, Data):
        # A message that decoded must also be fully usable.
        samples = message.samples
        for index in range(len(samples)):
            samples[index]
        if isinstance(samples, SampleBatch):
            samples.stacked()
        assert message.tags.shape == (len(samples), 2)
    try:
        read_tags(frames)
    except ProtocolError:
        pass


def valid_messages() -> list[list[bytes]]:
    rng = np.random.default_rng(1)
    batch = [{"X": rng.random(16, dtype=np.float32), "y": np.int64(i), "s": "t"} for i in range(8)]
    big_batch = [{"img": np.full((40, 40), i, dtype=np.uint16)} for i in range(4)]
    tags = np.array([[1, i] for i in range(8)], dtype=np.int64)
    messages = [
        encode(Hello(client_id="c")),
        encode(Stats(values={"a": 1, "b": "x"})),
        encode(Data(tags[:1], [{"a": np.arange(5), "t": (1, "x", b"y"), "n": None}])),
        encode(Data(tags[:1], [np.arange(10, dtype=">f8")]), inline_threshold=0),
        encode(Data(tags, batch)),
        encode(Data(tags, batch), inline_threshold=0),
        encode(Data(tags[:4], big_batch)),
        encode(
            Data(
                tags[:2],
                [np.zeros(3, dtype=[("a", "<i4"), ("b", "S2", (2,))]), np.datetime64(1, "ms")],
            )
        ),
    ]
    return [[bytes(frame) for frame in frames] for frames in messages]


def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    frames = list(frames)
    operation = rng.randrange(8)
    index = rng.randrange(len(frames))
    frame = bytearray(frames[index])
    if operation == 0 and frame:  # flip bits
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(frame))
            frame[position] ^= 1 << rng.randrange(8)
    elif operation == 1:  # truncate
        del frame[rng.randrange(len(frame) + 1) :]
    elif operation == 2:  # grow
        frame += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif operation == 3 and frame:  # overwrite a byte with an interesting value
        frame[rng.randrange(len(frame))] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0xC1, 0xDD, 0xDF])
    elif operation == 4:  # extra frame
        frames.insert(rng.randrange(len(frames) + 1), bytes(rng.randrange(256) for _ in range(8)))
    elif operation == 5 and len(frames) > 1:  # drop a frame
        del frames[index]
        return frames
    elif operation == 6:  # swap two frames
        other = rng.randrange(len(frames))
        frames[index], frames[other] = frames[other], frames[index]
        return frames
    elif operation == 7 and frame:  # splice a chunk of the frame elsewhere
        start = rng.randrange(len(frame))
        chunk = frame[start : start + rng.randint(1, 8)]
        at = rng.randrange(len(frame))
        frame[at:at] = chunk
    frames[index] = bytes(frame)
    return frames


@pytest.mark.timeout(30)
def test_mutated_messages_raise_only_protocol_errors() -> None:
    print(f"fuzz seed {SEED} (set FEEDMUX_FUZZ_SEED to replay)")
    rng = random.Random(SEED)
    originals = valid_messages()
    deadline = time.monotonic() + 3.0
    runs = 0
    while time.monotonic() < deadline:
        frames = rng.choice(originals)
        for _ in range(rng.randint(1, 3)):
            frames = mutate(frames, rng)
        decode_or_protocol_error(frames)
        runs += 1
    assert runs > 1000


@pytest.mark.timeout(30)
def test_random_frames_raise_only_protocol_errors() -> None:
    print(f"fuzz seed {SEED} (set FEEDMUX_FUZZ_SEED to replay)")
    rng = random.Random(SEED + 1)
    prefixes = [b"", b"\x85\xa1v\x01\xa1k\x01", b"\x86\xa1v\x01\xa1k\x01", b"\x81\xa1v\x01"]
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        count = rng.randint(0, 5)
        frames = [
            rng.choice(prefixes) + bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
            for _ in range(count)
        ]
        decode_or_protocol_error(frames)


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b""],
        [b"\xc1"],
        [b"\x80"],
        [b"\xdf\xff\xff\xff\xff"],  # a map declaring 4 billion entries
        [b"\xdd\xff\xff\xff\xff"],  # an array declaring 4 billion items
        [b"\x91" * 100_000 + b"\x90"],  # nesting deeper than any stack
        [b"\x81\xa1v" + b"\x91" * 5000 + b"\x01"],
        [msgpack.packb({"v": 1, "k": 1, "n": 2**62, "samples": []}), b""],
        [msgpack.packb({"v": 1, "k": 1, "n": 1, "samples": [1]})],  # no tag frame
        ["not bytes"],
        [12345],
        [None],
        [memoryview(np.zeros((2, 2)))],
        [memoryview(np.zeros((4, 4))[:, ::2])],
    ],
)
@pytest.mark.timeout(10)
def test_pathological_frames(frames: list[Any]) -> None:
    with pytest.raises(ProtocolError):
        decode(frames, limits=LIMITS)


def test_non_sequence_input() -> None:
    for bad in (None, 5, object()):
        with pytest.raises(ProtocolError):
            decode(bad)  # type: ignore[arg-type]
        with pytest.raises(ProtocolError):
            read_tags(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- hostile headers


def ext_payload(descriptor: Any, raw: bytes) -> bytes:
    packed = msgpack.packb(descriptor, use_bin_type=True)
    return bytes((min(len(packed), 254),)) + packed + raw


DESCRIPTIONS = st.one_of(
    st.sampled_from(
        [
            "<f4",
            "|u1",
            ">i8",
            "|S0",
            "|V0",
            "<U3",
            "<M8[ns]",
            "|O",
            "|O8",
            "<f16",
            "<i4 ",
            "x",
            "",
            "<S999999999",
            "<U999999999",
            "|V999999999",
            "<c32",
        ]
    ),
    st.text(max_size=12),
    st.integers(-(2**63), 2**64 - 1),
    st.none(),
    st.builds(
        lambda fields, itemsize, aligned: {
            "fields": fields,
            "itemsize": itemsize,
            "aligned": aligned,
        },
        st.lists(
            st.lists(
                st.one_of(
                    st.text(max_size=3),
                    st.sampled_from(["<f4", "|u1", "|O"]),
                    st.integers(-2, 2**40),
                ),
                max_size=4,
            ),
            max_size=4,
        ),
        st.one_of(st.integers(-5, 2**40), st.none()),
        st.one_of(st.booleans(), st.integers(-(2**63), 2**64 - 1)),
    ),
    st.builds(
        lambda base, shape: {"base": base, "shape": shape},
        st.sampled_from(["<f4", "|S0", "|O", 3]),
        st.one_of(st.lists(st.integers(-1, 2**40), max_size=40), st.integers(-(2**63), 2**64 - 1)),
    ),
)
SHAPES = st.one_of(
    st.lists(st.one_of(st.integers(-2, 6), st.just(2**62), st.just(2**64 - 1)), max_size=6),
    st.lists(st.integers(0, 3), min_size=30, max_size=70),
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=3),
    st.none(),
)
PLAIN = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.text(max_size=3),
    st.binary(max_size=8),
    st.floats(),
    st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1)),
)


PLAUSIBLE_DTYPES = st.sampled_from(
    [
        np.dtype("<f4"),
        np.dtype("|u1"),
        np.dtype(">i2"),
        np.dtype("<M8[s]"),
        np.dtype("|S2"),
        np.dtype([("a", "<i2"), ("b", "|u1", (2,))]),
    ]
)
PLAUSIBLE_SHAPES = st.lists(st.integers(0, 4), max_size=3)


@st.composite
def described_arrays(draw: st.DrawFn) -> tuple[Any, Any, int]:
    """A descriptor that is usually valid, with the byte count it implies."""
    if draw(st.integers(0, 3)) == 3:
        return draw(DESCRIPTIONS), draw(SHAPES), draw(st.integers(0, 64))
    dtype = draw(PLAUSIBLE_DTYPES)
    shape = draw(PLAUSIBLE_SHAPES)
    description: Any = dtype.str
    if dtype.names is not None:
        description = {
            "fields": [["a", "<i2", 0], ["b", {"base": "|u1", "shape": [2]}, 2]],
            "itemsize": 4,
            "aligned": False,
        }
    return description, shape, dtype.itemsize * int(np.prod(shape))


@st.composite
def hostile_exts(draw: st.DrawFn) -> msgpack.ExtType:
    code = draw(st.sampled_from([1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 0, 8, 127]))
    if code == 1:
        description, shape, size = draw(described_arrays())
        raw = bytes(size) if draw(st.integers(0, 3)) < 3 else draw(st.binary(max_size=64))
        return msgpack.ExtType(code, ext_payload([description, shape], raw))
    if code == 3:
        description, _, _ = draw(described_arrays())
        raw = draw(st.sampled_from([b"", b"\x00", b"\x00" * 2, b"\x00" * 4, b"\x00" * 8]))
        return msgpack.ExtType(code, ext_payload(description, raw))
    if code == 2:
        description, shape, _ = draw(described_arrays())
        descriptor = [description, shape, draw(st.integers(-2, 6))]
        return msgpack.ExtType(code, msgpack.packb(descriptor, use_bin_type=True))
    if code in (5, 6):
        inner = draw(hostile_exts())
        return msgpack.ExtType(code, msgpack.packb(inner, use_bin_type=True))
    if code == 7:
        values = draw(st.lists(PLAIN, max_size=6))
        return msgpack.ExtType(code, msgpack.packb(values, use_bin_type=True))
    return msgpack.ExtType(code, draw(st.binary(max_size=4)))


VALUES = st.recursive(
    st.one_of(PLAIN, hostile_exts()),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(-3, 3)), children, max_size=4),
    ),
    max_leaves=10,
)


@st.composite
def hostile_messages(draw: st.DrawFn) -> list[bytes]:
    header: dict[Any, Any] = {
        "v": draw(st.sampled_from([1] * 12 + [2, "1", None])),
        "k": draw(st.sampled_from([1] * 12 + [2, 5, 7, 12, 13, "1"])),
    }
    count = draw(st.integers(0, 4))
    header["n"] = draw(st.sampled_from([count] * 8 + [count + 1, -1, 2**63, "2"]))
    if draw(st.booleans()):
        header["samples"] = draw(st.lists(VALUES, min_size=count, max_size=count))
    if draw(st.booleans()):
        header["batch"] = draw(VALUES)
    for name in draw(
        st.lists(
            st.sampled_from(["server_id", "seq", "client_id", "values", "seqs", "epoch", "count"]),
            max_size=3,
        )
    ):
        header[name] = draw(VALUES)
    tags = draw(st.sampled_from([count * 16] * 8 + [0, 8, 16 * (count + 1)]))
    frames = [msgpack.packb(header, use_bin_type=True), bytes(tags)]
    sizes = st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48])
    frames += [bytes(size) for size in draw(st.lists(sizes, max_size=4))]
    if draw(st.integers(0, 15)) == 15:
        frames = frames[:1]
    return frames


# A bound on a hang, not on speed: the 400 examples take ~8 s of CPU, and three times
# that or more on a loaded 2-core machine (60 s timed out with the suite run in parallel).
@pytest.mark.timeout(240)
@settings(
    max_examples=int(os.environ.get("FEEDMUX_HYPOTHESIS_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(frames=hostile_messages(), writable=st.booleans())
def test_hostile_headers_raise_only_protocol_errors(frames: list[bytes], writable: bool) -> None:
    decode_or_protocol_error([bytearray(frame) for frame in frames] if writable else frames)


@pytest.mark.timeout(10)
def test_declared_sizes_are_checked_before_allocating() -> None:
    # 2**40 float64s would be 8 TiB: refused because the frame holds 8 bytes.
    descriptor = ["<f8", [2**20, 2**20], 2]
    header = {"v": 1, "k": 1, "n": 1, "samples": [msgpack.ExtType(2, msgpack.packb(descriptor))]}
    frames = [msgpack.packb(header), bytes(16), bytes(8)]
    with pytest.raises(ProtocolError, match="needs 8796093022208 bytes"):
        decode(frames)
    # Zero-size items carry no bytes; their count is bounded on its own.
    descriptor = ["|V0", [2**62], 2]
    header["samples"] = [msgpack.ExtType(2, msgpack.packb(descriptor))]
    with pytest.raises(ProtocolError, match="zero-size"):
        decode([msgpack.packb(header), bytes(16), b""])
    # A shape whose product overflows 64 bits.
    descriptor = ["<f4", [2**63, 2**63, 4], 2]
    header["samples"] = [msgpack.ExtType(2, msgpack.packb(descriptor))]
    with pytest.raises(ProtocolError):
        decode([msgpack.packb(header), bytes(16), bytes(16)])


def test_object_dtypes_never_decode() -> None:
    for description in ("|O", "|O8", {"fields": [["a", "|O", 0]], "itemsize": 8}):
        payload = ext_payload([description, [1]], bytes(8))
        header = {"v": 1, "k": 1, "n": 1, "samples": [msgpack.ExtType(1, payload)]}
        with pytest.raises(ProtocolError, match="dtype"):
            decode([msgpack.packb(header), bytes(16)])


def test_each_frame_is_used_once_and_all_are_used() -> None:
    descriptor = msgpack.packb(["|u1", [4], 2])
    twice = {"v": 1, "k": 1, "n": 2, "samples": [msgpack.ExtType(2, descriptor)] * 2}
    with pytest.raises(ProtocolError, match="twice"):
        decode([msgpack.packb(twice), bytes(32), bytes(4)])
    once = {"v": 1, "k": 1, "n": 1, "samples": [msgpack.ExtType(2, descriptor)]}
    with pytest.raises(ProtocolError, match="no array refers"):
        decode([msgpack.packb(once), bytes(16), bytes(4), bytes(4)])
    header_frame = {
        "v": 1,
        "k": 1,
        "n": 1,
        "samples": [msgpack.ExtType(2, msgpack.packb(["|u1", [4], 1]))],
    }
    with pytest.raises(ProtocolError, match="frame 1"):
        decode([msgpack.packb(header_frame), bytes(16)])


def test_markers_out_of_place_are_refused() -> None:
    tuple_mark = msgpack.ExtType(4, b"")
    column = msgpack.ExtType(7, msgpack.packb([1]))
    cases = [
        {"samples": [[1, tuple_mark]]},  # tuple marker not first
        {"samples": [tuple_mark]},  # tuple marker alone
        {"samples": [{"a": tuple_mark}]},
        {"samples": [column]},  # batch leaf outside a batch
        {"batch": {"a": column, "b": 3}, "n": 1},  # a bare value in a batch template
        {"batch": column, "n": 2},  # column of the wrong length
    ]
    for fields in cases:
        header = {"v": 1, "k": 1, "n": 1, **fields}
        with pytest.raises(ProtocolError):
            decode([msgpack.packb(header), bytes(16 * header["n"])])


def test_control_limits_bound_the_total_of_containers() -> None:
    # Per-container limits alone let 8000 empty maps through in two arrays of 4000.
    half = b"\xdc" + (4000).to_bytes(2, "big") + b"\x80" * 4000
    header = b"\x82\xa1v\x01\xa1x\x92" + half + half
    with pytest.raises(ProtocolError, match="too many arrays and maps"):
        decode([header], limits=CONTROL_LIMITS)


def test_declared_array_length_is_bounded_before_allocation() -> None:
    header = b"\x82\xa1v\x01\xa1x\xdd" + (1 << 30).to_bytes(4, "big") + b"\x00" * 64
    with pytest.raises(ProtocolError):
        decode([header], limits=Limits(max_container_len=1 << 16))


def test_a_loader_refuses_a_header_of_millions_of_empty_maps() -> None:
    # What a hostile server could send a loader: 4 MiB of 0x80 (4 million maps) in
    # arrays under the per-container limit. The total stops it at 2**20 maps.
    chunk = b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x80" * (1 << 20)
    header = b"\x82\xa1v\x01\xa1x\x94" + chunk * 4
    with pytest.raises(ProtocolError, match="too many arrays and maps"):
        decode([header])
