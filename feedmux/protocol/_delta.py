"""Byte-delta filters of compressed frames: which strides suit an array, applying and undoing them.

A photograph's neighbouring pixels are close, not equal, so a fast compressor finds few
repeats in its bytes (zstd at level 1 keeps ~0.8 of them); each byte minus the byte one
pixel to its left, then minus the byte one row above (uint8, wrapping), leaves small
numbers that zstd's entropy coder packs to ~0.54. A filter is a list of byte *strides*,
applied in order to a frame's bytes as one flat run (``out[i] = in[i] - in[i - stride]``
for ``i >= stride``); the decoder undoes them in reverse order, in place, without knowing
what the frame holds: only that each stride divides the frame's length.

This module owns that transform and the rule that picks the strides from the inner
Data header's description of each array frame (:func:`frame_strides`): integer arrays
only (a float's bytes are not a smooth signal), ``(..., H, W, C)`` with at most
:data:`MAX_CHANNELS` channels gets one pixel and one row, ``(..., H, W)`` one item and one
row. It never decides whether a message is compressed or with which codec
(:mod:`feedmux.protocol._compress` does) and never reads a frame it did not pick.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedmux.protocol._ext import EXT_ARRAY_FRAME, EXT_STACKED_ARRAY, unpack_bounded

__all__ = ["MAX_CHANNELS", "MAX_FILTERS", "MAX_STRIDE", "filtered", "frame_strides",
           "strides_for", "unfilter"]

#: An array whose last dimension is at most this is read as pixels of that many channels.
MAX_CHANNELS = 4
#: The most strides one frame may list (the compressor writes two at most).
MAX_FILTERS = 4
#: The longest stride accepted (a row of 4096 pixels of 4 channels of 8 bytes is 128 KiB).
MAX_STRIDE = 1 << 24
_INTEGER = re.compile(r"[<>|=][iu]([1248])")


def strides_for(description: Any, shape: Sequence[int]) -> tuple[int, ...]:
    """The strides that suit an array of dtype ``description`` (its wire form) and
    ``shape``: none unless it holds integers in rows.

    Examples
    --------
    >>> strides_for("|u1", [16, 224, 224, 3]), strides_for("<u2", [480, 640])
    ((3, 672), (2, 1280))
    >>> strides_for("<f4", [16, 224, 224, 3]), strides_for("<i8", [4096])
    ((), ())
    """
    match = _INTEGER.fullmatch(description) if isinstance(description, str) else None
    if match is None or len(shape) < 2:
        return ()
    itemsize = int(match.group(1))
    if len(shape) >= 3 and shape[-1] <= MAX_CHANNELS:  # (..., H, W, C): pixels of C items
        pixel = shape[-1] * itemsize
        row = shape[-2] * pixel
    else:  # (..., H, W): rows of W items
        pixel, row = itemsize, shape[-1] * itemsize
    total = itemsize * int(np.prod(shape, dtype=np.int64))
    return tuple(stride for stride in (pixel, row)
                 if 0 < stride < total and stride <= MAX_STRIDE)


def frame_strides(header: Any) -> dict[int, tuple[int, ...]]:
    """Per array frame of an encoded Data message (``header`` its frame 0), the strides
    that suit it (:func:`strides_for`); frames that suit none are left out."""
    found: dict[int, tuple[int, ...]] = {}

    def hook(code: int, data: bytes) -> Any:
        if code == EXT_STACKED_ARRAY:  # a packed ext 1 or 2: the stacked leaf of a batch
            return unpack_bounded(data, hook)
        if code == EXT_ARRAY_FRAME:
            description, shape, index = unpack_bounded(data)
            strides = strides_for(description, shape)
            if strides:
                found[index] = strides
        return None

    try:
        unpack_bounded(memoryview(header).cast("B"), hook)
    except Exception:  # not a header of ours: nothing is filtered
        return {}
    return found


def filtered(data: Any, strides: Sequence[int]) -> np.ndarray:
    """``data``'s bytes with each of ``strides`` subtracted in turn (a new array).

    Examples
    --------
    >>> filtered(bytes([10, 11, 12, 13]), [1]).tolist()
    [10, 1, 1, 1]
    """
    out = np.frombuffer(data, np.uint8)
    for stride in strides:
        source, out = out, np.empty_like(out)
        out[:stride] = source[:stride]
        np.subtract(source[stride:], source[:-stride], out=out[stride:])
    return out


def unfilter(buffer: bytearray, strides: Sequence[int]) -> None:
    """Undo :func:`filtered` in ``buffer`` itself (each stride divides its length).

    Examples
    --------
    >>> buffer = bytearray(filtered(bytes(range(8)), [2, 4]).tobytes())
    >>> unfilter(buffer, [2, 4]); list(buffer)
    [0, 1, 2, 3, 4, 5, 6, 7]
    """
    data = np.frombuffer(buffer, np.uint8)
    for stride in reversed(strides):
        rows = data.reshape(-1, stride)
        np.cumsum(rows, axis=0, dtype=np.uint8, out=rows)
