"""The frame layout of a multipart message, and the version check of its header.

This module owns what every part of the codec agrees on about frames: what a
frame given to the decoder may be (:data:`FrameLike`), how it is read as bytes
without a copy, where the tags and the first array frame sit, and how a header
that our encoder did not lay out is checked for its protocol version before
anything else in it is read. It never imports zmq (a zmq ``Frame`` is read
through its ``.buffer`` attribute) and never interprets a header beyond ``"v"``.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from feedmux.errors import ProtocolError, VersionMismatchError
from feedmux.protocol._ext import unpack_bounded
from feedmux.protocol._messages import PROTOCOL_VERSION

__all__ = [
    "FIRST_ARRAY_FRAME",
    "TAG_FRAME",
    "FrameLike",
    "check_version",
    "short",
    "version_mismatch",
    "view",
]

#: What a frame given to :func:`decode` may be: ``bytes``, ``bytearray``, ``memoryview``,
#: any object with the buffer protocol, or a zmq ``Frame`` (read through its writable
#: ``.buffer``). Typed loosely so that pyzmq's own types pass.
FrameLike: TypeAlias = Any

# The frame index of the tags of a data message, and of its first array frame.
TAG_FRAME = 1
FIRST_ARRAY_FRAME = 2


def view(frame: Any) -> memoryview | bytes:
    """``frame`` as flat bytes: itself if it is ``bytes``, else a byte memoryview of it."""
    if type(frame) is bytes:
        return frame
    buffer = getattr(frame, "buffer", None)  # a zmq.Frame: its .buffer is writable
    view = memoryview(buffer if isinstance(buffer, memoryview) else frame)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def short(value: Any) -> str:
    """``repr(value)`` cut to 80 characters, for error messages about wire values."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def version_mismatch(version: Any) -> VersionMismatchError:
    """The error for a header of version ``version``, naming both versions."""
    return VersionMismatchError(
        f"expected protocol version {PROTOCOL_VERSION}, got {short(version)}"
    )


def check_version(header: memoryview | bytes) -> None:
    """Read the version of a header not laid out by our encoder; raise unless it is ours."""
    plain = unpack_bounded(header)
    if type(plain) is not dict or "v" not in plain:
        raise ProtocolError("header is not a msgpack map with a protocol version 'v'")
    version = plain["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise version_mismatch(version)
