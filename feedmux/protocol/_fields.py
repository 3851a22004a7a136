"""The header fields of control messages: which fields each kind has, and their checks.

This module owns the rule for every field that travels in a header: what a
decoder accepts (exact msgpack types: a bool is not an int, an int fits
msgpack's range) and how an encoder normalizes what it is given (a numpy int
becomes an int, a list of seqs a tuple). One :class:`ControlSpec` per control
kind ties a message class to its kind number and its field checks. It never
touches bytes: the encoder and the decoder call it with plain values.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol._messages import (
    PROTOCOL_VERSION,
    Ack,
    Credit,
    Drain,
    EndOfEpoch,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Kind,
    Message,
    Scale,
    ShmAttach,
    ShmOffer,
    Stats,
    StatsRequest,
    Welcome,
)

__all__ = [
    "CONTROL_BY_CLASS",
    "CONTROL_BY_KIND",
    "INT",
    "INT_MAX",
    "INT_MIN",
    "STR",
    "ControlSpec",
    "Field",
]

# The range of a msgpack integer.
INT_MIN = -(2**63)
INT_MAX = 2**64 - 1


class Field:
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
    return type(value) is int and INT_MIN <= value <= INT_MAX


def _to_int(value: Any) -> Any:
    return _INVALID if isinstance(value, (bool, np.bool_)) else operator.index(value)


def _to_str(value: Any) -> Any:
    return str(value) if isinstance(value, str) else _INVALID


def _to_bool(value: Any) -> Any:
    return bool(value) if isinstance(value, (bool, np.bool_)) else _INVALID


def _to_optional_int(value: Any) -> Any:
    return None if value is None else _to_int(value)


def _is_fraction(value: Any) -> bool:
    # NaN fails both comparisons: a peer cannot send one.
    return value is None or (type(value) is float and 0.0 <= value <= 1.0)


def _to_fraction(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return _INVALID
    return float(value)


def _is_stat_value(value: Any) -> bool:
    if type(value) is int:
        return INT_MIN <= value <= INT_MAX
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


STR = Field("a str", lambda value: type(value) is str, _to_str)
INT = Field("an int", _is_int, _to_int)
_BOOL = Field("a bool", lambda value: type(value) is bool, _to_bool)
_OPTIONAL_INT = Field("an int or None", lambda v: v is None or _is_int(v), _to_optional_int)
_STATS = Field("a dict of str to int, float, str or None", _is_stats, _to_stats)
_INTS = Field("a sequence of ints", _is_ints, _to_ints)
_FRACTION = Field("a float from 0 to 1 or None", _is_fraction, _to_fraction)


class ControlSpec:
    """The kind, class and field checks of one control message.

    Examples
    --------
    >>> spec = CONTROL_BY_CLASS[Hello]
    >>> header = spec.header(Hello(client_id="c"))
    >>> header
    {'v': 1, 'k': 2, 'client_id': 'c', 'role': 'trainer', 'world_size': 1}
    >>> spec.message(header) == Hello(client_id="c")
    True
    """

    def __init__(self, kind: Kind, cls: type, *, omit_default: tuple[str, ...] = (),
                 **field_checks: Field) -> None:
        self.kind = kind
        self.cls = cls
        # Fields added after a kind's golden bytes were pinned: written only when they
        # differ from their default, so a message that does not use them keeps its bytes.
        self.omit_default = {item.name: item.default for item in fields(cls)
                             if item.name in omit_default}
        names = [item.name for item in fields(cls)]
        assert sorted(names) == sorted(field_checks), cls
        self.fields = [(name, field_checks[name]) for name in names]
        self.required = frozenset(
            item.name
            for item in fields(cls)
            if item.default is MISSING and item.default_factory is MISSING
        )

    def header(self, message: Message) -> dict[str, Any]:
        """The header map of ``message``: version, kind, then its fields in class order."""
        header: dict[str, Any] = {"v": PROTOCOL_VERSION, "k": int(self.kind)}
        omit = self.omit_default
        for name, check in self.fields:
            value = getattr(message, name)
            if omit and name in omit and value == omit[name]:
                continue
            header[name] = check.coerce(value, name, self.cls)
        return header

    def message(self, header: dict[Any, Any]) -> Message:
        """The message a decoded header describes; a missing or mistyped field raises."""
        arguments: dict[str, Any] = {}
        for name, check in self.fields:
            if name in header:
                value = header[name]
                if type(value) is list and check is _INTS:
                    value = tuple(value)
                if not check.accepts(value):
                    raise ProtocolError(
                        f"{self.cls.__name__}.{name} must be {check.name}, "
                        f"got {type(value).__qualname__}"
                    )
                arguments[name] = value
            elif name in self.required:
                raise ProtocolError(f"{self.cls.__name__} message without {name!r}")
        message: Message = self.cls(**arguments)
        return message


_CONTROL_SPECS = [
    ControlSpec(Kind.HELLO, Hello, client_id=STR, role=STR, world_size=INT, rank=INT,
                group=STR, resume=_INTS, handed=_INTS, batch_size=INT, drop_last=_BOOL,
                handed_below=_INTS, bucket_by=STR, codecs=_INTS, predecessor=_INTS,
                predecessor_server=STR,
                omit_default=("rank", "group", "resume", "handed", "batch_size", "drop_last",
                              "handed_below", "bucket_by", "codecs", "predecessor",
                              "predecessor_server")),
    ControlSpec(
        Kind.WELCOME,
        Welcome,
        server_id=STR,
        epoch_size=_OPTIONAL_INT,
        epoch=INT,
        samples_per_message=INT,
        finished=_BOOL,
        workers=INT,
        reliable=_BOOL,
        world_size=INT,
        uneven=STR,
        unknown=_BOOL,
        omit_default=("world_size", "uneven", "unknown"),
    ),
    ControlSpec(Kind.HEARTBEAT, Heartbeat, sender_id=STR, received_messages=INT, group=STR,
                handed_below=_INTS, wait_fraction=_FRACTION,
                omit_default=("group", "handed_below", "wait_fraction")),
    ControlSpec(Kind.ERROR, Error, type=STR, message=STR, traceback=STR, server_id=STR),
    ControlSpec(Kind.STATS_REQUEST, StatsRequest, client_id=STR, after=STR,
                omit_default=("after",)),
    ControlSpec(Kind.STATS, Stats, values=_STATS),
    ControlSpec(Kind.END_OF_EPOCH, EndOfEpoch, epoch=INT, count=INT, worker=INT),
    ControlSpec(Kind.DRAIN, Drain, sent_messages=INT, server_id=STR),
    ControlSpec(Kind.END_OF_STREAM, EndOfStream, server_id=STR, epochs=INT, sent_messages=INT),
    ControlSpec(Kind.CREDIT, Credit, credits=INT, client_id=STR),
    ControlSpec(Kind.ACK, Ack, seqs=_INTS, client_id=STR, server_id=STR, rank=INT, epoch=INT,
                position=INT, omit_default=("server_id", "rank", "epoch", "position")),
    ControlSpec(Kind.SHM_OFFER, ShmOffer, path=STR, server_id=STR),
    ControlSpec(Kind.SHM_ATTACH, ShmAttach, token=STR, client_id=STR, pid_namespace=INT,
                omit_default=("pid_namespace",)),
    ControlSpec(Kind.SCALE, Scale, workers=INT, client_id=STR),
]
CONTROL_BY_CLASS: dict[type, ControlSpec] = {spec.cls: spec for spec in _CONTROL_SPECS}
CONTROL_BY_KIND: dict[int, ControlSpec] = {int(spec.kind): spec for spec in _CONTROL_SPECS}
