"""Encoding messages into frames and decoding frames into messages (wire format v1).

This module owns the bytes: the msgpack header in frame 0, the raw tag frame
of a data message at frame 1, and the raw array frames after it. It is
sans-IO (it never imports zmq, never blocks, never keeps a clock) and it never
unpickles anything: every value read from the wire is checked against the
format before it is used, and anything malformed raises
:class:`~feedmux.errors.ProtocolError`.

Extension types inside the header (msgpack ext codes; ``docs/protocol.md`` has
the details). A *descriptor* is a msgpack value behind its length: one byte
below 255, else 0xFF and a u32-le.

== ================ ============================================================
1  ARRAY_INLINE     descriptor ``[dtype, shape]``, then the raw C-order bytes
2  ARRAY_FRAME      msgpack ``[dtype, shape, frame_index]``
3  SCALAR           descriptor ``dtype``, then the raw bytes of the item
4  TUPLE            empty; as the first item of a msgpack array, makes it a tuple
5  STACKED_ARRAY    a packed ext 1 or 2: one ndarray leaf of every sample, stacked
6  STACKED_SCALAR   a packed ext 1 or 2: one numpy-scalar leaf of every sample
7  COLUMN           a packed msgpack array: one plain leaf of every sample
== ================ ============================================================
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeAlias

import msgpack
import numpy as np

from feedmux.errors import ProtocolError, VersionMismatchError
from feedmux.protocol._batch import (
    ARRAY,
    COLUMN,
    SCALAR,
    SampleBatch,
    StackedLeaf,
    stack_samples,
)
from feedmux.protocol._dtypes import (
    UnsupportedDtypeError,
    describe_dtype,
    dtype_from_description,
    shape_from_description,
)
from feedmux.protocol._messages import (
    PROTOCOL_VERSION,
    Ack,
    Credit,
    Data,
    Drain,
    EndOfEpoch,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Kind,
    Message,
    Stats,
    StatsRequest,
    Welcome,
)

__all__ = [
    "DEFAULT_LIMITS",
    "INLINE_THRESHOLD",
    "TAG_DTYPE",
    "Limits",
    "decode",
    "encode",
    "read_tags",
    "replace_tags",
]

#: Arrays of fewer bytes than this travel inline in the header; the others get
#: their own frame (sent without a copy). A stacked leaf of a batch counts as one
#: array. Measured one data message at a time over tcp between two processes
#: (encode, send, receive, decode): inline was 15-30 % faster up to 16 KiB, the two
#: were even from 24 to 48 KiB and frames won from 64 KiB (where pyzmq stops
#: copying); where they are even, frames win because they are zero-copy.
INLINE_THRESHOLD = 24 * 1024

#: The dtype of the tag frame (frame 1) of a data message: little-endian int64.
TAG_DTYPE = np.dtype("<i8")

_DATA = int(Kind.DATA)

EXT_ARRAY_INLINE = 1
EXT_ARRAY_FRAME = 2
EXT_SCALAR = 3
EXT_TUPLE = 4
EXT_STACKED_ARRAY = 5
EXT_STACKED_SCALAR = 6
EXT_COLUMN = 7

# The frame index of the tags of a data message, and of its first array frame.
TAG_FRAME = 1
FIRST_ARRAY_FRAME = 2

#: What a frame given to :func:`decode` may be: ``bytes``, ``bytearray``, ``memoryview``,
#: any object with the buffer protocol, or a zmq ``Frame`` (read through its writable
#: ``.buffer``). Typed loosely so that pyzmq's own types pass.
FrameLike: TypeAlias = Any

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


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


DEFAULT_LIMITS = Limits()


# --------------------------------------------------------------------------- encoding


class _TupleMark:
    """Decoded form of the TUPLE ext until the list holding it is turned into a tuple."""

    __slots__ = ()


_TUPLE_MARK = _TupleMark()
_TUPLE_EXT = msgpack.ExtType(EXT_TUPLE, b"")
_new_tuple = tuple.__new__
_ExtType = msgpack.ExtType


def _ext(code: int, payload: bytes) -> msgpack.ExtType:
    # msgpack.ExtType() checks its arguments in Python; ours are right by construction.
    return _new_tuple(_ExtType, (code, payload))


def _length_prefixed(packed: bytes) -> bytes:
    """``packed`` behind its length: one byte below 255, else 0xFF and a u32-le."""
    if len(packed) < 0xFF:
        return bytes((len(packed),)) + packed
    return b"\xff" + len(packed).to_bytes(4, "little") + packed


def _split_meta(data: bytes) -> tuple[bytes, int]:
    """The length-prefixed descriptor at the start of ``data`` and where the raw bytes begin."""
    size = data[0]
    if size < 0xFF:
        start = 1 + size
        meta = data[1:start]
    else:
        start = 5 + int.from_bytes(data[1:5], "little")
        meta = data[5:start]
    if len(data) < start:
        raise ProtocolError("truncated array or scalar descriptor")
    return meta, start


class _Unsupported(ProtocolError):
    """Raised while packing; the encoder then looks for the path of the culprit."""


class _Encoder:
    """Per-thread packing state: reused msgpack packers and the frames of one message."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(
            default=self.default, use_bin_type=True, strict_types=True, datetime=False
        )
        # Packs the small pieces of ext payloads; never re-entered while packing.
        self.aux_packer = msgpack.Packer(
            default=self.default, use_bin_type=True, strict_types=True, datetime=False
        )
        self.meta_packer = msgpack.Packer(use_bin_type=True)
        self.frames: list[Any] = []
        self.inline_threshold = INLINE_THRESHOLD
        self.meta_cache: dict[tuple[np.dtype[Any], tuple[int, ...]], bytes] = {}
        self.scalar_meta_cache: dict[np.dtype[Any], bytes] = {}

    def default(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if type(obj) is not np.ndarray and isinstance(obj, np.ma.MaskedArray):
                raise _Unsupported("masked arrays are not supported")
            return self.array_ext(obj)
        if isinstance(obj, np.generic):
            return self.scalar_ext(obj)
        if isinstance(obj, tuple):
            return [_TUPLE_EXT, *obj]
        if isinstance(obj, dict):
            return dict(obj)
        if isinstance(obj, list):
            return list(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, bytes):
            return bytes(obj)
        raise _Unsupported(f"unsupported type {type(obj).__qualname__}")

    def array_meta(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
        key = (dtype, shape)
        meta = self.meta_cache.get(key)
        if meta is None:
            packed = self.meta_packer.pack([describe_dtype(dtype), list(shape)])
            meta = _length_prefixed(packed)
            if len(self.meta_cache) > 4096:
                self.meta_cache.clear()
            self.meta_cache[key] = meta
        return meta

    def array_ext(self, array: np.ndarray) -> msgpack.ExtType:
        if array.dtype.hasobject:
            raise _Unsupported("object arrays are not supported")
        if array.nbytes < self.inline_threshold:
            meta = self.array_meta(array.dtype, array.shape)
            return _ext(EXT_ARRAY_INLINE, meta + array.tobytes())
        description = describe_dtype(array.dtype)
        if array.nbytes == 0:
            frame: Any = b""
        else:
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            frame = memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        index = len(self.frames)
        self.frames.append(frame)
        meta = self.meta_packer.pack([description, list(array.shape), index])
        return _ext(EXT_ARRAY_FRAME, meta)

    def scalar_ext(self, scalar: np.generic) -> msgpack.ExtType:
        dtype = scalar.dtype
        raw = scalar.tobytes()
        if len(raw) != dtype.itemsize:
            # Empty np.bytes_ / np.str_ claim itemsize 0 but hold one (empty) character.
            zero_d = np.asarray(scalar)
            dtype, raw = zero_d.dtype, zero_d.tobytes()
        meta = self.scalar_meta_cache.get(dtype)
        if meta is None:
            packed = self.meta_packer.pack(describe_dtype(dtype))
            meta = _length_prefixed(packed)
            if len(self.scalar_meta_cache) > 4096:
                self.scalar_meta_cache.clear()
            self.scalar_meta_cache[dtype] = meta
        return _ext(EXT_SCALAR, meta + raw)

    def leaf_ext(self, leaf: StackedLeaf) -> msgpack.ExtType:
        if leaf.kind == COLUMN:
            return _ext(EXT_COLUMN, self.aux_packer.pack(leaf.values))
        code = EXT_STACKED_ARRAY if leaf.kind == ARRAY else EXT_STACKED_SCALAR
        return _ext(code, self.aux_packer.pack(self.array_ext(leaf.values)))


_local = threading.local()


def _encoder() -> _Encoder:
    try:
        encoder: _Encoder = _local.encoder
    except AttributeError:
        encoder = _local.encoder = _Encoder()
    return encoder


def encode(message: Message, *, inline_threshold: int = INLINE_THRESHOLD) -> list[Any]:
    """Encode ``message`` into a list of frames for one multipart message.

    Frame 0 is the msgpack header; a :class:`Data` message has its tags as
    raw little-endian int64 in frame 1 and large arrays in frames 2 and up
    (memoryviews of the arrays' own memory when they are C-contiguous).

    Raises :class:`~feedmux.errors.ProtocolError` for anything that cannot
    travel, naming where it sits in the sample (``sample['meta'][2]``).

    A frame that is a view of an array must not be changed until it is sent:
    with ``send_multipart(frames, copy=False)``, until zmq is done with it.

    Examples
    --------
    >>> frames = encode(Hello(client_id="trainer-0"))
    >>> len(frames)
    1
    >>> decode(frames)
    Hello(client_id='trainer-0', role='trainer', world_size=1)
    """
    if type(message) is Data:
        return _encode_data(message, inline_threshold)
    spec = _CONTROL_BY_CLASS.get(type(message))
    if spec is None:
        raise ProtocolError(f"cannot encode {type(message).__qualname__}: not a message")
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "k": int(spec.kind)}
    for name, check in spec.fields:
        header[name] = check.coerce(getattr(message, name), name, spec.cls)
    try:
        return [_encoder().packer.pack(header)]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode {spec.cls.__name__}: {exc}") from None


def _encode_tags(tags: Any, count: int) -> bytes:
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


def _encode_data(message: Data, inline_threshold: int) -> list[Any]:
    samples = message.samples
    try:
        count = len(samples)
    except TypeError:
        raise ProtocolError(
            f"Data.samples must be a sequence, got {type(samples).__qualname__}"
        ) from None
    tag_frame = _encode_tags(message.tags, count)
    encoder = _encoder()
    encoder.frames = frames = [None, tag_frame]
    encoder.inline_threshold = inline_threshold
    server_id, seq = message.server_id, message.seq
    if type(server_id) is not str:
        server_id = _STR.coerce(server_id, "server_id", Data)
    if type(seq) is not int or not _INT_MIN <= seq <= _INT_MAX:
        seq = _INT.coerce(seq, "seq", Data)
    header = {"v": PROTOCOL_VERSION, "k": _DATA, "server_id": server_id, "seq": seq, "n": count}
    try:
        template = stack_samples(samples) if count > 1 else None
        if template is not None:
            header["batch"] = _template_exts(template, encoder)
        else:
            header["samples"] = samples if type(samples) is list else list(samples)
        frames[0] = encoder.packer.pack(header)
    except (ProtocolError, TypeError, ValueError, OverflowError, UnicodeError) as exc:
        _raise_with_path(samples, exc)
    finally:
        encoder.frames = []
        encoder.inline_threshold = INLINE_THRESHOLD
    return frames


def _template_exts(template: Any, encoder: _Encoder) -> Any:
    kind = type(template)
    if kind is StackedLeaf:
        return encoder.leaf_ext(template)
    if kind is dict:
        return {key: _template_exts(value, encoder) for key, value in template.items()}
    if kind is list:
        return [_template_exts(value, encoder) for value in template]
    return [_TUPLE_EXT, *(_template_exts(value, encoder) for value in template)]


def _raise_with_path(samples: Sequence[Any], exc: BaseException) -> None:
    """Find where in ``samples`` the value that failed to encode sits, and say so."""
    for position, sample in enumerate(samples):
        problem = _find_problem(sample, "sample", 0)
        if problem is not None:
            where = f" (sample {position} of {len(samples)})" if len(samples) > 1 else ""
            raise ProtocolError(f"cannot encode {problem}{where}") from None
    raise ProtocolError(f"cannot encode data message: {exc}") from None


def _find_problem(node: Any, path: str, depth: int) -> str | None:
    if depth > 256:
        return f"{path}: nested too deeply"
    if isinstance(node, np.ndarray):
        if type(node) is not np.ndarray and isinstance(node, np.ma.MaskedArray):
            return f"{path}: masked arrays are not supported"
        try:
            describe_dtype(node.dtype)
        except UnsupportedDtypeError as exc:
            return f"{path}: array of dtype {node.dtype}: {exc}"
        return None
    if isinstance(node, np.generic):
        try:
            describe_dtype(node.dtype)
        except UnsupportedDtypeError as exc:
            return f"{path}: numpy scalar of dtype {node.dtype}: {exc}"
        return None
    if isinstance(node, dict):
        for key, value in node.items():
            problem = _find_problem(key, f"{path} (key {_short(key)})", depth + 1)
            if problem is not None:
                return problem
            problem = _find_problem(value, f"{path}[{key!r}]", depth + 1)
            if problem is not None:
                return problem
        return None
    if isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            problem = _find_problem(value, f"{path}[{index}]", depth + 1)
            if problem is not None:
                return problem
        return None
    if node is None or isinstance(node, (bool, float, bytes, bytearray, memoryview)):
        return None
    if isinstance(node, int):
        if not _INT_MIN <= node <= _INT_MAX:
            return f"{path}: int {node} out of range (msgpack carries -2**63 .. 2**64-1)"
        return None
    if isinstance(node, str):
        try:
            node.encode("utf-8")
        except UnicodeError as exc:
            return f"{path}: str that is not valid UTF-8 ({exc})"
        return None
    return f"{path}: unsupported type {type(node).__qualname__}"


# --------------------------------------------------------------------------- control fields


class _Field:
    """How one header field is checked on decode and normalized on encode."""

    def __init__(self, name: str, accepts: Callable[[Any], bool], coerce: Callable[[Any], Any]):
        self.name = name
        self.accepts = accepts
        self._coerce = coerce

    def coerce(self, value: Any, field: str, cls: type) -> Any:
        try:
            coerced = self._coerce(value)
        except (TypeError, ValueError, OverflowError):
            coerced = _INVALID
        if coerced is _INVALID or not self.accepts(coerced):
            raise ProtocolError(
                f"{cls.__name__}.{field} must be {self.name}, got {type(value).__qualname__}"
            )
        return coerced


_INVALID = object()


def _is_int(value: Any) -> bool:
    return type(value) is int and _INT_MIN <= value <= _INT_MAX


def _to_int(value: Any) -> Any:
    return _INVALID if isinstance(value, (bool, np.bool_)) else operator.index(value)


def _to_str(value: Any) -> Any:
    return str(value) if isinstance(value, str) else _INVALID


def _to_bool(value: Any) -> Any:
    return bool(value) if isinstance(value, (bool, np.bool_)) else _INVALID


def _to_optional_int(value: Any) -> Any:
    return None if value is None else _to_int(value)


def _is_stat_value(value: Any) -> bool:
    if type(value) is int:
        return _INT_MIN <= value <= _INT_MAX
    return value is None or type(value) in (float, str, bool)


def _to_stat_value(value: Any) -> Any:
    if value is None or type(value) in (int, float, str, bool):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return _INVALID


def _is_stats(value: Any) -> bool:
    return type(value) is dict and all(
        type(key) is str and _is_stat_value(item) for key, item in value.items()
    )


def _to_stats(value: Any) -> Any:
    if not isinstance(value, dict):
        return _INVALID
    return {key: _to_stat_value(item) for key, item in value.items()}


def _is_ints(value: Any) -> bool:
    return type(value) is tuple and all(_is_int(item) for item in value)


def _to_ints(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return _INVALID
    return tuple(_to_int(item) for item in value)


_STR = _Field("a str", lambda value: type(value) is str, _to_str)
_INT = _Field("an int", _is_int, _to_int)
_BOOL = _Field("a bool", lambda value: type(value) is bool, _to_bool)
_OPTIONAL_INT = _Field("an int or None", lambda v: v is None or _is_int(v), _to_optional_int)
_STATS = _Field("a dict of str to int, float, str or None", _is_stats, _to_stats)
_INTS = _Field("a sequence of ints", _is_ints, _to_ints)


class _ControlSpec:
    def __init__(self, kind: Kind, cls: type, **field_checks: _Field) -> None:
        self.kind = kind
        self.cls = cls
        names = [item.name for item in fields(cls)]
        assert sorted(names) == sorted(field_checks), cls
        self.fields = [(name, field_checks[name]) for name in names]
        self.required = frozenset(
            item.name
            for item in fields(cls)
            if item.default is MISSING and item.default_factory is MISSING
        )


_CONTROL_SPECS = [
    _ControlSpec(Kind.HELLO, Hello, client_id=_STR, role=_STR, world_size=_INT),
    _ControlSpec(
        Kind.WELCOME,
        Welcome,
        server_id=_STR,
        epoch_size=_OPTIONAL_INT,
        epoch=_INT,
        samples_per_message=_INT,
        finished=_BOOL,
        workers=_INT,
        reliable=_BOOL,
    ),
    _ControlSpec(Kind.HEARTBEAT, Heartbeat, sender_id=_STR, received_messages=_INT),
    _ControlSpec(Kind.ERROR, Error, type=_STR, message=_STR, traceback=_STR, server_id=_STR),
    _ControlSpec(Kind.STATS_REQUEST, StatsRequest, client_id=_STR),
    _ControlSpec(Kind.STATS, Stats, values=_STATS),
    _ControlSpec(Kind.END_OF_EPOCH, EndOfEpoch, epoch=_INT, count=_INT, worker=_INT),
    _ControlSpec(Kind.DRAIN, Drain, sent_messages=_INT, server_id=_STR),
    _ControlSpec(Kind.END_OF_STREAM, EndOfStream, server_id=_STR, epochs=_INT, sent_messages=_INT),
    _ControlSpec(Kind.CREDIT, Credit, credits=_INT, client_id=_STR),
    _ControlSpec(Kind.ACK, Ack, seqs=_INTS, client_id=_STR),
]
_CONTROL_BY_CLASS: dict[type, _ControlSpec] = {spec.cls: spec for spec in _CONTROL_SPECS}
_CONTROL_BY_KIND: dict[int, _ControlSpec] = {int(spec.kind): spec for spec in _CONTROL_SPECS}


# --------------------------------------------------------------------------- decoding

_meta_cache: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], int, int]] = {}
_scalar_cache: dict[bytes, np.dtype[Any]] = {}


