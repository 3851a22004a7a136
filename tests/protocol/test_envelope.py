"""The envelope of the reliable data socket: the sequence-number frame before a message."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    ENVELOPE_BYTES,
    Heartbeat,
    decode,
    encode,
    pack_envelope,
    unpack_envelope,
)


@pytest.mark.parametrize("seq", [0, 1, 255, 256, 2**32, 2**63, 2**64 - 1])
def test_pack_then_unpack_gives_the_seq_back(seq: int) -> None:
    frame = pack_envelope(seq)
    assert len(frame) == ENVELOPE_BYTES == 8
    assert unpack_envelope([frame]) == (seq, [])


def test_the_envelope_is_a_little_endian_u64() -> None:
    assert pack_envelope(0x0102030405060708) == bytes.fromhex("0807060504030201")
    assert pack_envelope(0) == bytes(8)


def test_numpy_ints_are_sequence_numbers() -> None:
    assert pack_envelope(np.uint64(2**64 - 1)) == b"\xff" * 8  # type: ignore[arg-type]
    assert pack_envelope(np.int64(5)) == pack_envelope(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("seq", [-1, 2**64, 2**70, True, 1.0, "1", None])
def test_pack_refuses_what_is_not_a_u64(seq: Any) -> None:
    with pytest.raises(ProtocolError, match=r"int in \[0, 2\*\*64\)") as raised:
        pack_envelope(seq)
    assert isinstance(raised.value, ValueError)


def test_unpack_returns_the_message_frames_as_given() -> None:
    message = encode(Heartbeat(sender_id="s1"))
    header = bytearray(message[0])
    seq, rest = unpack_envelope((pack_envelope(9), header))
    assert seq == 9
    assert type(rest) is list
    assert rest[0] is header
    assert decode(rest) == Heartbeat(sender_id="s1")


def test_unpack_reads_zmq_frame_like_objects_through_their_buffer() -> None:
    class FrameLike:
        def __init__(self, data: bytes) -> None:
            self.buffer = memoryview(bytearray(data))

    frames = [FrameLike(pack_envelope(42)), FrameLike(b"rest")]
    seq, rest = unpack_envelope(frames)
    assert seq == 42
    assert rest == [frames[1]]


def test_unpack_reads_zmq_frames() -> None:
    import zmq  # the loader's input; the protocol package itself never imports zmq

    frames = [zmq.Frame(pack_envelope(2**64 - 1)), zmq.Frame(b"header")]
    seq, rest = unpack_envelope(frames)
    assert seq == 2**64 - 1
    assert rest == [frames[1]]
    with pytest.raises(ProtocolError, match="got 3 bytes"):
        unpack_envelope([zmq.Frame(b"abc")])


def test_unpack_without_frames_says_what_it_expected() -> None:
    with pytest.raises(ProtocolError, match="expected an envelope frame of 8 bytes, got an empty"):
        unpack_envelope([])


@pytest.mark.parametrize("size", [0, 1, 7, 9, 16])
def test_unpack_refuses_an_envelope_of_another_size(size: int) -> None:
    with pytest.raises(
        ProtocolError, match=f"expected an envelope frame of 8 bytes, got {size} bytes"
    ):
        unpack_envelope([bytes(size), b"header"])


def test_unpack_refuses_a_first_frame_without_bytes() -> None:
    with pytest.raises(ProtocolError, match="expected an envelope frame of 8 bytes, got int"):
        unpack_envelope([12345])
