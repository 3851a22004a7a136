"""The envelope of the data socket: a sequence-number frame before a message.

Every message a server sends a trainer on the data socket is
preceded by one frame of :data:`ENVELOPE_BYTES` bytes: the message's sequence
number as a little-endian unsigned integer, 0 when the message wants no
acknowledgement (a heartbeat, an end of stream). This module owns that frame,
both ways; it never decodes the message behind it and never decides which
messages are acknowledged (that is the server's and the loader's business).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from feedmux.errors import ProtocolError
from feedmux.protocol._frames import FrameLike, short, view

__all__ = ["ENVELOPE_BYTES", "pack_envelope", "unpack_envelope"]

#: The size of the envelope frame: one little-endian u64.
ENVELOPE_BYTES = 8


def pack_envelope(seq: int) -> bytes:
    """The envelope frame of a message with sequence number ``seq`` (0: no ack wanted).

    Raises :class:`~feedmux.errors.ProtocolError` (a ``ValueError``) unless
    ``seq`` is an int in ``[0, 2**64)``.

    Examples
    --------
    >>> pack_envelope(258).hex()
    '0201000000000000'
    """
    try:
        # A numpy int is a sequence number; a bool, though an int to Python, is not.
        number = seq if type(seq) is int else operator.index(_not_bool(seq))
        return number.to_bytes(ENVELOPE_BYTES, "little")
    except (OverflowError, TypeError):
        raise ProtocolError(
            f"envelope sequence number must be an int in [0, 2**64), got {short(seq)}"
        ) from None


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise TypeError("a bool is not a sequence number")
    return value


def unpack_envelope(frames: Sequence[FrameLike]) -> tuple[int, list[Any]]:
    """Split a message from the data socket into its sequence number and frames.

    Returns ``(seq, rest)``: ``rest`` holds the frames of the encoded message, as
    they were given (zmq ``Frame`` objects stay ``Frame`` objects). Raises
    :class:`~feedmux.errors.ProtocolError` when there is no frame or the first
    frame is not exactly :data:`ENVELOPE_BYTES` bytes.

    Examples
    --------
    >>> unpack_envelope([pack_envelope(7), b"header"])
    (7, [b'header'])
    """
    if len(frames) == 0:
        raise ProtocolError(
            f"expected an envelope frame of {ENVELOPE_BYTES} bytes, got an empty message"
        )
    envelope = frames[0]
    if type(envelope) is not bytes:
        # A zmq Frame keeps its bytes at hand: for 8 bytes that is cheaper than a view.
        raw = getattr(envelope, "bytes", None)
        envelope = raw if type(raw) is bytes else _as_bytes(envelope)
    if len(envelope) != ENVELOPE_BYTES:
        raise ProtocolError(
            f"expected an envelope frame of {ENVELOPE_BYTES} bytes, got {len(envelope)} bytes"
        )
    rest = frames[1:]
    return int.from_bytes(envelope, "little"), rest if type(rest) is list else list(rest)


def _as_bytes(frame: Any) -> memoryview | bytes:
    try:
        return view(frame)
    except TypeError:
        raise ProtocolError(
            f"expected an envelope frame of {ENVELOPE_BYTES} bytes, "
            f"got {type(frame).__qualname__}"
        ) from None
