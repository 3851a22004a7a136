"""The delta filter of compressed frames: the strides chosen per array, and its inverse."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.protocol import Data, encode
from feedmux.protocol._delta import filtered, frame_strides, strides_for, unfilter

SETTINGS = settings(max_examples=int(os.environ.get("FEEDMUX_HYPOTHESIS_EXAMPLES", "150")),
                    deadline=None)


def strides_of(**arrays: np.ndarray) -> dict[str, tuple[int, ...]]:
    """Per array of one sample (each in its own frame), the strides the chooser picks."""
    names = list(arrays)
    frames = encode(Data(np.array([[1, 0]]), [arrays]), inline_threshold=0)
    found = frame_strides(frames[0])
    # Frames 2, 3, ... hold the arrays in the order the sample's dict lists them.
    return {name: found.get(2 + index, ()) for index, name in enumerate(names)}


def test_images_get_one_pixel_and_one_row() -> None:
    assert strides_of(rgb=np.zeros((16, 224, 224, 3), np.uint8),
                      rgba=np.zeros((64, 32, 4), np.uint16),
                      gray=np.zeros((128, 96, 1), np.int32)) == {
        "rgb": (3, 672), "rgba": (8, 256), "gray": (4, 384)}


def test_two_dimensional_integers_get_one_item_and_one_row() -> None:
    assert strides_of(plane=np.zeros((480, 640), np.uint16),
                      stack=np.zeros((8, 64, 50), np.uint8),
                      signed=np.zeros((100, 30), np.int64)) == {
        "plane": (2, 1280), "stack": (1, 50), "signed": (8, 240)}


def test_floats_bools_one_dimension_and_structures_get_none() -> None:
    assert strides_of(floats=np.zeros((16, 224, 224, 3), np.float32),
                      halves=np.zeros((64, 64), np.float16),
                      flags=np.zeros((64, 64), bool),
                      line=np.zeros(4096, np.uint8),
                      records=np.zeros((32, 32), [("a", "<u2"), ("b", "<u2")])) == dict.fromkeys(
        ("floats", "halves", "flags", "line", "records"), ())


def test_a_stacked_batch_leaf_is_described_with_its_batch_dimension() -> None:
    samples = [{"image": np.zeros((20, 30, 3), np.uint8), "label": index} for index in range(4)]
    frames = encode(Data(np.array([[1, i] for i in range(4)]), samples), inline_threshold=0)
    assert frame_strides(frames[0]) == {2: (3, 90)}


def test_a_single_row_gets_no_row_stride_and_what_is_not_a_header_gets_none() -> None:
    assert strides_for("|u1", [1, 40, 3]) == (3,)
    assert strides_for("|u1", [1, 1, 3]) == ()
    assert strides_for("|u1", [0, 40, 3]) == ()
    assert frame_strides(b"\xc1 not msgpack") == {}
    assert frame_strides(encode(Data(np.array([[1, 0]]), [{"y": 3}]))[0]) == {}


@SETTINGS
@given(st.binary(min_size=1, max_size=600), st.lists(st.integers(1, 8), max_size=4))
def test_unfilter_undoes_filtered(data: bytes, factors: list[int]) -> None:
    # Strides that divide the length, as the decoder requires.
    length = len(data) - len(data) % 24 or len(data)
    data = data[:length]
    strides = [stride for stride in factors if length % stride == 0]
    buffer = bytearray(filtered(data, strides).tobytes())
    unfilter(buffer, strides)
    assert bytes(buffer) == data


def test_filtered_leaves_its_input_alone() -> None:
    data = bytearray(range(12))
    out = filtered(data, [1, 4])
    assert bytes(data) == bytes(range(12)) and out.tolist()[:6] == [0, 1, 1, 1, 1, 0]


@pytest.mark.parametrize("strides", [[3], [3, 672], [672, 3]])
def test_the_order_of_the_strides_is_undone_in_reverse(strides: list[int]) -> None:
    image = np.random.default_rng(3).integers(0, 256, (4, 224, 224, 3), dtype=np.uint8)
    buffer = bytearray(filtered(image.tobytes(), strides).tobytes())
    unfilter(buffer, strides)
    assert bytes(buffer) == image.tobytes()
