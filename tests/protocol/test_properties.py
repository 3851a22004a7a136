"""Property-based round trips: random trees, dtypes, shapes, memory layouts and batches."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedmux.protocol import Data, SampleBatch, decode, encode, take_samples
from tests.protocol.trees import assert_same

SETTINGS = settings(
    max_examples=int(os.environ.get("FEEDMUX_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------- dtypes

BYTE_ORDERS = st.sampled_from("<>")
UNITS = st.sampled_from(
    [
        "",
        "[Y]",
        "[M]",
        "[W]",
        "[D]",
        "[h]",
        "[m]",
        "[s]",
        "[ms]",
        "[us]",
        "[ns]",
        "[ps]",
        "[fs]",
        "[as]",
        "[25s]",
        "[3ms]",
    ]
)


def simple_dtypes() -> st.SearchStrategy[np.dtype[Any]]:
    numeric = st.builds(
        lambda order, code: np.dtype(order + code),
        BYTE_ORDERS,
        st.sampled_from(
            ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16", "b1"]
        ),
    )
    native_long = st.sampled_from([np.dtype(np.longdouble), np.dtype(np.clongdouble)])
    times = st.builds(
        lambda order, kind, unit: np.dtype(f"{order}{kind}8{unit}"),
        BYTE_ORDERS,
        st.sampled_from("mM"),
        UNITS,
    )
    strings = st.builds(
        lambda order, kind, size: np.dtype(f"{order}{kind}{size}"),
        BYTE_ORDERS,
        st.sampled_from("SUV"),
        st.integers(1, 9),
    )
    return st.one_of(numeric, native_long, times, strings)


@st.composite
def structured_dtypes(draw: st.DrawFn, depth: int = 0) -> np.dtype[Any]:
    count = draw(st.integers(1, 4))
    names = draw(
        st.lists(
            st.text("abcxyz_", min_size=1, max_size=4), min_size=count, max_size=count, unique=True
        )
    )
    formats: list[np.dtype[Any]] = []
    for _ in names:
        if depth < 2 and draw(st.booleans()) and draw(st.booleans()):
            field = draw(structured_dtypes(depth + 1))
        else:
            field = draw(simple_dtypes())
        if draw(st.integers(0, 4)) == 0:
            shape = tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=2)))
            field = np.dtype((field, shape))
        formats.append(field)
    layout = draw(st.sampled_from(["packed", "aligned", "padded"]))
    if layout == "packed":
        return np.dtype(list(zip(names, formats, strict=True)))
    if layout == "aligned":
        return np.dtype(list(zip(names, formats, strict=True)), align=True)
    offsets, position = [], 0
    for field in formats:
        position += draw(st.integers(0, 5))
        offsets.append(position)
        position += field.itemsize
    order = draw(st.permutations(range(count)))  # offsets need not follow field order
    return np.dtype(
        {
            "names": [names[i] for i in order],
            "formats": [formats[i] for i in order],
            "offsets": [offsets[i] for i in order],
            "itemsize": position + draw(st.integers(0, 7)),
        }
    )


DTYPES = st.one_of(simple_dtypes(), simple_dtypes(), structured_dtypes())
SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)


def random_array(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> np.ndarray:
    """An array of ``dtype`` with random bytes: every bit pattern must travel exactly."""
    count = int(np.prod(shape))
    raw = np.random.default_rng(seed).integers(0, 256, size=dtype.itemsize * count, dtype=np.uint8)
    array = np.frombuffer(raw.tobytes(), dtype=dtype, count=count).reshape(shape).copy()
    _valid_text(array, seed)
    return array


def _valid_text(array: np.ndarray, seed: int) -> None:
    """Random bytes are mostly not code points: give unicode fields real text."""
    if array.dtype.names is not None:
        for name in array.dtype.names:
            _valid_text(array[name], seed)
    elif array.dtype.kind == "U":
        text = "aé✓\U0001f600zq"[seed % 3 :]
        array[...] = text[: array.dtype.itemsize // 4]


@st.composite
def laid_out(draw: st.DrawFn, array: np.ndarray) -> np.ndarray:
    """The same kind of array in another memory layout: Fortran, strided, reversed."""
    layout = draw(st.sampled_from(["c", "fortran", "strided", "reversed", "transposed"]))
    if layout == "fortran":
        return np.asfortranarray(array)
    if array.ndim == 0:
        return array
    if layout == "strided":
        wide = np.repeat(array, 2, axis=0)
        return wide[::2]
    if layout == "reversed":
        axis = draw(st.integers(0, array.ndim - 1))
        return np.flip(array, axis=axis)
    if layout == "transposed":
        return array.T
    return array


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    array = random_array(draw(DTYPES), draw(SHAPES), draw(st.integers(0, 2**32 - 1)))
    return draw(laid_out(array))


@st.composite
def numpy_scalars(draw: st.DrawFn) -> np.generic:
    array = random_array(draw(DTYPES), (1,), draw(st.integers(0, 2**32 - 1)))
    return array[0]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- trees

PLAIN = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
KEYS = st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1))
LEAVES = st.one_of(PLAIN, PLAIN, numpy_scalars(), arrays())
TREES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(KEYS, children, max_size=4),
    ),
    max_leaves=12,
)


def tags_for(count: int) -> np.ndarray:
    return np.stack([np.ones(count), np.arange(count)], axis=1).astype(np.int64)


def round_trip_message(samples: list[Any], threshold: int, writable: bool) -> Data:
    frames = encode(Data(tags_for(len(samples)), samples), inline_threshold=threshold)
    convert = bytearray if writable else bytes
    message = decode([convert(frame) for frame in frames])
    assert isinstance(message, Data)
    assert len(message.samples) == len(samples)
    return message


THRESHOLDS = st.sampled_from([0, 16, 1024, 1 << 30])


@pytest.mark.timeout(60)
@SETTINGS
@given(sample=TREES, threshold=THRESHOLDS, writable=st.booleans())
def test_any_tree_round_trips(sample: Any, threshold: int, writable: bool) -> None:
    message = round_trip_message([sample], threshold, writable)
    assert_same(sample, message.samples[0])


@pytest.mark.timeout(60)
@SETTINGS
@given(array=arrays(), threshold=THRESHOLDS, writable=st.booleans())
def test_any_array_round_trips_writable(array: np.ndarray, threshold: int, writable: bool) -> None:
    message = round_trip_message([{"a": array}], threshold, writable)
    back = message.samples[0]["a"]
    assert_same(array, back)
    assert back.flags.writeable


@pytest.mark.timeout(60)
@SETTINGS
@given(samples=st.lists(TREES, min_size=0, max_size=5), threshold=THRESHOLDS)
def test_heterogeneous_messages_round_trip(samples: list[Any], threshold: int) -> None:
    message = round_trip_message(samples, threshold, writable=True)
    for expected, actual in zip(samples, message.samples, strict=True):
        assert_same(expected, actual)


# --------------------------------------------------------------------------- stacked batches


@st.composite
def structures(draw: st.DrawFn, depth: int = 0) -> Any:
    """A sample structure: containers with leaf specs the samples of one batch share."""
    if depth < 3 and draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(["dict", "list", "tuple"]))
        children = draw(st.lists(structures(depth + 1), max_size=3))
        if kind == "dict":
            keys = draw(st.lists(KEYS, min_size=len(children), max_size=len(children), unique=True))
            return ("dict", list(zip(keys, children, strict=True)))
        return (kind, children)
    leaf = draw(st.sampled_from(["array", "scalar", "plain"]))
    if leaf == "array":
        return (
            "array",
            draw(DTYPES),
            draw(SHAPES),
            draw(st.sampled_from(["c", "fortran", "reversed"])),
        )
    if leaf == "scalar":
        return ("scalar", draw(DTYPES))
    return ("plain",)


def fill(structure: Any, draw: st.DrawFn) -> Any:
    kind = structure[0]
    if kind == "dict":
        return {key: fill(child, draw) for key, child in structure[1]}
    if kind == "list":
        return [fill(child, draw) for child in structure[1]]
    if kind == "tuple":
        return tuple(fill(child, draw) for child in structure[1])
    seed = draw(st.integers(0, 2**32 - 1))
    if kind == "array":
        array = random_array(structure[1], structure[2], seed)
        if structure[3] == "fortran":
            return np.asfortranarray(array)
        if structure[3] == "reversed" and array.ndim:
            return array[::-1]
        return array
    if kind == "scalar":
        return random_array(structure[1], (1,), seed)[0]
    return draw(PLAIN)


def stackable(structure: Any) -> bool:
    kind = structure[0]
    if kind == "dict":
        return all(stackable(child) for _, child in structure[1])
    if kind in ("list", "tuple"):
        return all(stackable(child) for child in structure[1])
    # A str/bytes scalar's dtype follows its content, so such samples may differ.
    return not (kind == "scalar" and structure[1].kind in "SU")


@st.composite
def batches(draw: st.DrawFn) -> tuple[Any, list[Any]]:
    structure = draw(structures())
    count = draw(st.integers(2, 12))
    return structure, [fill(structure, draw) for _ in range(count)]


@pytest.mark.timeout(60)
@SETTINGS
@given(batch=batches(), threshold=THRESHOLDS, writable=st.booleans())
def test_stacked_batches_round_trip(
    batch: tuple[Any, list[Any]], threshold: int, writable: bool
) -> None:
    structure, samples = batch
    message = round_trip_message(samples, threshold, writable)
    if stackable(structure):
        assert isinstance(message.samples, SampleBatch)
        message.samples.stacked()
    for expected, actual in zip(samples, message.samples, strict=True):
        assert_same(expected, actual)
    for index in (0, -1, len(samples) // 2):
        assert_same(samples[index], message.samples[index])


ROWS = st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(1, 4)).map(
    lambda bounds: slice(*bounds))


def frame_bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(frame) for frame in frames]


def padded(node: Any) -> bool:
    """Whether ``node`` holds dtypes with padding bytes (fields, long doubles): those
    bytes are no data, and a value rebuilt on the way may fill them anew."""
    if isinstance(node, dict):
        return any(padded(value) for value in node.values())
    if isinstance(node, (list, tuple)):
        return any(padded(value) for value in node)
    if isinstance(node, (np.ndarray, np.generic)):
        dtype = node.dtype.subdtype[0] if node.dtype.subdtype else node.dtype
        return dtype.names is not None or dtype.type in (np.longdouble, np.clongdouble)
    return False


@pytest.mark.timeout(60)
@SETTINGS
@given(batch=batches(), threshold=THRESHOLDS, selection=st.lists(ROWS, min_size=1, max_size=3))
def test_rows_taken_from_decoded_batches_encode_as_those_samples_would(
    batch: tuple[Any, list[Any]], threshold: int, selection: list[slice]
) -> None:
    """A server passing rows of received batches on (slices, joined across messages)
    sends the very bytes it would send had it built the samples and encoded them."""
    _, samples = batch
    first = round_trip_message(samples, threshold, writable=True).samples
    second = round_trip_message(samples, threshold, writable=False).samples
    parts = [(first if index % 2 else second, rows) for index, rows in enumerate(selection)]
    taken = take_samples(parts)
    expected = [sample for rows in selection for sample in samples[rows]]
    if isinstance(first, SampleBatch) and len(selection) == 1:
        assert isinstance(taken, SampleBatch)
    assert len(taken) == len(expected)
    tags = tags_for(len(expected))
    if expected and padded(expected[0]):
        decode(encode(Data(tags, taken), inline_threshold=threshold))
        return  # equal values; padding bytes may differ
    if type(taken) is SampleBatch and len(taken) < 2:
        # A stacked batch stays a batch on the wire even with one row or none (a trainer
        # asking for batches gets one): compared as the samples it decodes to.
        taken = list(decode(encode(Data(tags, taken), inline_threshold=threshold)).samples)
    assert frame_bytes(encode(Data(tags, taken), inline_threshold=threshold)) == frame_bytes(
        encode(Data(tags, expected), inline_threshold=threshold))
    for want, got in zip(expected, taken, strict=True):
        assert_same(want, got)
