"""Transport batching: stacked encoding, the lazy SampleBatch, tags without decoding."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    Data,
    Hello,
    SampleBatch,
    decode,
    encode,
    read_tags,
    replace_tags,
    stacking_into,
    take_samples,
)
from feedmux.protocol._batch import stack_samples
from tests.protocol.trees import assert_same


def tags_for(count: int, epoch: int = 1) -> np.ndarray:
    return np.stack([np.full(count, epoch), np.arange(count)], axis=1).astype(np.int64)


def decode_samples(samples: list[Any], **options: Any) -> Any:
    message = decode(encode(Data(tags_for(len(samples)), samples), **options))
    assert isinstance(message, Data)
    return message.samples


def small_samples(count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [{"X": rng.random(16, dtype=np.float32), "y": np.int64(index)} for index in range(count)]


def test_uniform_samples_are_stacked() -> None:
    samples = small_samples(256)
    frames = encode(Data(tags_for(256), samples))
    header = msgpack.unpackb(frames[0])
    assert "batch" in header
    assert "samples" not in header
    batch = decode(frames).samples  # type: ignore[union-attr]
    assert isinstance(batch, SampleBatch)
    assert len(batch) == 256
    for index in (0, 1, 255, -1, -256):
        assert_same(samples[index], batch[index])
    for expected, actual in zip(samples, batch, strict=True):
        assert_same(expected, actual)


def test_stacked_leaves_are_views_of_one_array() -> None:
    batch = decode_samples(small_samples(8))
    stacked = batch.stacked()
    assert stacked["X"].shape == (8, 16)
    assert stacked["y"].shape == (8,)
    assert stacked["y"].dtype == np.int64
    first = batch[3]["X"]
    assert np.shares_memory(first, stacked["X"])
    assert first.flags.writeable


def test_zero_d_arrays_stay_zero_d_and_scalars_stay_scalars() -> None:
    samples = [
        {"zero_d": np.array(index, dtype=np.int32), "scalar": np.float32(index)}
        for index in range(5)
    ]
    batch = decode_samples(samples)
    sample = batch[2]
    assert type(sample["zero_d"]) is np.ndarray
    assert sample["zero_d"].shape == ()
    assert sample["zero_d"].dtype == np.int32
    assert int(sample["zero_d"]) == 2
    assert type(sample["scalar"]) is np.float32
    assert sample["scalar"] == 2


def test_plain_leaves_travel_as_columns() -> None:
    samples = [
        {"name": f"s{index}", "n": index, "f": index / 2, "flag": index % 2 == 0, "none": None}
        for index in range(4)
    ]
    samples[1]["n"] = 2**64 - 1
    samples[2]["name"] = b"bytes here"  # columns may mix plain types
    batch = decode_samples(samples)
    assert isinstance(batch, SampleBatch)
    for expected, actual in zip(samples, batch, strict=True):
        assert_same(expected, actual)
    assert batch.stacked()["n"] == [0, 2**64 - 1, 2, 3]


def test_nested_structure_is_stacked() -> None:
    samples = [
        {
            "image": np.full((3, 4, 4), index, dtype=np.uint8),
            "meta": {"label": index, "box": (np.float32(index), np.arange(2) + index)},
            "tokens": [np.int16(index), "t", np.array([index, index], dtype=">i4")],
            "empty": {},
            "when": np.datetime64("2024-01-01") + index,
        }
        for index in range(6)
    ]
    batch = decode_samples(samples)
    assert isinstance(batch, SampleBatch)
    for expected, actual in zip(samples, batch, strict=True):
        assert_same(expected, actual)
    stacked = batch.stacked()
    assert stacked["image"].shape == (6, 3, 4, 4)
    assert stacked["meta"]["box"][1].shape == (6, 2)
    assert stacked["tokens"][2].dtype == np.dtype(">i4")
    assert stacked["empty"] == {}


def test_unstacked_builds_what_indexing_builds_in_fresh_containers() -> None:
    samples = [
        {
            "image": np.full((2, 3), index, dtype=">f4"),
            "zero_d": np.array(index, dtype=np.int32),
            "meta": {"label": index, "box": (np.float32(index), [index, "t"]), "empty": ()},
            "wide": {f"k{key}": key * index for key in range(40)},  # past the compiled dicts
        }
        for index in range(5)
    ]
    batch = decode_samples(samples)
    assert isinstance(batch, SampleBatch)
    built = batch.unstacked()
    assert len(built) == 5
    for index, sample in enumerate(built):
        assert_same(samples[index], sample)
        assert_same(batch[index], sample)
    assert np.shares_memory(built[2]["image"], batch.stacked()["image"])
    built[0]["meta"]["box"][1].append("changed")
    assert batch.unstacked()[0]["meta"]["box"][1] == [0, "t"]
    assert decode_samples(list(range(4))).unstacked() == [0, 1, 2, 3]


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "mixed", "big-endian"])
def test_stacked_arrays_keep_their_values_whatever_their_memory_layout(layout: str) -> None:
    base = [np.arange(6, dtype=np.int32).reshape(2, 3) * index for index in range(5)]
    if layout == "transposed":
        arrays = [np.ascontiguousarray(array.T).T for array in base]  # Fortran order
    elif layout == "mixed":
        arrays = [array if index % 2 else np.asfortranarray(array)
                  for index, array in enumerate(base)]
    elif layout == "big-endian":
        arrays = [array.astype(">i4") for array in base]
    else:
        arrays = base
    samples = [{"a": array, "s": np.float16(index)} for index, array in enumerate(arrays)]
    batch = decode_samples(samples)
    assert isinstance(batch, SampleBatch)
    for expected, actual in zip(samples, batch, strict=True):
        assert_same(expected, actual)


@pytest.mark.parametrize("scalar_type", [np.bool_, np.int8, np.uint64, np.float32, np.float64,
                                         np.longdouble, np.complex128])
def test_stacked_numpy_scalars_keep_their_type_and_value(scalar_type: Any) -> None:
    samples = [{"s": scalar_type(index % 3)} for index in range(6)]
    batch = decode_samples(samples)
    assert isinstance(batch, SampleBatch)
    for expected, actual in zip(samples, batch, strict=True):
        assert_same(expected, actual)


@pytest.mark.parametrize(
    "second",
    [
        {"X": np.zeros(16, dtype=np.float64), "y": np.int64(1)},  # other dtype
        {"X": np.zeros(15, dtype=np.float32), "y": np.int64(1)},  # other shape
        {"y": np.int64(1), "X": np.zeros(16, dtype=np.float32)},  # other key order
        {"X": np.zeros(16, dtype=np.float32), "y": 1},  # plain int vs numpy scalar
        {"X": np.zeros(16, dtype=np.float32), "y": np.int32(1)},  # other scalar type
        {"X": np.zeros(16, dtype=np.float32)},  # missing key
        {"X": [0.0] * 16, "y": np.int64(1)},  # list vs array
        [np.zeros(16, dtype=np.float32), np.int64(1)],  # other container
    ],
    ids=[
        "dtype",
        "shape",
        "key-order",
        "int-vs-numpy",
        "scalar-type",
        "missing-key",
        "list-vs-array",
        "container",
    ],
)
def test_heterogeneous_samples_fall_back_to_per_sample(second: Any) -> None:
    samples = [small_samples(1)[0], second, small_samples(1)[0]]
    frames = encode(Data(tags_for(3), samples))
    assert "samples" in msgpack.unpackb(frames[0])
    decoded = decode(frames).samples  # type: ignore[union-attr]
    assert not isinstance(decoded, SampleBatch)
    for expected, actual in zip(samples, decoded, strict=True):
        assert_same(expected, actual)


def test_single_sample_messages_are_not_stacked() -> None:
    frames = encode(Data(tags_for(1), small_samples(1)))
    assert "samples" in msgpack.unpackb(frames[0])


def test_large_stacked_leaf_gets_a_frame_and_arrives_as_a_view() -> None:
    samples = [{"image": np.full((64, 64), index, dtype=np.float32)} for index in range(16)]
    frames = encode(Data(tags_for(16), samples))
    assert len(frames) == 3
    received = [bytearray(frame) for frame in frames]
    message = decode(received)
    assert isinstance(message, Data)
    stacked = message.samples.stacked()  # type: ignore[attr-defined]
    assert stacked["image"].shape == (16, 64, 64)
    assert np.shares_memory(stacked["image"], np.frombuffer(received[2], np.uint8))
    assert np.shares_memory(message.samples[5]["image"], stacked["image"])
    assert message.samples[5]["image"][0, 0] == 5


def test_sample_batch_sequence_protocol() -> None:
    batch = decode_samples([{"i": np.int8(index)} for index in range(10)])
    assert isinstance(batch, SampleBatch)
    assert len(batch) == 10
    assert [sample["i"] for sample in batch[2:5]] == [2, 3, 4]
    assert [sample["i"] for sample in batch[::-3]] == [9, 6, 3, 0]
    assert [sample["i"] for sample in reversed(batch)][:2] == [9, 8]
    with pytest.raises(IndexError):
        batch[10]
    with pytest.raises(IndexError):
        batch[-11]
    assert "10 samples" in repr(batch)


def test_samples_of_empty_structures_still_bound_indexing() -> None:
    batch = decode_samples([{} for _ in range(3)])
    assert isinstance(batch, SampleBatch)
    assert list(batch) == [{}, {}, {}]
    with pytest.raises(IndexError):
        batch[3]


def test_batch_of_plain_numbers() -> None:
    batch = decode_samples(list(range(100)))
    assert isinstance(batch, SampleBatch)
    assert list(batch) == list(range(100))
    batch = decode_samples([np.float64(value) for value in range(50)])
    assert [type(value) for value in batch] == [np.float64] * 50


def test_batch_object_dtype_is_refused() -> None:
    samples = [{"a": np.array([None, 1], dtype=object)} for _ in range(3)]
    with pytest.raises(ProtocolError, match=r"sample\['a'\]"):
        encode(Data(tags_for(3), samples))


def test_batch_with_big_int_names_the_path() -> None:
    samples = [{"n": 1}, {"n": 2**64}]
    with pytest.raises(ProtocolError, match=r"sample\['n'\].*sample 1 of 2"):
        encode(Data(tags_for(2), samples))


# --------------------------------------------------------------------------- tags


def test_read_tags_without_decoding() -> None:
    tags = np.array([[2, 10], [2, 11], [3, 0]], dtype=np.int64)
    frames = encode(Data(tags, small_samples(3)))
    got = read_tags(frames)
    assert got.dtype == np.dtype("<i8")
    assert got.tolist() == tags.tolist()


def test_replace_tags_keeps_samples_and_big_frames() -> None:
    samples = [{"image": np.full((64, 64), index, dtype=np.float32)} for index in range(4)]
    frames = encode(Data(tags_for(4), samples))
    new_tags = np.array([[7, 100], [7, 101], [7, 102], [7, 103]])
    replaced = replace_tags(frames, new_tags)
    assert replaced[0] is frames[0]
    assert all(a is b for a, b in zip(replaced[2:], frames[2:], strict=True))
    message = decode(replaced)
    assert isinstance(message, Data)
    assert message.tags.tolist() == new_tags.tolist()
    for expected, actual in zip(samples, message.samples, strict=True):
        assert_same(expected, actual)


def test_replace_tags_refuses_another_count() -> None:
    frames = encode(Data(tags_for(2), ["a", "b"]))
    with pytest.raises(ProtocolError, match="shape"):
        replace_tags(frames, tags_for(3))


def test_read_tags_refuses_other_messages() -> None:
    with pytest.raises(ProtocolError):
        read_tags(encode(Hello(client_id="x")))
    with pytest.raises(ProtocolError):
        read_tags([msgpack.packb({"v": 1, "k": 2}), b""])
    with pytest.raises(ProtocolError, match="whole number"):
        read_tags([encode(Data(tags_for(1), [1]))[0], b"123"])
    with pytest.raises(ProtocolError):
        read_tags([b"\xc1", b""])


def test_tags_and_sample_count_must_agree_on_decode() -> None:
    frames = encode(Data(tags_for(2), ["a", "b"]))
    with pytest.raises(ProtocolError, match="tags"):
        decode([frames[0], tags_for(3).tobytes()])


def test_stacked_leaves_go_into_the_memory_the_caller_gives_when_large_enough() -> None:
    made: list[np.ndarray] = []

    def allocate(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        made.append(np.empty(shape, dtype))
        return made[-1]

    large = [{"x": np.full(1 << 16, i, np.float32), "y": i} for i in range(4)]  # 256 KiB each
    small = [{"x": np.full(4, i, np.float32)} for i in range(4)]
    with stacking_into(allocate):
        batch = SampleBatch(stack_samples(large), 4)
        assert batch.stacked()["x"] is made[0] and (made[0][:, 0] == [0, 1, 2, 3]).all()
        SampleBatch(stack_samples(small), 4)  # under the threshold: numpy's memory
        assert len(made) == 1
        # Rows of two batches joined (a rank's rows of two messages) go there too.
        joined = take_samples([(batch, slice(0, 2)), (batch, slice(3, 4))])
        assert isinstance(joined, SampleBatch) and joined.stacked()["x"] is made[1]
        assert (made[1][:, 0] == [0, 1, 3]).all()
    SampleBatch(stack_samples(large), 4)  # outside the block: numpy's memory again
    assert len(made) == 2
