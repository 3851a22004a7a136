"""The tag frame of a data message: writing it, reading it, and rewriting it in place.

This module owns frame 1 of a data message: ``n`` rows of (epoch, position)
as raw little-endian int64. It lets a process that forwards data messages read
or replace the tags (:func:`read_tags`, :func:`replace_tags`) while the header
and array frames pass through untouched; it never unpacks a sample and never
copies an array frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol._compress import STORED, packed
from feedmux.protocol._ext import unpack_bounded
from feedmux.protocol._frames import TAG_FRAME, FrameLike, check_version, view
from feedmux.protocol._messages import Kind

__all__ = ["TAG_DTYPE", "encode_tags", "position_runs", "read_tags", "replace_tags",
           "tags_from_frame"]

#: The dtype of the tag frame (frame 1) of a data message: little-endian int64.
TAG_DTYPE = np.dtype("<i8")

# One tag is two int64: the epoch and the position in it.
_TAG_BYTES = 2 * TAG_DTYPE.itemsize


def encode_tags(tags: Any, count: int) -> bytes:
    """The tag frame of ``count`` samples; ``tags`` must be integers of shape ``(count, 2)``."""
    if type(tags) is np.ndarray and tags.dtype == TAG_DTYPE and tags.shape == (count, 2):
        return tags.tobytes()
    array = np.asarray(tags)
    if array.size == 0 and count == 0:
        return b""
    if array.dtype.kind not in "iu":
        raise ProtocolError(f"tags must be integers, got dtype {array.dtype}")
    if array.shape != (count, 2):
        raise ProtocolError(
            f"tags must have shape ({count}, 2) for {count} samples, got {array.shape}"
        )
    return array.astype(TAG_DTYPE, copy=False).tobytes()


def tags_from_frame(frame: memoryview | bytes, count: int | None) -> np.ndarray:
    """The writable ``(n, 2)`` tags in ``frame``; with ``count``, ``n`` must equal it."""
    if len(frame) % _TAG_BYTES:
        raise ProtocolError(f"tag frame of {len(frame)} bytes is not a whole number of tags")
    rows = len(frame) // _TAG_BYTES
    if count is not None and rows != count:
        raise ProtocolError(f"tag frame holds {rows} tags for {count} samples")
    buffer: memoryview | bytes | bytearray = frame
    if type(frame) is bytes or frame.readonly:  # type: ignore[union-attr]
        # Tags are small: a bytearray copy is the cheapest way to writable memory.
        buffer = bytearray(frame)
    tags: np.ndarray = np.ndarray((rows, 2), TAG_DTYPE, buffer)
    return tags


# What our encoder writes first in a data header: a fixmap, "v": 1, "k": 1.
_DATA_PREFIX = b"\xa1v\x01\xa1k" + bytes((Kind.DATA,))


def _stored_tags(header: dict[str, Any]) -> int:
    """The index of a compressed message's tags frame, which must be stored."""
    codecs = header["c"]
    if len(codecs) < 2 or codecs[TAG_FRAME] != STORED:
        raise ProtocolError("compressed message whose tags frame is not stored: inflate it")
    return TAG_FRAME + 1


def _check_data_header(header: memoryview | bytes) -> None:
    prefix = bytes(header[:7])
    if len(prefix) == 7 and 0x80 <= prefix[0] <= 0x8F and prefix[1:] == _DATA_PREFIX:
        return
    check_version(header)
    plain = unpack_bounded(header)
    if type(plain) is not dict or plain.get("k") != Kind.DATA or type(plain.get("k")) is not int:
        raise ProtocolError("not a data message")


def read_tags(frames: Sequence[FrameLike]) -> np.ndarray:
    """Return the ``(n, 2)`` int64 tags of a data message without decoding its samples (of
    a compressed one too: its tags frame is stored).

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, encode
    >>> frames = encode(Data(tags=np.array([[2, 5], [2, 6]]), samples=[1, 2]))
    >>> read_tags(frames).tolist()
    [[2, 5], [2, 6]]
    """
    try:
        if len(frames) < 2:
            raise ProtocolError("not a data message: no tag frame")
        header = packed(frames)
        if header is not None:
            return tags_from_frame(view(frames[_stored_tags(header)]), None)
        _check_data_header(view(frames[0]))
        return tags_from_frame(view(frames[TAG_FRAME]), None)
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"malformed message: {type(exc).__name__}: {exc}") from None


def replace_tags(frames: Sequence[FrameLike], tags: np.ndarray) -> list[Any]:
    """Return the frames of the same data message with ``tags`` in place of its tags.

    The header and array frames are passed through as they are (no copy).

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, encode
    >>> frames = encode(Data(tags=np.array([[1, 0]]), samples=["a"]))
    >>> read_tags(replace_tags(frames, np.array([[3, 9]]))).tolist()
    [[3, 9]]
    """
    old = read_tags(frames)
    new = encode_tags(tags, len(old))
    at = TAG_FRAME if packed(frames) is None else TAG_FRAME + 1  # the same size: n holds
    return [*frames[:at], new, *frames[at + 1:]]


def position_runs(tags: Any) -> list[tuple[int, int, int]]:
    """``(epoch, start, end)`` of each run of consecutive positions in ``tags`` (rows of
    one epoch's (epoch, position), as a data message's).

    >>> position_runs(np.array([[3, 4], [3, 5], [3, 9]]))
    [(3, 4, 6), (3, 9, 10)]
    """
    if not len(tags):
        return []
    epoch, positions = int(tags[0, 0]), tags[:, 1]
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    if not len(breaks):  # the usual message: one run (np.split costs ~40 µs a message)
        return [(epoch, int(positions[0]), int(positions[-1]) + 1)]
    starts = positions[np.concatenate(([0], breaks))].tolist()
    lasts = positions[np.concatenate((breaks - 1, [len(positions) - 1]))].tolist()
    return [(epoch, start, last + 1) for start, last in zip(starts, lasts, strict=True)]
