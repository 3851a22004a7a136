"""Torch CPU tensors in samples: they travel as arrays (no copy) and arrive as numpy arrays.

What cannot travel (a GPU, sparse or bfloat16 tensor, a PIL image) is refused at
the sender with the fix in the message. feedmux never imports torch itself.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import msgpack
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from feedmux.errors import ProtocolError  # noqa: E402
from feedmux.protocol import Data, decode, encode, is_tensor, tensor_array  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def round_trip(*samples: Any) -> list[Any]:
    tags = np.array([[1, position] for position in range(len(samples))], dtype=np.int64)
    message = decode(encode(Data(samples=list(samples), tags=tags, server_id="s", seq=0)))
    assert isinstance(message, Data)
    return list(message.samples)


def test_a_tensor_arrives_as_the_numpy_array_of_its_values() -> None:
    image = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    [(values, label)] = round_trip((image, 3))
    assert type(values) is np.ndarray and values.dtype == np.float32
    assert values.shape == (2, 3, 4) and np.array_equal(values, image.numpy())
    assert label == 3
    [sample] = round_trip({"x": torch.tensor(7), "mask": torch.tensor([True, False])})
    assert sample["x"].shape == () and int(sample["x"]) == 7
    assert sample["mask"].dtype == np.bool_ and sample["mask"].tolist() == [True, False]


def test_tensors_of_several_samples_are_stacked_like_arrays() -> None:
    samples = [(torch.full((5,), float(index)), index) for index in range(4)]
    tags = np.array([[1, position] for position in range(4)], dtype=np.int64)
    frames = encode(Data(samples=samples, tags=tags, server_id="s", seq=0))
    assert "batch" in msgpack.unpackb(frames[0], strict_map_key=False)  # one stacked leaf
    decoded = round_trip(*samples)
    assert [(values.tolist(), label) for values, label in decoded] == [
        ([float(index)] * 5, index) for index in range(4)]


def test_a_large_tensor_is_sent_from_its_own_memory() -> None:
    tensor = torch.ones(1 << 16, dtype=torch.float32)  # 256 KiB: a frame of its own
    tags = np.array([[1, 0]], dtype=np.int64)
    frames = encode(Data(samples=[{"x": tensor}], tags=tags, server_id="s", seq=0))
    address = np.frombuffer(frames[2], dtype=np.uint8).__array_interface__["data"][0]
    assert address == tensor.data_ptr()  # no copy: the frame views the tensor


@pytest.mark.parametrize("make", [
    lambda base: base.T,  # transposed
    lambda base: base[:, ::2],  # strided
    lambda base: base[0].expand(4, 6),  # a zero stride
], ids=["transposed", "strided", "expanded"])
def test_a_non_contiguous_tensor_arrives_with_its_values(make: Any) -> None:
    base = torch.arange(24, dtype=torch.int64).reshape(4, 6)
    view = make(base)
    assert not view.is_contiguous()
    [(values,)] = round_trip((view,))
    assert values.shape == tuple(view.shape) and np.array_equal(values, view.numpy())


def test_a_tensor_that_requires_grad_is_detached() -> None:
    # The graph cannot cross a process: the values travel (feedmux.protocol._tensors says why).
    weights = torch.nn.Parameter(torch.ones(3))
    computed = weights * 2
    assert computed.requires_grad
    [sample] = round_trip({"w": weights, "y": computed})
    assert sample["w"].tolist() == [1.0] * 3 and sample["y"].tolist() == [2.0] * 3
    assert tensor_array(computed).ctypes.data == computed.data_ptr()  # detached: no copy


def test_a_conjugate_view_arrives_resolved() -> None:
    values = torch.tensor([1 + 2j, 3 - 1j])
    [(received,)] = round_trip((values.conj(),))
    assert received.tolist() == [1 - 2j, 3 + 1j]


@pytest.mark.parametrize("tensor, fix", [
    (lambda: torch.ones(2, dtype=torch.bfloat16), r"dtype torch.bfloat16.*tensor.float\(\)"),
    (lambda: torch.ones(2).to_sparse(), r"layout torch.sparse_coo.*tensor.to_dense\(\)"),
    (lambda: torch.empty(2, device="meta"), r"on meta: expected a CPU tensor.*tensor.cpu\(\)"),
], ids=["bfloat16", "sparse", "not-on-the-cpu"])
def test_a_tensor_that_cannot_travel_is_refused_with_the_fix(tensor: Any, fix: str) -> None:
    with pytest.raises(ProtocolError, match=r"sample\['x'\]: a torch tensor .*" + fix):
        round_trip({"x": tensor()})


def test_a_pil_image_is_refused_with_np_asarray_as_the_fix() -> None:
    # Named and placed as PIL's (PIL is not a dependency): the hint goes by the class.
    image_class = type("Image", (), {"__module__": "PIL.Image"})
    png = type("PngImageFile", (image_class,), {"__module__": "PIL.PngImagePlugin"})
    with pytest.raises(ProtocolError, match=r"sample\[0\]: unsupported type "
                                            r"PIL.PngImagePlugin.PngImageFile: use "
                                            r"np.asarray\(image\); a sample holds"):
        round_trip((png(), 1))


def test_any_other_type_is_refused_saying_what_came_and_what_may() -> None:
    with pytest.raises(ProtocolError, match=r"sample\['k'\]: unsupported type builtins.object: "
                                            r"a sample holds dicts, .* torch CPU tensors"):
        round_trip({"k": object()})


def test_is_tensor_tells_tensors_from_look_alikes() -> None:
    assert is_tensor(torch.ones(1)) and is_tensor(torch.nn.Parameter(torch.ones(1)))
    assert not is_tensor(np.ones(1)) and not is_tensor(torch.float32)
    assert not is_tensor(type("Tensor", (), {"__module__": "torch"})())


def test_importing_feedmux_never_imports_torch() -> None:
    code = (
        "import sys, numpy as np\n"
        "import feedmux, feedmux.protocol, feedmux.sampling, feedmux.server.server\n"
        "import feedmux.client.remote, feedmux.apps.cli\n"
        "from feedmux.protocol import Data, decode, encode\n"
        "stream = feedmux.from_dataset([(np.ones(2), 1)], random_state=0)\n"
        "tags = np.array([[1, 0]], dtype=np.int64)\n"
        "decode(encode(Data(samples=list(stream), tags=tags, server_id='s', seq=0)))\n"
        "assert 'torch' not in sys.modules, 'feedmux imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, done.stderr
