"""Samples inside data messages: trees, dtypes, memory layouts, copies and refusals."""

from __future__ import annotations

import collections
import enum
import warnings
from typing import Any

import msgpack
import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    INLINE_THRESHOLD,
    Data,
    Limits,
    SampleBatch,
    decode,
    encode,
)
from tests.protocol.trees import assert_same


def tags_for(count: int, epoch: int = 1) -> np.ndarray:
    return np.stack([np.full(count, epoch), np.arange(count)], axis=1).astype(np.int64)


def round_trip(sample: Any, **encode_options: Any) -> Any:
    frames = encode(Data(tags_for(1), [sample]), **encode_options)
    message = decode(frames)
    assert isinstance(message, Data)
    return message.samples[0]


PLAIN_SAMPLES = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    1.5,
    float("inf"),
    float("nan"),
    "",
    "héllo ✓",
    b"",
    b"\x00\xff",
    [],
    (),
    {},
    [1, "a", None],
    (1, (2, (3,)), [4, ()]),
    {"a": 1, "b": {"c": [1, 2]}},
    {3: "int key", "s": "str key", -1: None},
    {"z": 1, "a": 2, "m": 3},  # order is kept, not sorted
    [[[[[[[[[[]]]]]]]]]],
]


@pytest.mark.parametrize("sample", PLAIN_SAMPLES, ids=repr)
def test_plain_python_round_trip(sample: Any) -> None:
    assert_same(sample, round_trip(sample))


DTYPES = [
    "bool",
    "i1",
    "u1",
    "<i2",
    ">i2",
    "<u2",
    "<i4",
    ">u4",
    "<i8",
    ">i8",
    "<u8",
    "<f2",
    ">f2",
    "<f4",
    ">f4",
    "<f8",
    ">f8",
    "<c8",
    ">c16",
    "longdouble",
    "clongdouble",
    "<M8[ns]",
    ">M8[D]",
    "<M8",
    "<M8[10ms]",
    "<m8[us]",
    ">m8[s]",
    "S1",
    "S7",
    "<U1",
    ">U5",
    "V3",
    [("a", "<i4"), ("b", ">f8")],
    [("a", "u1"), ("b", "<f8", (2, 3)), ("c", "S3")],
    [("outer", [("x", "<i2"), ("y", [("deep", ">u8")])]), ("flag", "?")],
    np.dtype([("a", "u1"), ("b", "<f8")], align=True),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i2"], "offsets": [8, 0], "itemsize": 16}),
    np.dtype({"names": ["a"], "formats": ["<f4"], "titles": ["the a field"]}),
    [("when", "<M8[ms]"), ("span", ">m8[h]"), ("name", "<U4")],
]


def sample_array(dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(7).integers(
        0, 256, size=max(1, dtype.itemsize) * int(np.prod(shape))
    )
    array = np.frombuffer(raw.astype(np.uint8).tobytes(), dtype=dtype)[: int(np.prod(shape))]
    array = array.reshape(shape).copy()
    if dtype.kind == "U" or (dtype.names is not None and "name" in dtype.names):
        # Random bytes are not all valid code points; use text.
        field = array if dtype.kind == "U" else array["name"]
        field[...] = "ab✓"[: field.dtype.itemsize // 4]
    if dtype.kind == "b":
        array = np.asarray(array.view(np.uint8) % 2 == 1)
    return array


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (3, 0, 2)], ids=str)
@pytest.mark.parametrize("threshold", [0, INLINE_THRESHOLD], ids=["frames", "inline"])
def test_array_dtypes_round_trip(dtype: Any, shape: tuple[int, ...], threshold: int) -> None:
    array = sample_array(dtype, shape)
    back = round_trip({"a": array}, inline_threshold=threshold)["a"]
    assert_same(array, back)
    assert back.flags.writeable


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numpy_scalars_round_trip(dtype: Any) -> None:
    scalar = sample_array(dtype, (1,))[0]
    assert isinstance(scalar, np.generic)
    back = round_trip([scalar])[0]
    assert_same(scalar, back)


