"""Encoding messages into frames (wire format v1, the sending side).

This module owns the bytes a sender writes: the msgpack header in frame 0 (ext
values for numpy arrays, numpy scalars, tuples and stacked batch leaves), the
tag frame of a data message, and the raw array frames after it, handed over as
views of the arrays' own memory (a torch CPU tensor's too: it travels as the
array viewing it, :mod:`feedmux.protocol._tensors`) (a decoded :class:`SampleBatch` is encoded from
its stacked leaves, as the same samples would be). It keeps reused msgpack
packers per thread, because building a packer costs more than packing a small
message. It never sends, never pickles, and refuses anything that cannot travel
with a :class:`~feedmux.errors.ProtocolError` that names where in the sample it
sits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol._batch import ARRAY, COLUMN, SampleBatch, StackedLeaf, stack_samples
from feedmux.protocol._dtypes import UnsupportedDtypeError, describe_dtype
from feedmux.protocol._ext import (
    EXT_ARRAY_FRAME,
    EXT_ARRAY_INLINE,
    EXT_COLUMN,
    EXT_SCALAR,
    EXT_STACKED_ARRAY,
    EXT_STACKED_SCALAR,
    TUPLE_EXT,
    ext,
    length_prefixed,
)
from feedmux.protocol._fields import CONTROL_BY_CLASS, INT, INT_MAX, INT_MIN, STR
from feedmux.protocol._frames import short
from feedmux.protocol._messages import PROTOCOL_VERSION, Data, Kind, Message
from feedmux.protocol._tags import encode_tags
from feedmux.protocol._tensors import TensorError, is_tensor, tensor_array, unsupported_hint

__all__ = ["INLINE_THRESHOLD", "encode"]


#: Arrays of fewer bytes than this travel inline in the header; the others get
#: their own frame (sent without a copy). A stacked leaf of a batch counts as one
#: array. Measured one data message at a time over tcp between two processes
#: (encode, send, receive, decode): inline was 15-30 % faster up to 16 KiB, the two
#: were even from 24 to 48 KiB and frames won from 64 KiB (where pyzmq stops
#: copying); where they are even, frames win because they are zero-copy.
INLINE_THRESHOLD = 24 * 1024

_DATA = int(Kind.DATA)


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
            return [TUPLE_EXT, *obj]
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
        if is_tensor(obj):  # a torch CPU tensor travels as the array viewing its memory
            try:
                return self.array_ext(tensor_array(obj))
            except TensorError as error:
                raise _Unsupported(str(error)) from None
        raise _Unsupported(f"unsupported type {type(obj).__qualname__}")

    def array_meta(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
        key = (dtype, shape)
        meta = self.meta_cache.get(key)
        if meta is None:
            packed = self.meta_packer.pack([describe_dtype(dtype), list(shape)])
            meta = length_prefixed(packed)
            if len(self.meta_cache) > 4096:
                self.meta_cache.clear()
            self.meta_cache[key] = meta
        return meta

    def array_ext(self, array: np.ndarray) -> msgpack.ExtType:
        if array.dtype.hasobject:
            raise _Unsupported("object arrays are not supported")
        if array.nbytes < self.inline_threshold:
            meta = self.array_meta(array.dtype, array.shape)
            return ext(EXT_ARRAY_INLINE, meta + array.tobytes())
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
        return ext(EXT_ARRAY_FRAME, meta)

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
            meta = length_prefixed(packed)
            if len(self.scalar_meta_cache) > 4096:
                self.scalar_meta_cache.clear()
            self.scalar_meta_cache[dtype] = meta
        return ext(EXT_SCALAR, meta + raw)

    def leaf_ext(self, leaf: StackedLeaf) -> msgpack.ExtType:
        if leaf.kind == COLUMN:
            return ext(EXT_COLUMN, self.aux_packer.pack(leaf.values))
        code = EXT_STACKED_ARRAY if leaf.kind == ARRAY else EXT_STACKED_SCALAR
        return ext(code, self.aux_packer.pack(self.array_ext(leaf.values)))


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
    >>> from feedmux.protocol import Hello, decode
    >>> frames = encode(Hello(client_id="trainer-0"))
    >>> len(frames)
    1
    >>> decode(frames) == Hello(client_id="trainer-0")
    True
    """
    if type(message) is Data:
        return _encode_data(message, inline_threshold)
    spec = CONTROL_BY_CLASS.get(type(message))
    if spec is None:
        raise ProtocolError(f"cannot encode {type(message).__qualname__}: not a message")
    header = spec.header(message)
    try:
        return [_encoder().packer.pack(header)]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode {spec.cls.__name__}: {exc}") from None


def _encode_data(message: Data, inline_threshold: int) -> list[Any]:
    samples = message.samples
    try:
        count = len(samples)
    except TypeError:
        raise ProtocolError(
            f"Data.samples must be a sequence, got {type(samples).__qualname__}"
        ) from None
    tag_frame = encode_tags(message.tags, count)
    encoder = _encoder()
    encoder.frames = frames = [None, tag_frame]
    encoder.inline_threshold = inline_threshold
    server_id, seq = message.server_id, message.seq
    if type(server_id) is not str:
        server_id = STR.coerce(server_id, "server_id", Data)
    if type(seq) is not int or not INT_MIN <= seq <= INT_MAX:
        seq = INT.coerce(seq, "seq", Data)
    header = {"v": PROTOCOL_VERSION, "k": _DATA, "server_id": server_id, "seq": seq, "n": count}
    try:
        if type(samples) is SampleBatch:  # rows of a received batch, passed on as stacked
            template = samples.template
        elif count < 2:
            template = None
        else:
            template = stack_samples(samples)
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
    return [TUPLE_EXT, *(_template_exts(value, encoder) for value in template)]


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
            problem = _find_problem(key, f"{path} (key {short(key)})", depth + 1)
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
    if is_tensor(node):
        try:
            array = tensor_array(node)
        except TensorError as exc:
            return f"{path}: {exc}"
        return _find_problem(array, path, depth)
    if node is None or isinstance(node, (bool, float, bytes, bytearray, memoryview)):
        return None
    if isinstance(node, int):
        if not INT_MIN <= node <= INT_MAX:
            return f"{path}: int {node} out of range (msgpack carries -2**63 .. 2**64-1)"
        return None
    if isinstance(node, str):
        try:
            node.encode("utf-8")
        except UnicodeError as exc:
            return f"{path}: str that is not valid UTF-8 ({exc})"
        return None
    hint = unsupported_hint(node)
    return (f"{path}: unsupported type {type(node).__module__}.{type(node).__qualname__}: "
            f"{hint + '; ' if hint else ''}a sample holds dicts, lists, tuples, str, bytes, "
            "int, float, bool, None, numpy arrays and scalars, and torch CPU tensors")
