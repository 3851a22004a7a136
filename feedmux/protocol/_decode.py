"""Decoding frames into messages (wire format v1, the receiving side).

This module owns reading what a peer sent: the limits a message must respect
before anything in it is trusted, the header with its ext values (arrays as
views of the received frames where they are writable), control messages
through their field checks, and data messages with their tags and samples or
stacked batch. It is sans-IO and it never unpickles anything: every value read
from the wire is checked against the format before it is used, and anything
malformed raises :class:`~feedmux.errors.ProtocolError`, whatever the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol._batch import ARRAY, COLUMN, SCALAR, SampleBatch, StackedLeaf
from feedmux.protocol._compress import COMPRESSED, inflate
from feedmux.protocol._dtypes import dtype_from_description, shape_from_description
from feedmux.protocol._ext import (
    EXT_ARRAY_FRAME,
    EXT_ARRAY_INLINE,
    EXT_COLUMN,
    EXT_SCALAR,
    EXT_STACKED_ARRAY,
    EXT_STACKED_SCALAR,
    EXT_TUPLE,
    TUPLE_MARK,
    no_ext,
    split_meta,
    unpack_bounded,
)
from feedmux.protocol._fields import CONTROL_BY_KIND, INT_MAX, INT_MIN
from feedmux.protocol._frames import (
    FIRST_ARRAY_FRAME,
    TAG_FRAME,
    FrameLike,
    check_version,
    short,
    version_mismatch,
    view,
)
from feedmux.protocol._messages import PROTOCOL_VERSION, Data, Kind, Message
from feedmux.protocol._tags import tags_from_frame

__all__ = ["CONTROL_LIMITS", "DEFAULT_LIMITS", "Limits", "Resolver", "decode"]

_DATA = int(Kind.DATA)

#: ``resolve(frame, nbytes)``: the memory an array frame refers to, or the frame itself.
Resolver = Callable[[Any, int], Any]



@dataclass(frozen=True)
class Limits:
    """Bounds a decoder enforces before it trusts a message.

    Examples
    --------
    >>> Limits(max_header_bytes=1024).max_header_bytes
    1024
    """

    #: Largest frame 0 (the msgpack header), inline arrays included.
    max_header_bytes: int = 64 * 1024 * 1024
    #: Most frames in one message (header and tags included).
    max_frames: int = 4096
    #: Most bytes in all frames of one message together.
    max_message_bytes: int = 2 * 1024 * 1024 * 1024
    #: Most elements one msgpack array or map of the header may declare (msgpack
    #: allocates a declared array before reading it); None: the header's size.
    max_container_len: int | None = 1 << 20
    #: Most arrays and maps in the whole header together. msgpack's own limits are
    #: per container: a header of N bytes of ``0x80`` is N empty maps (about 64 bytes
    #: of memory each), so without a total a 10 MiB header costs 700 MiB.
    max_containers: int = 1 << 20


DEFAULT_LIMITS = Limits()
#: What a control message (and a credit or acknowledgement) may be: one small frame.
#: Nothing a peer sends on these sockets legitimately comes near.
CONTROL_LIMITS = Limits(
    max_header_bytes=64 * 1024, max_frames=1, max_message_bytes=64 * 1024,
    max_container_len=8192, max_containers=4096,
)

_meta_cache: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], int, int]] = {}
_scalar_cache: dict[bytes, np.dtype[Any]] = {}


def _array_layout(
    description: Any, shape_description: Any
) -> tuple[np.dtype[Any], tuple[int, ...], int, int]:
    dtype = dtype_from_description(description)
    shape = shape_from_description(shape_description)
    count = math.prod(shape)
    return dtype, shape, count, count * dtype.itemsize


class _Decoding:
    """State of one decode call: the frames, which of them arrays used, open markers."""

    __slots__ = ("containers", "frames", "leaves", "open_tuples", "resolve", "used",
                 "used_frames")

    def __init__(self, frames: list[memoryview | bytes], max_containers: int,
                 resolve: Resolver | None) -> None:
        self.frames = frames
        self.resolve = resolve
        self.used = [False] * len(frames)
        self.used_frames = 0
        self.open_tuples = 0
        self.leaves = 0
        # Counts down: the hooks see every array and map as msgpack finishes it.
        self.containers = max_containers

    def _count(self) -> None:
        self.containers -= 1
        if self.containers < 0:
            raise ProtocolError("header holds too many arrays and maps")

    def map_hook(self, items: dict[Any, Any]) -> Any:
        self.containers -= 1
        if self.containers < 0:
            self._count()
        return items

    def list_hook(self, items: list[Any]) -> Any:
        self.containers -= 1
        if self.containers < 0:
            self._count()
        if items and items[0] is TUPLE_MARK:
            self.open_tuples -= 1
            return tuple(items[1:])
        return items

    def ext_hook(self, code: int, data: bytes) -> Any:
        if code == EXT_ARRAY_INLINE:
            return self.inline_array(data)
        if code == EXT_SCALAR:
            return self.scalar(data)
        if code == EXT_TUPLE:
            if data:
                raise ProtocolError("tuple marker with a payload")
            self.open_tuples += 1
            return TUPLE_MARK
        if code == EXT_ARRAY_FRAME:
            return self.frame_array(data)
        if code == EXT_STACKED_ARRAY or code == EXT_STACKED_SCALAR:
            array = unpack_bounded(data, self.array_hook)
            if not isinstance(array, np.ndarray) or array.ndim == 0:
                raise ProtocolError("stacked leaf does not hold an array with a sample axis")
            self.leaves += 1
            return StackedLeaf(ARRAY if code == EXT_STACKED_ARRAY else SCALAR, array)
        if code == EXT_COLUMN:
            values = unpack_bounded(data, no_ext)
            if type(values) is not list:
                raise ProtocolError("column leaf does not hold an array")
            self.leaves += 1
            return StackedLeaf(COLUMN, values)
        raise ProtocolError(f"unknown msgpack ext code {code}")

    def array_hook(self, code: int, data: bytes) -> Any:
        if code == EXT_ARRAY_INLINE:
            return self.inline_array(data)
        if code == EXT_ARRAY_FRAME:
            return self.frame_array(data)
        raise ProtocolError(f"unexpected msgpack ext code {code} in a stacked leaf")

    def inline_array(self, data: bytes) -> np.ndarray:
        meta, start = split_meta(data)
        layout = _meta_cache.get(meta)
        if layout is None:
            parsed = unpack_bounded(meta, no_ext)
            if type(parsed) is not list or len(parsed) != 2:
                raise ProtocolError("invalid inline array descriptor")
            layout = _array_layout(parsed[0], parsed[1])
            if len(_meta_cache) > 4096:
                _meta_cache.clear()
            _meta_cache[meta] = layout
        dtype, shape, count, nbytes = layout
        if len(data) - start != nbytes:
            raise ProtocolError(
                f"inline array declares {nbytes} bytes but carries {len(data) - start}"
            )
        if dtype.itemsize == 0:
            return _empty_items(dtype, shape, count)
        # The payload is an immutable bytes object: copy it so the array is writable.
        array: np.ndarray = np.ndarray(shape, dtype, bytearray(data[start:]))
        return array

    def frame_array(self, data: bytes) -> np.ndarray:
        parsed = unpack_bounded(data, no_ext)
        if type(parsed) is not list or len(parsed) != 3:
            raise ProtocolError("invalid array frame descriptor")
        dtype, shape, count, nbytes = _array_layout(parsed[0], parsed[1])
        index = parsed[2]
        if type(index) is not int or not FIRST_ARRAY_FRAME <= index < len(self.frames):
            raise ProtocolError(f"array refers to frame {index!r}, not in the message")
        if self.used[index]:
            raise ProtocolError(f"frame {index} is referred to twice")
        self.used[index] = True
        self.used_frames += 1
        frame = self.frames[index]
        if len(frame) != nbytes and self.resolve is not None:
            # Not the array's bytes: perhaps a reference to them in shared memory.
            frame = self.resolve(frame, nbytes)
        if len(frame) != nbytes:
            raise ProtocolError(
                f"array of shape {shape} and dtype {dtype} needs {nbytes} bytes, "
                f"frame {index} holds {len(frame)}"
            )
        if dtype.itemsize == 0:
            return _empty_items(dtype, shape, count)
        array = np.frombuffer(frame, dtype, count).reshape(shape)
        if not array.flags.writeable:
            array = array.copy()
        return array

    def scalar(self, data: bytes) -> np.generic:
        meta, start = split_meta(data)
        dtype = _scalar_cache.get(meta)
        if dtype is None:
            description = unpack_bounded(meta, no_ext)
            dtype = dtype_from_description(description)
            if dtype.subdtype is not None:
                raise ProtocolError("a numpy scalar cannot have a sub-array dtype")
            if len(_scalar_cache) > 4096:
                _scalar_cache.clear()
            _scalar_cache[meta] = dtype
        if len(data) - start != dtype.itemsize:
            raise ProtocolError(
                f"numpy scalar of dtype {dtype} needs {dtype.itemsize} bytes, "
                f"got {len(data) - start}"
            )
        if dtype.itemsize == 0:
            return _empty_items(dtype, (1,), 1)[0]  # type: ignore[no-any-return]
        if dtype.kind == "V":
            # A void scalar is a view; give it memory of its own.
            return np.frombuffer(data, dtype, 1, start).copy()[0]  # type: ignore[no-any-return]
        return np.frombuffer(data, dtype, 1, start)[0]  # type: ignore[no-any-return]


def _empty_items(dtype: np.dtype[Any], shape: tuple[int, ...], count: int) -> np.ndarray:
    # Zero-size items carry no bytes, so the byte check above bounds nothing.
    if count > 2**24:
        raise ProtocolError(f"too many zero-size items ({count})")
    return np.zeros(shape, dtype)


def decode(
    frames: Sequence[FrameLike], *, limits: Limits = DEFAULT_LIMITS, resolve: Resolver | None = None
) -> Message:
    """Decode the frames of one multipart message.

    Arrays are views of the frames when a frame is writable (a ``bytearray``, a
    writable ``memoryview``, a zmq ``Frame``), copies otherwise; either way they
    are writable. ``resolve(frame, nbytes)``, when given, is asked about an array
    frame whose length is not the array's: it returns the memory the frame refers
    to (the same-host shared-memory path) or the frame itself. Anything malformed
    raises :class:`~feedmux.errors.ProtocolError`; a header of another protocol version raises
    :class:`~feedmux.errors.VersionMismatchError`.

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, encode
    >>> frames = encode(Data(tags=np.array([[1, 0]]), samples=[{"x": np.arange(3)}]))
    >>> message = decode(frames)
    >>> message.samples[0]["x"], message.tags.tolist()
    (array([0, 1, 2]), [[1, 0]])
    """
    try:
        return _decode(frames, limits, resolve)
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"malformed message: {type(exc).__name__}: {exc}") from None


def _decode(frames: Sequence[Any], limits: Limits, resolve: Resolver | None,
            inner: bool = False) -> Message:
    count = len(frames)
    if count == 0:
        raise ProtocolError("empty message: no header frame")
    if count > limits.max_frames:
        raise ProtocolError(f"message has {count} frames, limit is {limits.max_frames}")
    views = [frame if type(frame) is bytes else view(frame) for frame in frames]
    header_view = views[0]
    size = len(header_view)
    if size > limits.max_header_bytes:
        raise ProtocolError(f"header of {size} bytes, limit is {limits.max_header_bytes}")
    total = size if count == 1 else sum(map(len, views))
    if total > limits.max_message_bytes:
        raise ProtocolError(f"message of {total} bytes, limit is {limits.max_message_bytes}")
    if size < 4 or header_view[1:4] != b"\xa1v\x01" or not 0x80 <= header_view[0] <= 0x8F:
        check_version(header_view)  # not our encoder's layout: read the version the slow way
    state = _Decoding(views, limits.max_containers, resolve)
    # Nothing in a header can be longer than the header: msgpack refuses a declared
    # length beyond these before it allocates for it.
    length = size if limits.max_container_len is None else min(size, limits.max_container_len)
    header = msgpack.unpackb(
        header_view,
        strict_map_key=False,
        ext_hook=state.ext_hook,
        list_hook=state.list_hook,
        object_hook=state.map_hook,
        max_str_len=size,
        max_bin_len=size,
        max_array_len=length,
        max_map_len=length,
        max_ext_len=size,
    )
    if type(header) is not dict:
        raise ProtocolError("header is not a msgpack map")
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise version_mismatch(version)
    if state.open_tuples:
        raise ProtocolError("tuple marker outside the first item of an array")
    kind = header.get("k")
    if kind == _DATA and type(kind) is int:
        return _decode_data(header, views, state)
    if kind == COMPRESSED and type(kind) is int:
        if inner:
            raise ProtocolError("a compressed message inside a compressed message")
        inflated = inflate(header, frames[1:], limits.max_frames - 1, limits.max_message_bytes)
        return _decode(inflated, limits, resolve, inner=True)
    spec = CONTROL_BY_KIND.get(kind) if type(kind) is int else None
    if spec is None:
        raise ProtocolError(f"unknown message kind {short(kind)}")
    if count != 1:
        raise ProtocolError(f"{spec.cls.__name__} message has {count} frames, expected 1")
    if state.leaves:
        raise ProtocolError("batch leaves outside a data message")
    return spec.message(header)


def _decode_data(header: dict[Any, Any], views: list[Any], state: _Decoding) -> Data:
    if len(views) < 2:
        raise ProtocolError("data message without its tag frame")
    count = header.get("n")
    if type(count) is not int or count < 0:
        raise ProtocolError(f"data message with invalid sample count {short(count)}")
    server_id = header.get("server_id", "")
    seq = header.get("seq", 0)
    if type(server_id) is not str or type(seq) is not int or not INT_MIN <= seq <= INT_MAX:
        raise ProtocolError("data message with invalid server_id or seq")
    tags = tags_from_frame(views[TAG_FRAME], count)
    if state.used_frames != len(views) - FIRST_ARRAY_FRAME:
        raise ProtocolError("data message has frames that no array refers to")
    samples: Sequence[Any]
    batch = header.get("batch")
    if batch is None:
        samples = header.get("samples")  # type: ignore[assignment]
        if type(samples) is not list or len(samples) != count:
            raise ProtocolError(f"data message without a list of {count} samples")
        if state.leaves:
            raise ProtocolError("batch leaves inside per-sample data")
    else:
        if "samples" in header:
            raise ProtocolError("data message with both 'samples' and 'batch'")
        samples = SampleBatch(batch, count)
        if _count_leaves(batch) != state.leaves:
            raise ProtocolError("batch leaves outside the batch template")
    return Data(tags, samples, server_id, seq)


def _count_leaves(template: Any) -> int:
    # compile_template has checked the shape and depth of the template already.
    kind = type(template)
    if kind is StackedLeaf:
        return 1
    if kind is dict:
        return sum(_count_leaves(value) for value in template.values())
    return sum(_count_leaves(value) for value in template)