@pytest.mark.parametrize(
    "scalar",
    [
        np.float16(1.5),
        np.float32(-0.0),
        np.int8(-3),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.complex64(1 + 2j),
        np.str_("ünï"),
        np.bytes_(b"ab"),
        np.datetime64("2024-01-02T03:04"),
        np.timedelta64(5, "ms"),
        np.datetime64("NaT"),
        np.bytes_(b""),
        np.str_(""),
        np.void(b""),
    ],
    ids=repr,
)
def test_common_numpy_scalars(scalar: np.generic) -> None:
    assert_same(scalar, round_trip(scalar))


def strided_views() -> list[np.ndarray]:
    base = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    return [
        np.asfortranarray(base),
        base[:, ::2],
        base[::-1],
        base[:, ::-2, 1:4],
        base.transpose(2, 0, 1),
        base[..., 1],
        np.broadcast_to(np.arange(3.0), (4, 3)),
        np.arange(10)[::3],
        np.asfortranarray(np.arange(12, dtype=">i8").reshape(3, 4)),
    ]


@pytest.mark.parametrize("threshold", [0, INLINE_THRESHOLD], ids=["frames", "inline"])
@pytest.mark.parametrize("view", strided_views(), ids=lambda v: str(v.strides))
def test_memory_layouts_arrive_with_the_same_values(view: np.ndarray, threshold: int) -> None:
    back = round_trip(view, inline_threshold=threshold)
    assert_same(view, back)
    np.testing.assert_array_equal(back, view)
    assert back.flags.writeable


def test_decoded_arrays_are_writable_from_every_kind_of_buffer() -> None:
    big = np.arange(100_000, dtype=np.float64)
    small = np.arange(4, dtype=np.int16)
    frames = encode(Data(tags_for(1), [{"big": big, "small": small, "s": np.float32(1)}]))
    assert len(frames) == 3
    for convert in (
        bytes,
        bytearray,
        lambda f: memoryview(bytes(f)),
        lambda f: memoryview(bytearray(f)),
    ):
        message = decode([convert(frame) for frame in frames])
        assert isinstance(message, Data)
        sample = message.samples[0]
        for name in ("big", "small"):
            assert sample[name].flags.writeable
            sample[name][0] = 42  # must not raise
        assert message.tags.flags.writeable