def _array_layout(
    description: Any, shape_description: Any
) -> tuple[np.dtype[Any], tuple[int, ...], int, int]:
    dtype = dtype_from_description(description)
    shape = shape_from_description(shape_description)
    count = math.prod(shape)
    return dtype, shape, count, count * dtype.itemsize


def _view(frame: Any) -> memoryview | bytes:
    if type(frame) is bytes:
        return frame
    buffer = getattr(frame, "buffer", None)  # a zmq.Frame: its .buffer is writable
    view = memoryview(buffer if isinstance(buffer, memoryview) else frame)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


class _Decoding:
    """State of one decode call: the frames, which of them arrays used, open markers."""

    __slots__ = ("frames", "leaves", "open_tuples", "used", "used_frames")

    def __init__(self, frames: list[memoryview | bytes]) -> None:
        self.frames = frames
        self.used = [False] * len(frames)
        self.used_frames = 0
        self.open_tuples = 0
        self.leaves = 0

    def list_hook(self, items: list[Any]) -> Any:
        if items and items[0] is _TUPLE_MARK:
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
            return _TUPLE_MARK
        if code == EXT_ARRAY_FRAME:
            return self.frame_array(data)
        if code == EXT_STACKED_ARRAY or code == EXT_STACKED_SCALAR:
            array = _unpack_payload(data, self.array_hook)
            if not isinstance(array, np.ndarray) or array.ndim == 0:
                raise ProtocolError("stacked leaf does not hold an array with a sample axis")
            self.leaves += 1
            return StackedLeaf(ARRAY if code == EXT_STACKED_ARRAY else SCALAR, array)
        if code == EXT_COLUMN:
            values = _unpack_payload(data, _no_ext)
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
        meta, start = _split_meta(data)
        layout = _meta_cache.get(meta)
        if layout is None:
            parsed = _unpack_payload(meta, _no_ext)
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
        parsed = _unpack_payload(data, _no_ext)
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
        meta, start = _split_meta(data)
        dtype = _scalar_cache.get(meta)
        if dtype is None:
            description = _unpack_payload(meta, _no_ext)
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


