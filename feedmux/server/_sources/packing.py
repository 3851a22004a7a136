"""Compression in the sampling workers: the codec the server asks for, and a worker's use of it.

With ``--workers N`` the server tells its workers, through one shared integer written
before the fork (:class:`SharedCodec`, read by every worker before each message it
forwards: no message of its own), the codec its socket links want now
(:meth:`~feedmux.server._delivery.compression.LinkCompression.worker_codec`), and only
while it sends the workers' messages on as they are (:func:`passes_through`: free
trainers, no server-side batches, no consumer groups); none
otherwise. A worker compresses each data message it forwards with that codec
(:func:`pack`) unless the message is small (under ``MIN_MESSAGE``) or a trainer maps
the shared-memory pool (its large arrays go as references then; the server compresses
for the other links itself). The compressed form keeps the tags frame stored and repeats
the header's ``seq``, so the server merges and renumbers it without inflating; with
``zstd:LEVEL+delta`` it is the form the server would make itself (the same
:func:`~feedmux.protocol.compress_frames`, the filter's strides chosen from the message's
own header). It never decides which codec a link gets (the server's
:mod:`~feedmux.server._delivery.compression` does) and never sends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from feedmux.protocol import Codec, compress_frames
from feedmux.protocol._compress import LZ4, ZSTD_LEVELS
from feedmux.server._delivery.compression import MIN_MESSAGE

__all__ = ["SharedCodec", "pack", "passes_through"]

#: The shared integer of zstd at level L is ZSTD_BASE + L (levels -7 to 22), of zstd with
#: the delta filter DELTA_BASE + L; 0 is none.
ZSTD_BASE = 100
DELTA_BASE = 200


class SharedCodec:
    """One codec (or none) shared by the server and its forked workers.

    ``raw_value`` is ``multiprocessing``'s ``RawValue`` of the fork context: one aligned
    integer, written by the server and read by the workers without a lock (a read sees
    the old value or the new one).

    Examples
    --------
    >>> import multiprocessing
    >>> shared = SharedCodec(multiprocessing.get_context("fork").RawValue)
    >>> shared.read(), shared.publish(Codec("zstd", 3)), shared.read().label
    (None, None, 'zstd:3')
    >>> shared.publish(Codec("zstd", -2, delta=True)); shared.read().label
    'zstd:-2+delta'
    """

    def __init__(self, raw_value: Callable[..., Any]) -> None:
        self._value = raw_value("i", 0)

    def publish(self, codec: Codec | None) -> None:
        code = (0 if codec is None else LZ4 if codec.name == "lz4" else
                (DELTA_BASE if codec.delta else ZSTD_BASE) + codec.level)
        if self._value.value != code:
            self._value.value = code

    def read(self) -> Codec | None:
        code = self._value.value
        if code == 0:
            return None
        if code == LZ4:
            return Codec("lz4")
        delta = code >= DELTA_BASE + ZSTD_LEVELS.start
        return Codec("zstd", code - (DELTA_BASE if delta else ZSTD_BASE), delta=delta)


def passes_through(ranked: bool, batches: bool, groups: bool) -> bool:
    """Whether the server sends the workers' messages on as they are (only then do the
    workers compress): not to ranks, not cut into server-side batches, not while named
    consumer groups read (the free trainers without a group take them as they are)."""
    return not (ranked or batches or groups)


def pack(frames: Sequence[Any], codec: Codec | None) -> Sequence[Any]:
    """A worker's data message compressed with ``codec`` for the server to send on, or
    ``frames`` (no codec, not a data message, or too small to gain).

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, encode, packed, read_tags
    >>> frames = encode(Data(np.array([[1, 0]]), [{"x": np.zeros(1 << 15)}], seq=9))
    >>> wire = pack(frames, Codec("lz4"))
    >>> packed(wire)["s"], read_tags(wire).tolist(), pack(frames, None) is frames
    (9, [[1, 0]], True)
    """
    if codec is None or len(frames) < 2:
        return frames
    if sum(memoryview(frame).nbytes for frame in frames) < MIN_MESSAGE:
        return frames
    seq = msgpack.unpackb(memoryview(frames[0]))["seq"]
    return compress_frames(frames, codec, seq=seq)
