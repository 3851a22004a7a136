"""Compressed data messages (wire kind 15): what a slow link carries instead of the frames.

This module owns the compressed form of an encoded message and its limits. A compressed
message is frame 0, a msgpack header ``{"v": 1, "k": 15, "c": [codec, ...], "n": [size,
...]}``, then one frame per frame of the inner message (an encoded :class:`Data`, its own
header and tags included): ``c`` names each frame's codec (0 stored as it is, 1 an LZ4
block, 2 a zstd frame, 3 a zstd frame of delta-filtered bytes) and ``n`` its size once
inflated. A message with a frame of codec 3 has ``f`` too, per frame the byte strides of
its filter (``[]`` for none), which the decoder undoes in place after inflating
(:mod:`feedmux.protocol._delta`); a message without one is written as before. Filtered
frames have a codec of their own so that a decoder older than the filter refuses them
(unknown codec) instead of handing its trainer the filtered bytes as pixels.

The filter is zstd's only (``zstd:LEVEL+delta``, :attr:`Codec.delta`): it turns the
small differences between neighbouring pixels into bytes that an entropy coder packs
(photographs: zstd level 1 keeps 0.54 of the bytes filtered, 0.79 not), while LZ4, which
has no entropy coder, gains nothing from it. The compressor picks the strides from the
inner header's description of each array frame, by rule (integer arrays shaped like
images or rows, :func:`~feedmux.protocol._delta.strides_for`), without trying the frame
both ways: that would double the time of the compression, and whether the filter pays for
the stream is measured where it is chosen (``auto``,
:mod:`feedmux.server._delivery.compression`). A frame under
:data:`MIN_COMPRESSED_FRAME` bytes, or one that does not shrink, is stored, and so is the
inner message's tags frame, always: a relay (the server forwarding what its sampling
workers compressed) reads and rewrites the tags without inflating (:func:`packed`), and
finds the inner header's ``seq`` repeated under ``s`` when the compressor was given it.

Decompression bombs: every declared size is checked against the decoder's
:class:`~feedmux.protocol.Limits` (frame count, bytes of the whole message) *before*
anything is allocated, and each frame is inflated into a buffer of exactly its declared
size, which the codec cannot write past (a frame that would inflate further, or less, is a
:class:`~feedmux.errors.ProtocolError`); a filter's strides are checked with the sizes
(at most :data:`~feedmux.protocol._delta.MAX_FILTERS`, each positive, at most
:data:`~feedmux.protocol._delta.MAX_STRIDE` and dividing the frame's size, and only on a
frame of codec 3, which must have one). A compressed message inside a compressed message
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
from feedmux.protocol._delta import MAX_FILTERS, MAX_STRIDE, filtered, frame_strides, unfilter
from feedmux.protocol._frames import short, view
from feedmux.protocol._messages import PROTOCOL_VERSION, Kind

__all__ = ["COMPRESSED", "INFLATES", "MIN_COMPRESSED_FRAME", "STORED", "Codec", "compress_frames",
           "inflate", "inflate_frames", "packed", "parse_compress"]

COMPRESSED = int(Kind.COMPRESSED)
STORED, LZ4, ZSTD, ZSTD_FILTERED = 0, 1, 2, 3
#: The codecs this decoder inflates, which a trainer tells its server in its hello
#: (:attr:`~feedmux.protocol.Hello.codecs`): a server compresses a trainer's messages only
#: with codecs it named.
INFLATES = (LZ4, ZSTD, ZSTD_FILTERED)
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
    """One compression: ``lz4``, or ``zstd`` at ``level``, after a delta filter of the
    frames that suit one when ``delta`` (zstd only: see the module).

    Examples
    --------
    >>> Codec("zstd", 3).label, Codec("zstd", 1, delta=True).label
    ('zstd:3', 'zstd:1+delta')
    """

    name: str
    level: int = 0
    delta: bool = False

    @property
    def number(self) -> int:
        """The codec of the frames it compresses without a filter."""
        return LZ4 if self.name == "lz4" else ZSTD

    @property
    def numbers(self) -> frozenset[int]:
        """The codecs its messages' frames may have (stored aside)."""
        return frozenset((ZSTD, ZSTD_FILTERED) if self.delta else (self.number,))

    @property
    def label(self) -> str:
        if self.name == "lz4":
            return self.name
        return f"zstd:{self.level}+delta" if self.delta else f"zstd:{self.level}"

    def squeeze(self, data: Any) -> bytes:
        """``data`` compressed (bytes)."""
        if self.name == "lz4":
            return bytes(cramjam.lz4.compress_block(data, store_size=False))
        return bytes(cramjam.zstd.compress(data, level=self.level))


def parse_compress(text: str) -> str | Codec | None:
    """``--compress``: ``"auto"``, None for ``off``, or the codec of ``lz4``,
    ``zstd`` (level 1) or ``zstd:LEVEL``, each zstd one with ``+delta`` after it for the
    delta filter (a codec's :attr:`~Codec.label` reads back as that codec). Raises
    ``ValueError`` saying what was expected.

    Examples
    --------
    >>> parse_compress("zstd:5"), parse_compress("off"), parse_compress("auto")
    (Codec(name='zstd', level=5, delta=False), None, 'auto')
    >>> parse_compress("zstd+delta").label, parse_compress("zstd:3+delta").label
    ('zstd:1+delta', 'zstd:3+delta')
    """
    if text in ("auto", "off"):
        return None if text == "off" else "auto"
    bare = text.removesuffix("+delta")
    name, _, level = bare.partition(":")
    if name == "lz4" and not level and bare == text:
        return Codec("lz4")
    if name == "zstd":
        try:
            number = int(level) if level else 1
        except ValueError:
            number = ZSTD_LEVELS.start - 1
        if number in ZSTD_LEVELS:
            return Codec("zstd", number, delta=bare != text)
    raise ValueError(f"expected auto, off, lz4, zstd or zstd:LEVEL (LEVEL {ZSTD_LEVELS.start} "
                     f"to {ZSTD_LEVELS.stop - 1}; zstd with +delta after it for the delta "
                     f"filter), got {text!r}")


