"""Control messages, kinds, versions and header validation."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedmux.errors import ProtocolError, VersionMismatchError
from feedmux.protocol import (
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
    Stats,
    StatsRequest,
    Welcome,
    decode,
    encode,
)

CONTROL_MESSAGES = [
    Hello(client_id="trainer-0"),
    Hello(client_id="rank-3", role="observer", world_size=8),
    Welcome(server_id="s1"),
    Welcome(
        server_id="s1", epoch_size=1000, epoch=3, samples_per_message=64, finished=True, workers=4
    ),
    Heartbeat(sender_id="s1", received_messages=12345),
    Error(type="builtins.ValueError", message="bad sample", traceback="Traceback ...\n"),
    Error(type="KeyError", message="'x'", server_id="s2"),
    StatsRequest(),
    StatsRequest(client_id="c"),
    Stats(values={"sent": 10, "rate": 1.5, "name": "s1", "epoch_size": None, "ok": True}),
    Stats(values={}),
    EndOfEpoch(epoch=2, count=500),
    EndOfEpoch(epoch=2, count=500, worker=3),
    Drain(sent_messages=99),
    Drain(sent_messages=99, server_id="s1"),
    EndOfStream(server_id="s1"),
    EndOfStream(server_id="s1", epochs=5, sent_messages=1000),
    Credit(credits=16),
    Credit(credits=16, client_id="c"),
    Ack(seqs=(1, 2, 3)),
    Ack(seqs=(), client_id="c"),
]


@pytest.mark.parametrize("message", CONTROL_MESSAGES, ids=repr)
def test_control_message_round_trip(message: object) -> None:
    frames = encode(message)  # type: ignore[arg-type]
    assert len(frames) == 1
    assert decode(frames) == message
    assert decode([bytearray(frames[0])]) == message
    assert decode([memoryview(frames[0])]) == message


def test_header_starts_with_version_and_kind() -> None:
    header = msgpack.unpackb(encode(Heartbeat(sender_id="x"))[0])
    assert list(header)[:2] == ["v", "k"]
    assert header["v"] == PROTOCOL_VERSION
    assert header["k"] == Kind.HEARTBEAT


def test_encode_accepts_numpy_ints_and_list_seqs() -> None:
    message = Ack(seqs=[np.int64(4), 5], client_id="c")  # type: ignore[list-item]
    assert decode(encode(message)) == Ack(seqs=(4, 5), client_id="c")
    welcome = Welcome(server_id="s", epoch_size=np.int32(7))  # type: ignore[arg-type]
    decoded = decode(encode(welcome))
    assert isinstance(decoded, Welcome)
    assert decoded.epoch_size == 7
    assert type(decoded.epoch_size) is int


def test_stats_values_from_numpy_become_plain() -> None:
    decoded = decode(encode(Stats(values={"a": np.float32(0.5), "b": np.int64(3)})))  # type: ignore[dict-item]
    assert isinstance(decoded, Stats)
    assert decoded.values == {"a": 0.5, "b": 3}
    assert type(decoded.values["a"]) is float


@pytest.mark.parametrize(
    "message",
    [
        Hello(client_id=3),  # type: ignore[arg-type]
        Welcome(server_id="s", finished=1),  # type: ignore[arg-type]
        Heartbeat(sender_id="x", received_messages="many"),  # type: ignore[arg-type]
        Heartbeat(sender_id="x", received_messages=True),  # type: ignore[arg-type]
        Heartbeat(sender_id="x", wait_fraction=1.5),
        Heartbeat(sender_id="x", wait_fraction=-0.1),
        Heartbeat(sender_id="x", wait_fraction=float("nan")),
        Heartbeat(sender_id="x", wait_fraction=True),  # type: ignore[arg-type]
        Heartbeat(sender_id="x", wait_fraction="0.5"),  # type: ignore[arg-type]
        Stats(values={"a": [1, 2]}),  # type: ignore[dict-item]
        Stats(values={1: 2}),  # type: ignore[dict-item]
        Ack(seqs="123"),
        Credit(credits=2**70),
    ],
    ids=repr,
)
def test_encode_refuses_wrong_field_types(message: object) -> None:
    with pytest.raises(ProtocolError):
        encode(message)  # type: ignore[arg-type]


def test_encode_refuses_non_messages() -> None:
    with pytest.raises(ProtocolError, match="not a message"):
        encode({"k": 1})  # type: ignore[arg-type]


def _header(**fields: object) -> list[bytes]:
    return [msgpack.packb({"v": 1, **fields})]


def test_version_mismatch_names_both_versions() -> None:
    with pytest.raises(VersionMismatchError, match="expected protocol version 1, got 7"):
        decode([msgpack.packb({"v": 7, "k": 2, "client_id": "x"})])


def test_version_mismatch_is_checked_before_anything_else() -> None:
    # A future version may use other ext codes, other kinds and other frame layouts:
    # none of that may be read before the version is known to be ours.
    header = msgpack.packb(
        {"k": 99, "v": 2, "samples": [msgpack.ExtType(42, b"?")]}, use_bin_type=True
    )
    with pytest.raises(VersionMismatchError, match="expected protocol version 1, got 2"):
        decode([header, b"x", b"y"])


@pytest.mark.parametrize("version", [None, "1", 1.0, -1, 2**40, [1]])
def test_odd_versions_are_mismatches(version: object) -> None:
    with pytest.raises(VersionMismatchError, match="expected protocol version 1"):
        decode([msgpack.packb({"v": version, "k": 2, "client_id": "x"})])


def test_header_without_version() -> None:
    with pytest.raises(ProtocolError, match="protocol version"):
        decode([msgpack.packb({"k": 2, "client_id": "x"})])
    with pytest.raises(ProtocolError):
        decode([msgpack.packb([1, 2])])


def test_header_with_version_in_another_position_is_accepted() -> None:
    header = msgpack.packb({"k": 2, "client_id": "x", "v": 1})
    assert decode([header]) == Hello(client_id="x")


@pytest.mark.parametrize("kind", [0, 17, 1000, -1, "hello", None, 2.0])
def test_unknown_kind(kind: object) -> None:
    with pytest.raises(ProtocolError, match="unknown message kind") as raised:
        decode(_header(k=kind, client_id="x"))
    assert not isinstance(raised.value, VersionMismatchError)


def test_missing_required_field() -> None:
    with pytest.raises(ProtocolError, match="client_id"):
        decode(_header(k=int(Kind.HELLO)))


def test_unknown_fields_are_ignored() -> None:
    # New fields get defaults, so an older decoder must accept a newer sender's extras.
    assert decode(_header(k=int(Kind.HELLO), client_id="x", shiny=[1, 2])) == Hello("x")


@pytest.mark.parametrize(
    "fields",
    [
        {"k": int(Kind.HELLO), "client_id": b"x"},
        {"k": int(Kind.WELCOME), "server_id": "s", "finished": 1},
        {"k": int(Kind.WELCOME), "server_id": "s", "epoch_size": "10"},
        {"k": int(Kind.HEARTBEAT), "sender_id": "s", "received_messages": True},
        {"k": int(Kind.HEARTBEAT), "sender_id": "s", "wait_fraction": 2.0},
        {"k": int(Kind.HEARTBEAT), "sender_id": "s", "wait_fraction": float("nan")},
        {"k": int(Kind.HEARTBEAT), "sender_id": "s", "wait_fraction": float("inf")},
        {"k": int(Kind.HEARTBEAT), "sender_id": "s", "wait_fraction": 1},
        {"k": int(Kind.HEARTBEAT), "sender_id": "s", "wait_fraction": False},
        {"k": int(Kind.HEARTBEAT), "sender_id": "s", "wait_fraction": "0.5"},
        {"k": int(Kind.STATS), "values": {"a": [1]}},
        {"k": int(Kind.STATS), "values": {1: 1}},
        {"k": int(Kind.STATS), "values": [1]},
        {"k": int(Kind.ACK), "seqs": [1, "2"]},
        {"k": int(Kind.ACK), "seqs": 5},
        {"k": int(Kind.END_OF_EPOCH), "epoch": 1.5, "count": 1},
    ],
    ids=repr,
)
def test_decode_refuses_wrong_field_types(fields: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match="must be"):
        decode(_header(**fields))


def test_the_wait_fraction_of_a_heartbeat_is_optional_both_ways() -> None:
    # An older trainer's heartbeat (no wait_fraction) decodes with None; a newer one's
    # is one more header entry, which an older server skips as an unknown field.
    old = decode(_header(k=int(Kind.HEARTBEAT), sender_id="t", received_messages=3))
    assert old == Heartbeat(sender_id="t", received_messages=3, wait_fraction=None)
    assert "wait_fraction" not in msgpack.unpackb(encode(Heartbeat(sender_id="t"))[0])
    beat = Heartbeat(sender_id="t", wait_fraction=np.float32(0.5))  # type: ignore[arg-type]
    decoded = decode(encode(beat))
    assert isinstance(decoded, Heartbeat) and decoded.wait_fraction == 0.5
    assert type(decoded.wait_fraction) is float
    for edge in (0.0, 1.0):
        assert decode(encode(Heartbeat(sender_id="t", wait_fraction=edge))) == Heartbeat(
            sender_id="t", wait_fraction=edge)


@given(st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_a_wait_fraction_decodes_only_from_0_to_1(value: float) -> None:
    header = _header(k=int(Kind.HEARTBEAT), sender_id="t", wait_fraction=value)
    if 0.0 <= value <= 1.0:
        decoded = decode(header)
        assert isinstance(decoded, Heartbeat) and decoded.wait_fraction == value
    else:
        with pytest.raises(ProtocolError, match="wait_fraction must be a float from 0 to 1"):
            decode(header)


def test_control_message_with_extra_frames() -> None:
    frames = encode(Hello(client_id="x"))
    with pytest.raises(ProtocolError, match="frames"):
        decode([*frames, b""])


def test_messages_are_frozen_and_keyword_friendly() -> None:
    hello = Hello(client_id="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hello.client_id = "y"  # type: ignore[misc]
    for cls in (Hello, Welcome, Heartbeat, Error, EndOfEpoch, Drain, EndOfStream, Credit, Ack):
        required = [
            item.name
            for item in dataclasses.fields(cls)
            if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
        ]
        assert len(required) <= 2, cls


def test_data_fields_positional() -> None:
    data = Data(np.zeros((1, 2), dtype=np.int64), [1], "s", 5)
    assert (data.server_id, data.seq) == ("s", 5)