def _unpack_payload(
    data: memoryview | bytes, ext_hook: Callable[[int, bytes], Any] | None = None
) -> Any:
    """Unpack one msgpack value whose parts can be no longer than ``data`` itself.

    Without ``ext_hook``, ext values stay inert ExtType objects.
    """
    size = len(data)
    hooks = {} if ext_hook is None else {"ext_hook": ext_hook}
    return msgpack.unpackb(
        data,
        strict_map_key=False,
        max_str_len=size,
        max_bin_len=size,
        max_array_len=size,
        max_map_len=size,
        max_ext_len=size,
        **hooks,
    )


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"unexpected msgpack ext code {code} in an array descriptor")


def _empty_items(dtype: np.dtype[Any], shape: tuple[int, ...], count: int) -> np.ndarray:
    # Zero-size items carry no bytes, so the byte check above bounds nothing.
    if count > 2**24:
        raise ProtocolError(f"too many zero-size items ({count})")
    return np.zeros(shape, dtype)


def _check_version(header: memoryview | bytes) -> None:
    """Read the version of a header not laid out by our encoder; raise unless it is ours."""
    plain = _unpack_payload(header)
    if type(plain) is not dict or "v" not in plain:
        raise ProtocolError("header is not a msgpack map with a protocol version 'v'")
    version = plain["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise VersionMismatchError(
            f"expected protocol version {PROTOCOL_VERSION}, got {_short(version)}"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def decode(frames: Sequence[FrameLike], *, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode the frames of one multipart message.

    Arrays are views of the frames when a frame is writable (a ``bytearray``, a
    writable ``memoryview``, a zmq ``Frame``), copies otherwise; either way they
    are writable. Anything malformed raises :class:`~feedmux.errors.ProtocolError`;
    a header of another protocol version raises
    :class:`~feedmux.errors.VersionMismatchError`.

    Examples
    --------
    >>> import numpy as np
    >>> frames = encode(Data(tags=np.array([[1, 0]]), samples=[{"x": np.arange(3)}]))
    >>> message = decode(frames)
    >>> message.samples[0]["x"], message.tags.tolist()
    (array([0, 1, 2]), [[1, 0]])
    """
    try:
        return _decode(frames, limits)
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"malformed message: {type(exc).__name__}: {exc}") from None


def _decode(frames: Sequence[Any], limits: Limits) -> Message:
    count = len(frames)
    if count == 0:
        raise ProtocolError("empty message: no header frame")
    if count > limits.max_frames:
        raise ProtocolError(f"message has {count} frames, limit is {limits.max_frames}")
    views = [frame if type(frame) is bytes else _view(frame) for frame in frames]
    header_view = views[0]
    size = len(header_view)
    if size > limits.max_header_bytes:
        raise ProtocolError(f"header of {size} bytes, limit is {limits.max_header_bytes}")
    total = size if count == 1 else sum(map(len, views))
    if total > limits.max_message_bytes:
        raise ProtocolError(f"message of {total} bytes, limit is {limits.max_message_bytes}")
    if size < 4 or header_view[1:4] != b"\xa1v\x01" or not 0x80 <= header_view[0] <= 0x8F:
        _check_version(header_view)  # not our encoder's layout: read the version the slow way
    state = _Decoding(views)
    # Nothing in a header can be longer than the header: msgpack refuses a declared
    # length beyond these before it allocates for it.
    header = msgpack.unpackb(
        header_view,
        strict_map_key=False,
        ext_hook=state.ext_hook,
        list_hook=state.list_hook,
        max_str_len=size,
        max_bin_len=size,
        max_array_len=size,
        max_map_len=size,
        max_ext_len=size,
    )
    if type(header) is not dict:
        raise ProtocolError("header is not a msgpack map")
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise VersionMismatchError(
            f"expected protocol version {PROTOCOL_VERSION}, got {_short(version)}"
        )
    if state.open_tuples:
        raise ProtocolError("tuple marker outside the first item of an array")
    kind = header.get("k")
    if kind == _DATA and type(kind) is int:
        return _decode_data(header, views, state)
    spec = _CONTROL_BY_KIND.get(kind) if type(kind) is int else None
    if spec is None:
        raise ProtocolError(f"unknown message kind {_short(kind)}")
    if count != 1:
        raise ProtocolError(f"{spec.cls.__name__} message has {count} frames, expected 1")
    if state.leaves:
        raise ProtocolError("batch leaves outside a data message")
    arguments: dict[str, Any] = {}
    for name, check in spec.fields:
        if name in header:
            value = header[name]
            if type(value) is list and check is _INTS:
                value = tuple(value)
            if not check.accepts(value):
                raise ProtocolError(
                    f"{spec.cls.__name__}.{name} must be {check.name}, "
                    f"got {type(value).__qualname__}"
                )
            arguments[name] = value
        elif name in spec.required:
            raise ProtocolError(f"{spec.cls.__name__} message without {name!r}")
    message: Message = spec.cls(**arguments)
    return message


def _tags_from_frame(frame: memoryview | bytes, count: int | None) -> np.ndarray:
    if len(frame) % 16:
        raise ProtocolError(f"tag frame of {len(frame)} bytes is not a whole number of tags")
    rows = len(frame) // 16
    if count is not None and rows != count:
        raise ProtocolError(f"tag frame holds {rows} tags for {count} samples")
    buffer: memoryview | bytes | bytearray = frame
    if type(frame) is bytes or frame.readonly:  # type: ignore[union-attr]
        # Tags are small: a bytearray copy is the cheapest way to writable memory.
        buffer = bytearray(frame)
    tags: np.ndarray = np.ndarray((rows, 2), TAG_DTYPE, buffer)
    return tags


def _decode_data(header: dict[Any, Any], views: list[Any], state: _Decoding) -> Data:
    if len(views) < 2:
        raise ProtocolError("data message without its tag frame")
    count = header.get("n")
    if type(count) is not int or count < 0:
        raise ProtocolError(f"data message with invalid sample count {_short(count)}")
    server_id = header.get("server_id", "")
    seq = header.get("seq", 0)
    if type(server_id) is not str or type(seq) is not int or not _INT_MIN <= seq <= _INT_MAX:
        raise ProtocolError("data message with invalid server_id or seq")
    tags = _tags_from_frame(views[TAG_FRAME], count)
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


# --------------------------------------------------------------------------- tags


def _data_header_ok(header: memoryview | bytes) -> None:
    prefix = bytes(header[:7])
    if len(prefix) == 7 and 0x80 <= prefix[0] <= 0x8F and prefix[1:6] == b"\xa1v\x01\xa1k":
        if prefix[6] == Kind.DATA:
            return
    _check_version(header)
    plain = _unpack_payload(header)
    if type(plain) is not dict or plain.get("k") != Kind.DATA or type(plain.get("k")) is not int:
        raise ProtocolError("not a data message")


def read_tags(frames: Sequence[FrameLike]) -> np.ndarray:
    """Return the ``(n, 2)`` int64 tags of a data message without decoding its samples.

    Examples
    --------
    >>> import numpy as np
    >>> frames = encode(Data(tags=np.array([[2, 5], [2, 6]]), samples=[1, 2]))
    >>> read_tags(frames).tolist()
    [[2, 5], [2, 6]]
    """
    try:
        if len(frames) < 2:
            raise ProtocolError("not a data message: no tag frame")
        _data_header_ok(_view(frames[0]))
        return _tags_from_frame(_view(frames[TAG_FRAME]), None)
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
    >>> frames = encode(Data(tags=np.array([[1, 0]]), samples=["a"]))
    >>> read_tags(replace_tags(frames, np.array([[3, 9]]))).tolist()
    [[3, 9]]
    """
    old = read_tags(frames)
    new = _encode_tags(tags, len(old))
    return [frames[0], new, *frames[FIRST_ARRAY_FRAME:]]
