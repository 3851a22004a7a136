"""The server makes a drawn torch tensor its own as it does an array: copied as drawn."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from feedmux.server._sources.owning import DrawnItems, own  # noqa: E402


def test_a_tensor_is_owned_as_a_numpy_copy_so_a_reused_buffer_cannot_change_it() -> None:
    buffer = torch.zeros(3)
    sample = own((buffer, 1))
    buffer += 5
    assert type(sample[0]) is np.ndarray and sample[0].tolist() == [0.0] * 3


def test_tensors_drawn_in_a_chunk_become_arrays_the_codec_stacks() -> None:
    buffer = torch.zeros(2)
    drawn = DrawnItems()
    hook = drawn.start()
    items = []
    for index in range(3):
        buffer.fill_(index)
        items.append(hook({"x": buffer, "i": index}))
    samples = drawn.samples(items)
    assert [(sample["x"].tolist(), sample["i"]) for sample in samples] == [
        ([float(index)] * 2, index) for index in range(3)]


def test_a_tensor_that_cannot_travel_is_left_for_the_codec_to_refuse() -> None:
    sparse = torch.ones(2).to_sparse()
    assert own({"x": sparse})["x"] is sparse
