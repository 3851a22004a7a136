"""The msgpack extension types of wire format v1, and bounded msgpack unpacking.

This module owns the ext codes a header may hold, the length-prefixed
*descriptor* that opens the payload of ext 1 and ext 3, the tuple marker, and
the one way the codec unpacks a msgpack value it has not laid out itself (every
declared length bounded by the bytes present). It never decides what a
decoded value means and never interprets an ext payload beyond its framing:
that is the encoder's and the decoder's job. A code, once used, is never given
to another type.

A *descriptor* is a msgpack value behind its length: one byte below 255, else
0xFF and a u32-le (``docs/protocol.md`` has the details).

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

from collections.abc import Callable
from typing import Any

import msgpack

from feedmux.errors import ProtocolError

__all__ = [
    "EXT_ARRAY_FRAME",
    "EXT_ARRAY_INLINE",
    "EXT_COLUMN",
    "EXT_SCALAR",
    "EXT_STACKED_ARRAY",
    "EXT_STACKED_SCALAR",
    "EXT_TUPLE",
    "TUPLE_EXT",
    "TUPLE_MARK",
    "ext",
    "length_prefixed",
    "no_ext",
    "split_meta",
    "unpack_bounded",
]

EXT_ARRAY_INLINE = 1
EXT_ARRAY_FRAME = 2
EXT_SCALAR = 3
EXT_TUPLE = 4
EXT_STACKED_ARRAY = 5
EXT_STACKED_SCALAR = 6
EXT_COLUMN = 7


class _TupleMark:
    """Decoded form of the TUPLE ext until the list holding it is turned into a tuple."""

    __slots__ = ()


TUPLE_MARK = _TupleMark()
TUPLE_EXT = msgpack.ExtType(EXT_TUPLE, b"")
_new_tuple = tuple.__new__
_ExtType = msgpack.ExtType


def ext(code: int, payload: bytes) -> msgpack.ExtType:
    """An ext value of ``code`` around ``payload``, built without argument checks."""
    # msgpack.ExtType() checks its arguments in Python; ours are right by construction.
    return _new_tuple(_ExtType, (code, payload))


def length_prefixed(packed: bytes) -> bytes:
    """``packed`` behind its length: one byte below 255, else 0xFF and a u32-le."""
    if len(packed) < 0xFF:
        return bytes((len(packed),)) + packed
    return b"\xff" + len(packed).to_bytes(4, "little") + packed


def split_meta(data: bytes) -> tuple[bytes, int]:
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


def unpack_bounded(
    data: memoryview | bytes, ext_hook: Callable[[int, bytes], Any] | None = None
) -> Any:
    """Unpack one msgpack value whose parts can be no longer than ``data`` itself.

    msgpack refuses a declared length beyond the bound before it allocates for
    it. Without ``ext_hook``, ext values stay inert ExtType objects.

    Examples
    --------
    >>> unpack_bounded(b"\\x92\\x01\\xa1a")
    [1, 'a']
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


def no_ext(code: int, data: bytes) -> Any:
    """An ext hook for descriptors, which never hold ext values."""
    raise ProtocolError(f"unexpected msgpack ext code {code} in an array descriptor")
