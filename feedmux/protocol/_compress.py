"""Compressed data messages (wire kind 15): what a slow link carries instead of the frames.

This module owns the compressed form of an encoded message and its limits. A compressed
message is frame 0, a msgpack header ``{"v": 1, "k": 15, "c": [codec, ...], "n": [size,
...]}``, then one frame per frame of the inner message (an encoded :class:`Data`, its own
header and tags included): ``c`` names each frame's codec (0 stored as it is, 1 an LZ4
block, 2 a zstd frame) and ``n`` its size once inflated. A frame under
:data:`MIN_COMPRESSED_FRAME` bytes, or one that does not shrink, is stored, and so is the
inner message's tags frame, always: a relay (the server forwarding what its sampling
workers compressed) reads and rewrites the tags without inflating (:func:`packed`), and
finds the inner header's ``seq`` repeated under ``s`` when the compressor was given it.

Decompression bombs: every declared size is checked against the decoder's
:class:`~feedmux.protocol.Limits` (frame count, bytes of the whole message) *before*
anything is allocated, and each frame is inflated into a buffer of exactly its declared
size, which the codec cannot write past (a frame that would inflate further, or less, is a
:class:`~feedmux.errors.ProtocolError`). A compressed message inside a compressed message
is refused. The inflated frames are ``bytearray`` objects, so the arrays decoded from them
are writable views: one decompression per frame is the trainer's whole extra cost.

The codecs are cramjam's (LZ4 and zstd in one wheel, no dependency of its own, built for
every platform numpy is). It never imports zmq and never decides whether to compress: the
server's carrier does (:mod:`feedmux.server._delivery.compression`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cramjam
import msgpack

from feedmux.errors import ProtocolError
from feedmux.protocol._frames import short, view
from feedmux.protocol._messages import PROTOCOL_VERSION, Kind

__all__ = ["COMPRESSED", "MIN_COMPRESSED_FRAME", "STORED", "Codec", "compress_frames",
           "inflate", "inflate_frames", "packed", "parse_compress"]

COMPRESSED = int(Kind.COMPRESSED)
STORED, LZ4, ZSTD = 0, 1, 2
#: Frames shorter than this are stored: a header or tags gain nothing worth the time.
MIN_COMPRESSED_FRAME = 4096
#: zstd levels accepted (negative levels are zstd's fast ones).
ZSTD_LEVELS = range(-7, 23)
#: The inner message's frame that is always stored (its tags).
_STORED_FRAME = 1
# What our compressor writes first: a fixmap, "v": 1, "k": 15.
_PREFIX = b"\xa1v\x01\xa1k" + bytes((COMPRESSED,))


@dataclass(frozen=True)
class Codec:
    """One compression: ``lz4``, or ``zstd`` at ``level``.

    Examples
    --------
    >>> Codec("zstd", 3).label
    'zstd:3'
    """

    name: str
    level: int = 0

    @property
    def number(self) -> int:
        return LZ4 if self.name == "lz4" else ZSTD

    @property
    def label(self) -> str:
        return self.name if self.name == "lz4" else f"zstd:{self.level}"

    def squeeze(self, data: Any) -> bytes:
        """``data`` compressed (bytes)."""
        if self.name == "lz4":
            return bytes(cramjam.lz4.compress_block(data, store_size=False))
        return bytes(cramjam.zstd.compress(data, level=self.level))


def parse_compress(text: str) -> str | Codec | None:
    """``--compress``: ``"auto"``, None for ``off``, or the codec of ``lz4``,
    ``zstd`` (level 1) or ``zstd:LEVEL``. Raises ``ValueError`` saying what was expected.

    Examples
    --------
    >>> parse_compress("zstd:5"), parse_compress("off"), parse_compress("auto")
    (Codec(name='zstd', level=5), None, 'auto')
    """
    name, _, level = text.partition(":")
    if text in ("auto", "off"):
        return None if text == "off" else "auto"
    if name == "lz4" and not level:
        return Codec("lz4")
    if name == "zstd":
        try:
            number = int(level) if level else 1
        except ValueError:
            number = ZSTD_LEVELS.start - 1
        if number in ZSTD_LEVELS:
            return Codec("zstd", number)
    raise ValueError(f"expected auto, off, lz4, zstd or zstd:LEVEL (LEVEL {ZSTD_LEVELS.start} "
                     f"to {ZSTD_LEVELS.stop - 1}), got {text!r}")


def compress_frames(frames: Sequence[Any], codec: Codec, seq: int | None = None) -> list[Any]:
    """The compressed message of an encoded message's ``frames`` (see the module);
    ``seq``, the inner header's, is repeated in the compressed header for a relay.

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, decode, encode
    >>> frames = encode(Data(np.array([[1, 0]]), [{"x": np.zeros(4096)}]))
    >>> wire = compress_frames(frames, Codec("lz4"))
    >>> len(wire[-1]) < 1000, float(decode(wire).samples[0]["x"].sum())
    (True, 0.0)
    """
    codecs, sizes, out = [], [], []
    for index, frame in enumerate(frames):
        data = view(frame)
        size = len(data)
        squeezed = (codec.squeeze(data)
                    if size >= MIN_COMPRESSED_FRAME and index != _STORED_FRAME else None)
        if squeezed is not None and len(squeezed) < size:
            codecs.append(codec.number)
            out.append(squeezed)
        else:
            codecs.append(STORED)
            out.append(frame)
        sizes.append(size)
    fields: dict[str, Any] = {"v": PROTOCOL_VERSION, "k": COMPRESSED, "c": codecs, "n": sizes}
    if seq is not None:
        fields["s"] = seq
    return [msgpack.packb(fields), *out]


def packed(frames: Sequence[Any]) -> dict[str, Any] | None:
    """The header of a compressed message as our compressor writes it (``c``, ``n``, and
    ``s`` when it was given), or None for any other message (one look at 7 bytes).

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, encode
    >>> frames = encode(Data(np.array([[1, 0]]), [{"x": np.zeros(4096)}]))
    >>> packed(frames), packed(compress_frames(frames, Codec("lz4"), seq=7))["s"]
    (None, 7)
    """
    if not frames:
        return None
    head = bytes(view(frames[0])[:7])
    if len(head) != 7 or not 0x80 <= head[0] <= 0x8F or head[1:] != _PREFIX:
        return None
    header = msgpack.unpackb(view(frames[0]))
    _checked_lists(header, len(frames) - 1)
    return dict(header)


def inflate_frames(frames: Sequence[Any], header: dict[str, Any] | None = None) -> list[Any]:
    """The inner message of a compressed message that this process's peers made (a
    relay's: the limits are the decoder's defaults); ``header`` from :func:`packed`."""
    from feedmux.protocol._decode import DEFAULT_LIMITS as limits  # it imports this module

    header = packed(frames) if header is None else header
    if header is None:
        raise ProtocolError("not a compressed message")
    return inflate(header, frames[1:], limits.max_frames - 1, limits.max_message_bytes)


def _checked_lists(header: dict[Any, Any], count: int) -> tuple[list[int], list[int]]:
    codecs, sizes = header.get("c"), header.get("n")
    for name, values in (("c", codecs), ("n", sizes)):
        if type(values) is not list or len(values) != count:
            raise ProtocolError(f"compressed message: expected {count} values under {name!r} "
                                f"(one per frame), got {short(values)}")
        if not all(type(value) is int and value >= 0 for value in values):
            raise ProtocolError(f"compressed message: expected sizes and codecs as "
                                f"non-negative ints under {name!r}, got {short(values)}")
    assert isinstance(codecs, list) and isinstance(sizes, list)
    return codecs, sizes


def inflate(header: dict[Any, Any], frames: Sequence[Any], max_frames: int,
            max_bytes: int) -> list[Any]:
    """The inner message's frames of a compressed message (``header`` decoded, ``frames``
    the rest), within ``max_frames`` frames and ``max_bytes`` bytes inflated (checked
    before anything is allocated)."""
    count = len(frames)
    if count == 0 or count > max_frames:
        raise ProtocolError(f"compressed message of {count} frames: expected 1 to "
                            f"{max_frames}")
    codecs, sizes = _checked_lists(header, count)
    total = sum(sizes)
    if total > max_bytes:
        raise ProtocolError(f"compressed message would inflate to {total} bytes, limit is "
                            f"{max_bytes}: refused before inflating")
    inner: list[Any] = []
    for index, (frame, codec, size) in enumerate(zip(frames, codecs, sizes, strict=True)):
        data = view(frame)
        if codec == STORED:
            if len(data) != size:
                raise ProtocolError(f"compressed message: stored frame {index} has "
                                    f"{len(data)} bytes, its size says {size}")
            inner.append(frame)
            continue
        if codec not in (LZ4, ZSTD):
            raise ProtocolError(f"compressed message: unknown codec {codec} of frame {index} "
                                f"(expected 0 stored, 1 lz4, 2 zstd)")
        inner.append(_inflated(data, codec, size, index))
    return inner


def _inflated(data: Any, codec: int, size: int, index: int) -> bytearray:
    out = bytearray(size)
    try:
        if codec == LZ4:
            written = cramjam.lz4.decompress_block_into(data, out)
        else:
            written = cramjam.zstd.decompress_into(data, out)
    except Exception as error:  # cramjam.DecompressionError, or a frame that overflows
        raise ProtocolError(f"compressed frame {index} does not inflate to its declared "
                            f"{size} bytes: {error}") from None
    if written != size:
        raise ProtocolError(f"compressed frame {index} inflated to {written} bytes, its size "
                            f"says {size}")
    return out