def test_torch_from_numpy_does_not_warn() -> None:
    import torch  # a test dependency (make test installs it); imported here as it is slow

    frames = encode(Data(tags_for(1), [np.arange(100_000, dtype=np.float32)]))
    message = decode([bytes(frame) for frame in frames])
    assert isinstance(message, Data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = torch.from_numpy(message.samples[0])
    assert tensor.shape == (100_000,)


def test_large_array_is_zero_copy_at_encode() -> None:
    array = np.arange(1_000_000, dtype=np.float32)
    frames = encode(Data(tags_for(1), [array]))
    assert len(frames) == 3
    assert np.shares_memory(np.frombuffer(frames[2], dtype=np.uint8), array)


def test_large_array_is_zero_copy_at_decode_from_writable_buffers() -> None:
    array = np.arange(1_000_000, dtype=np.float32)
    frames = [bytearray(frame) for frame in encode(Data(tags_for(1), [array]))]
    message = decode(frames)
    assert isinstance(message, Data)
    decoded = message.samples[0]
    assert np.shares_memory(decoded, np.frombuffer(frames[2], dtype=np.uint8))
    np.testing.assert_array_equal(decoded, array)
    # A read-only buffer is copied instead: the array must still be writable.
    readonly = decode([bytes(frame) for frame in frames])
    assert isinstance(readonly, Data)
    assert readonly.samples[0].flags.writeable


def test_zmq_frame_like_objects_are_read_through_their_buffer() -> None:
    class FrameLike:
        def __init__(self, data: bytes) -> None:
            self.buffer = memoryview(bytearray(data))

    frames = encode(Data(tags_for(1), [np.arange(100_000, dtype=np.int32)]))
    wrapped = [FrameLike(bytes(frame)) for frame in frames]
    message = decode(wrapped)  # type: ignore[arg-type]
    assert isinstance(message, Data)
    assert np.shares_memory(message.samples[0], np.asarray(wrapped[2].buffer))


def test_inline_threshold() -> None:
    below = np.zeros(INLINE_THRESHOLD - 1, dtype=np.uint8)
    at = np.zeros(INLINE_THRESHOLD, dtype=np.uint8)
    assert len(encode(Data(tags_for(1), [below]))) == 2
    assert len(encode(Data(tags_for(1), [at]))) == 3
    assert len(encode(Data(tags_for(1), [below]), inline_threshold=0)) == 3
    assert len(encode(Data(tags_for(1), [at]), inline_threshold=2**40)) == 2


def test_frames_are_accepted_by_send_multipart_types() -> None:
    frames = encode(Data(tags_for(1), [{"a": np.zeros(10**6), "b": np.datetime64("2020", "ns")}]))
    for frame in frames:
        assert isinstance(frame, (bytes, memoryview))
        memoryview(frame)  # the buffer protocol is all pyzmq needs


def test_datetime_array_as_frame() -> None:
    # datetime64 arrays do not export the buffer protocol themselves.
    array = np.arange(100_000).astype("<M8[s]")
    frames = encode(Data(tags_for(1), [array]))
    assert len(frames) == 3
    assert_same(array, round_trip(array))


def test_other_hashable_keys_round_trip() -> None:
    # str and int keys are the documented ones; any key the format carries that is
    # hashable once decoded comes back too.
    sample = {(1, "a"): 1, 1.5: 2, b"k": 3, None: 4, np.int16(5): 5}
    assert_same(sample, round_trip(sample))


def test_int_keys_and_key_order() -> None:
    sample = {2: "b", 1: "a", "x": {0: [1]}}
    back = round_trip(sample)
    assert list(back) == [2, 1, "x"]
    assert_same(sample, back)


def test_subclasses_travel_as_their_base_type() -> None:
    class Color(enum.IntEnum):
        RED = 1

    Point = collections.namedtuple("Point", "x y")
    sample = {
        "ordered": collections.OrderedDict(a=1),
        "color": Color.RED,
        "point": Point(1, 2),
        "bytes": bytearray(b"ab"),
    }
    back = round_trip(sample)
    assert back == {"ordered": {"a": 1}, "color": 1, "point": (1, 2), "bytes": b"ab"}
    assert type(back["ordered"]) is dict
    assert type(back["color"]) is int
    assert type(back["point"]) is tuple


def test_object_dtype_is_refused_with_its_path() -> None:
    sample = {"meta": [1, 2, np.array([object()], dtype=object)]}
    with pytest.raises(ProtocolError, match=r"sample\['meta'\]\[2\]") as raised:
        encode(Data(tags_for(1), [sample]))
    assert "object" in str(raised.value)


def test_object_dtype_nested_in_structured_dtype_is_refused() -> None:
    dtype = np.dtype([("a", "<i4"), ("b", [("c", object)])])
    sample = {"x": (1, np.zeros(2, dtype=dtype))}
    with pytest.raises(ProtocolError, match=r"sample\['x'\]\[1\].*object"):
        encode(Data(tags_for(1), [sample]))


def test_object_dtype_path_in_a_batch_names_the_sample() -> None:
    samples: list[Any] = [{"a": np.zeros(2)} for _ in range(4)]
    samples[2] = {"a": np.zeros(2, dtype=object)}
    with pytest.raises(ProtocolError, match=r"sample\['a'\].*sample 2 of 4"):
        encode(Data(tags_for(4), samples))


@pytest.mark.parametrize(
    ("sample", "path", "what"),
    [
        ({"a": {1, 2}}, r"sample\['a'\]", "set"),
        ([1, [object()]], r"sample\[1\]\[0\]", "object"),
        ({"t": (1, 2**64)}, r"sample\['t'\]\[1\]", "out of range"),
        ({"t": -(2**63) - 1}, r"sample\['t'\]", "out of range"),
        ({"s": "\ud800"}, r"sample\['s'\]", "UTF-8"),
        ({frozenset([1]): 3}, r"sample \(key frozenset\(\{1\}\)\)", "frozenset"),
        ({"c": 1 + 2j}, r"sample\['c'\]", "complex"),
        ({"m": np.ma.masked_array([1, 2])}, r"sample\['m'\]", "masked"),
    ],
    ids=lambda value: str(value)[:20],
)
def test_unsupported_values_are_refused_with_path_and_type(
    sample: Any, path: str, what: str
) -> None:
    with pytest.raises(ProtocolError, match=path) as raised:
        encode(Data(tags_for(1), [sample]))
    assert what in str(raised.value)


def test_string_dtype_without_fixed_width_is_refused() -> None:
    string_dtype = getattr(np.dtypes, "StringDType", None)
    if string_dtype is None:
        pytest.skip("numpy without StringDType")
    with pytest.raises(ProtocolError, match=r"sample\['s'\]"):
        encode(Data(tags_for(1), [{"s": np.array(["a", "bc"], dtype=string_dtype())}]))


def test_samples_must_be_a_sequence() -> None:
    with pytest.raises(ProtocolError, match="sequence"):
        encode(Data(tags_for(1), (x for x in [1])))  # type: ignore[arg-type]


def test_tags_travel_in_frame_one() -> None:
    tags = np.array([[3, 17]], dtype=np.int64)
    frames = encode(Data(tags, ["x"]))
    assert bytes(frames[1]) == tags.astype("<i8").tobytes()
    message = decode(frames)
    assert isinstance(message, Data)
    assert message.tags.dtype == np.dtype("<i8")
    assert message.tags.tolist() == [[3, 17]]


@pytest.mark.parametrize(
    "tags",
    [np.zeros((2, 2), dtype=np.int64), np.zeros((1, 3), dtype=np.int64), np.zeros((1, 2)), [[1]]],
    ids=str,
)
def test_bad_tags_are_refused(tags: Any) -> None:
    with pytest.raises(ProtocolError, match="tags"):
        encode(Data(tags, ["one sample"]))


def test_tags_from_lists_and_other_int_dtypes() -> None:
    message = decode(encode(Data([[1, 2], [1, 3]], ["a", "b"])))  # type: ignore[arg-type]
    assert isinstance(message, Data)
    assert message.tags.tolist() == [[1, 2], [1, 3]]
    message = decode(encode(Data(np.array([[1, 2]], dtype=np.uint16), ["a"])))
    assert isinstance(message, Data)
    assert message.tags.dtype == np.dtype("<i8")


def test_empty_data_message() -> None:
    message = decode(encode(Data(np.zeros((0, 2), dtype=np.int64), [], "s", 3)))
    assert isinstance(message, Data)
    assert list(message.samples) == []
    assert message.tags.shape == (0, 2)
    assert (message.server_id, message.seq) == ("s", 3)


def test_server_id_and_seq_round_trip() -> None:
    message = decode(encode(Data(tags_for(1), [0], server_id="srv-1", seq=2**40)))
    assert isinstance(message, Data)
    assert (message.server_id, message.seq) == ("srv-1", 2**40)


def test_data_header_layout() -> None:
    frames = encode(Data(tags_for(1), [{"x": 1}], server_id="s", seq=4))
    header = msgpack.unpackb(frames[0], strict_map_key=False)
    assert list(header)[:2] == ["v", "k"]
    assert header["n"] == 1
    assert header["samples"] == [{"x": 1}]


@pytest.mark.timeout(10)
def test_limits_are_enforced() -> None:
    frames = encode(Data(tags_for(1), [np.zeros(100_000)]))
    with pytest.raises(ProtocolError, match="header"):
        decode(frames, limits=Limits(max_header_bytes=10))
    with pytest.raises(ProtocolError, match="frames"):
        decode(frames, limits=Limits(max_frames=2))
    with pytest.raises(ProtocolError, match="bytes"):
        decode(frames, limits=Limits(max_message_bytes=100_000))
    assert isinstance(decode(frames, limits=Limits(max_message_bytes=900_000)), Data)


def test_sample_batch_type_is_exported() -> None:
    samples = [{"x": np.zeros(2)} for _ in range(3)]
    message = decode(encode(Data(tags_for(3), samples)))
    assert isinstance(message, Data)
    assert isinstance(message.samples, SampleBatch)
