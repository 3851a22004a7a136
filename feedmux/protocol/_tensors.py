"""Torch tensors in samples: told apart, and viewed as numpy arrays, without importing torch.

A sample may hold torch CPU tensors wherever it may hold a numpy array; they
travel as arrays (``tensor.numpy()`` shares the tensor's memory: no copy) and
arrive as numpy arrays (``RemoteDataset`` makes tensors of them again). This
module owns that recognition and that view, and the hint that goes with a
value that cannot travel (a PIL image: ``np.asarray(image)``). It must never
import torch: a tensor exists only when the user's code imported torch, so
``sys.modules`` says where to look.

Why a tensor that requires grad is detached rather than refused: the autograd
graph cannot cross a process boundary in any case (the trainer's backward
pass could never reach the server's graph), so the values are all a sample
can mean; a dataset that computes features with a model outside ``no_grad()``
would otherwise fail only once served. Detaching shares memory too.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from feedmux.errors import ProtocolError

__all__ = ["TensorError", "is_tensor", "tensor_array", "unsupported_hint"]


class TensorError(ProtocolError):
    """A torch tensor that cannot travel as a numpy array (on a GPU, sparse, bfloat16...)."""


def is_tensor(value: object) -> bool:
    """Whether ``value`` is a torch tensor (a subclass such as ``Parameter`` too).

    Only a type defined in a ``torch`` module can be one, and only once torch is
    imported; neither check imports it.

    >>> is_tensor(np.zeros(2)), is_tensor([1])
    (False, False)
    """
    module = type(value).__module__
    if not (module == "torch" or module.startswith("torch.")):
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_array(tensor: Any) -> np.ndarray:
    """The numpy array viewing a torch CPU tensor's memory (no copy), any strides kept.

    A tensor that requires grad is detached (the module's docstring says why);
    a conjugate or negative view is resolved first (one copy, as torch makes).

    Raises
    ------
    TensorError
        For a tensor not on the CPU, not strided (sparse), or of a dtype numpy
        lacks (bfloat16, quantized), saying what to change.
    """
    torch = sys.modules["torch"]
    device = tensor.device
    if device.type != "cpu":
        raise TensorError(
            f"a torch tensor on {device}: expected a CPU tensor (call tensor.cpu() in the "
            "dataset; the trainer moves the batch to its device)")
    if tensor.layout is not torch.strided:
        raise TensorError(
            f"a torch tensor of layout {tensor.layout}: expected a dense (strided) tensor "
            "(call tensor.to_dense())")
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    try:
        array: np.ndarray = tensor.numpy()
    except (TypeError, RuntimeError) as error:
        raise TensorError(
            f"a torch tensor of dtype {tensor.dtype}, which numpy has no dtype for ({error}): "
            "convert it (tensor.float(), or tensor.view(torch.int16) to keep the bits)"
        ) from None
    return array


#: Fixes for values that cannot travel, by the type's module and name.
_HINTS = {
    ("PIL.Image", "Image"): "use np.asarray(image)",
    ("pandas.core.frame", "DataFrame"): "use frame.to_numpy(), or a dict of its columns",
    ("pandas.core.series", "Series"): "use series.to_numpy()",
    ("decimal", "Decimal"): "use float(value) or str(value)",
    ("datetime", "datetime"): "use value.isoformat(), or np.datetime64(value)",
}


def unsupported_hint(value: object) -> str:
    """What to do with ``value``, a type a sample cannot hold ("" when there is nothing to say).

    >>> import decimal
    >>> unsupported_hint(decimal.Decimal(1))
    'use float(value) or str(value)'
    """
    for kind in type(value).__mro__:
        hint = _HINTS.get((kind.__module__, kind.__name__))
        if hint is not None:
            return hint
    if hasattr(value, "__array__"):
        return "use np.asarray(value)"
    return ""