def compress_frames(frames: Sequence[Any], codec: Codec, seq: int | None = None) -> list[Any]:
    """The compressed message of an encoded message's ``frames`` (see the module);
    ``seq``, the inner header's, is repeated in the compressed header for a relay; with
    ``codec.delta``, the array frames that suit a filter are filtered first.

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, decode, encode
    >>> frames = encode(Data(np.array([[1, 0]]), [{"x": np.zeros(4096)}]))
    >>> wire = compress_frames(frames, Codec("lz4"))
    >>> len(wire[-1]) < 1000, float(decode(wire).samples[0]["x"].sum())
    (True, 0.0)
    """
    suits = frame_strides(frames[0]) if codec.delta and frames else {}
    codecs, sizes, filters, out = [], [], [], []
    for index, frame in enumerate(frames):
        data = view(frame)
        size = len(data)
        strides = suits.get(index, ())
        squeezed = None
        if size >= MIN_COMPRESSED_FRAME and index != _STORED_FRAME:
            squeezed = codec.squeeze(filtered(data, strides) if strides else data)
        if squeezed is not None and len(squeezed) < size:
            codecs.append(ZSTD_FILTERED if strides else codec.number)
            filters.append(list(strides))
            out.append(squeezed)
        else:
            codecs.append(STORED)
            filters.append([])
            out.append(frame)
        sizes.append(size)
    fields: dict[str, Any] = {"v": PROTOCOL_VERSION, "k": COMPRESSED, "c": codecs, "n": sizes}
    if seq is not None:
        fields["s"] = seq
    if any(filters):
        fields["f"] = filters
    return [msgpack.packb(fields), *out]


def packed(frames: Sequence[Any]) -> dict[str, Any] | None:
    """The header of a compressed message as our compressor writes it (``c``, ``n``, and
    ``s`` and ``f`` when it was given), or None for any other message (one look at 7 bytes).

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
    filters = _checked_filters(header, codecs, sizes)
    total = sum(sizes)
    if total > max_bytes:
        raise ProtocolError(f"compressed message would inflate to {total} bytes, limit is "
                            f"{max_bytes}: refused before inflating")
    inner: list[Any] = []
    for index, (frame, codec, size, strides) in enumerate(
            zip(frames, codecs, sizes, filters, strict=True)):
        data = view(frame)
        if codec == STORED:
            if len(data) != size:
                raise ProtocolError(f"compressed message: stored frame {index} has "
                                    f"{len(data)} bytes, its size says {size}")
            inner.append(frame)
            continue
        if codec not in (LZ4, ZSTD, ZSTD_FILTERED):
            raise ProtocolError(f"compressed message: unknown codec {codec} of frame {index} "
                                f"(expected 0 stored, 1 lz4, 2 zstd, 3 zstd filtered)")
        out = _inflated(data, codec, size, index)
        if strides:
            unfilter(out, strides)
        inner.append(out)
    return inner


def _checked_filters(header: dict[Any, Any], codecs: list[int],
                     sizes: list[int]) -> list[list[int]]:
    """Per frame, the strides of its filter (checked against its codec and size)."""
    filters = header.get("f")
    if filters is None and ZSTD_FILTERED not in codecs:
        return [[]] * len(codecs)
    if type(filters) is not list or len(filters) != len(codecs):
        raise ProtocolError(f"compressed message: expected {len(codecs)} filters under 'f' "
                            f"(one per frame), got {short(filters)}")
    for index, (strides, codec, size) in enumerate(zip(filters, codecs, sizes, strict=True)):
        if (type(strides) is not list or len(strides) > MAX_FILTERS
                or not all(type(stride) is int and 0 < stride <= MAX_STRIDE
                           and size % stride == 0 for stride in strides)):
            raise ProtocolError(f"compressed message: expected the filter of frame {index} as "
                                f"at most {MAX_FILTERS} strides from 1 to {MAX_STRIDE} that "
                                f"divide its {size} bytes, got {short(strides)}")
        if bool(strides) != (codec == ZSTD_FILTERED):
            raise ProtocolError(f"compressed message: frame {index} of codec {codec} "
                                f"{'has' if strides else 'has no'} filter (expected one on "
                                f"codec 3 only)")
    return filters


def _inflated(data: Any, codec: int, size: int, index: int) -> bytearray:
    out = bytearray(size)
    try:
        if codec == LZ4:
            written = cramjam.lz4.decompress_block_into(data, out)
        else:  # zstd, filtered or not (the caller undoes the filter)
            written = cramjam.zstd.decompress_into(data, out)
    except Exception as error:  # cramjam.DecompressionError, or a frame that overflows
        raise ProtocolError(f"compressed frame {index} does not inflate to its declared "
                            f"{size} bytes: {error}") from None
    if written != size:
        raise ProtocolError(f"compressed frame {index} inflated to {written} bytes, its size "
                            f"says {size}")
    return out
