"""The message classes of wire protocol v1 and their kinds.

This module owns what a message *is*: one frozen dataclass per kind, the
number of each kind on the wire, and the type of every field that travels in
a header. It knows nothing about bytes; the codec module turns these objects
into frames and back.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, Union

import numpy as np

__all__ = [
    "PROTOCOL_VERSION",
    "Ack",
    "Credit",
    "Data",
    "Drain",
    "EndOfEpoch",
    "EndOfStream",
    "Error",
    "Heartbeat",
    "Hello",
    "Kind",
    "Message",
    "ShmAttach",
    "ShmOffer",
    "Stats",
    "StatsRequest",
    "Welcome",
]

#: The version every header carries under the key ``"v"``.
PROTOCOL_VERSION = 1


class Kind(enum.IntEnum):
    """The kind of a message: the number under the header key ``"k"``.

    A number, once used, is never given to another kind, even after the kind
    it named is retired.
    """

    DATA = 1
    HELLO = 2
    WELCOME = 3
    HEARTBEAT = 4
    ERROR = 5
    STATS_REQUEST = 6
    STATS = 7
    END_OF_EPOCH = 8
    DRAIN = 9
    END_OF_STREAM = 10
    CREDIT = 11
    ACK = 12
    SHM_OFFER = 13
    SHM_ATTACH = 14


@dataclass(frozen=True, eq=False, init=False)
class Data:
    """Samples from a server, each with its ``(epoch, position)`` tag.

    ``tags`` is an int64 array of shape ``(n, 2)``: column 0 is the epoch
    (1-based), column 1 the position of the sample within that epoch; one row
    per sample. ``samples`` is a sequence of ``n`` samples; a decoded message
    may hold a lazy :class:`~feedmux.protocol.SampleBatch` here.

    Data messages compare by identity (their fields are arrays).

    Examples
    --------
    >>> import numpy as np
    >>> message = Data(tags=np.array([[1, 0]]), samples=[{"x": 1}])
    >>> len(message.samples), message.tags.shape
    (1, (1, 2))
    """

    tags: np.ndarray
    samples: Sequence[Any]
    server_id: str = ""
    seq: int = 0

    def __init__(
        self, tags: np.ndarray, samples: Sequence[Any], server_id: str = "", seq: int = 0
    ) -> None:
        # A frozen dataclass's own __init__ sets each field through object.__setattr__,
        # which costs more than the rest of building a one-sample message.
        self.__dict__.update(tags=tags, samples=samples, server_id=server_id, seq=seq)


@dataclass(frozen=True)
class Hello:
    """A trainer introduces itself to a server (client to server)."""

    client_id: str
    role: str = "trainer"
    world_size: int = 1


@dataclass(frozen=True)
class Welcome:
    """The server's answer to :class:`Hello`: who it is and what it serves."""

    server_id: str
    epoch_size: int | None = None
    epoch: int = 0
    samples_per_message: int = 1
    finished: bool = False
    workers: int = 1
    reliable: bool = False


@dataclass(frozen=True)
class Heartbeat:
    """A sign of life, with how many data messages the sender has received."""

    sender_id: str
    received_messages: int = 0


@dataclass(frozen=True)
class Error:
    """An exception on the sender: its type name, message and formatted traceback."""

    type: str
    message: str
    traceback: str = ""
    server_id: str = ""


@dataclass(frozen=True)
class StatsRequest:
    """Ask a server for its :class:`Stats`."""

    client_id: str = ""


@dataclass(frozen=True)
class Stats:
    """Counters and settings of a server, as a flat map of plain values."""

    values: dict[str, int | float | str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class EndOfEpoch:
    """Worker ``worker`` has sent all ``count`` samples of epoch ``epoch``."""

    epoch: int
    count: int
    worker: int = 0


@dataclass(frozen=True)
class Drain:
    """The sender is about to stop; ``sent_messages`` data messages preceded this one."""

    sent_messages: int
    server_id: str = ""


@dataclass(frozen=True)
class EndOfStream:
    """The stream has ended for good after ``epochs`` epochs."""

    server_id: str
    epochs: int = 0
    sent_messages: int = 0


@dataclass(frozen=True)
class Credit:
    """Reliable mode: the client can hold ``credits`` data messages in all (client to server)."""

    credits: int
    client_id: str = ""


@dataclass(frozen=True)
class Ack:
    """Reliable mode: the client has handed out every sample of the messages ``seqs``."""

    seqs: Sequence[int] = ()
    client_id: str = ""


@dataclass(frozen=True)
class ShmOffer:
    """The server has a shared-memory pool at ``path``: a trainer on its host may attach.

    Sent after the welcome that answers a hello (server to client).
    """

    path: str
    server_id: str = ""


@dataclass(frozen=True)
class ShmAttach:
    """The trainer mapped the pool and read its ``token``: proof it shares the host."""

    token: str
    client_id: str = ""


Message: TypeAlias = Union[  # noqa: UP007 - a runtime alias must work on Python 3.10
    Data,
    Hello,
    Welcome,
    Heartbeat,
    Error,
    StatsRequest,
    Stats,
    EndOfEpoch,
    Drain,
    EndOfStream,
    Credit,
    Ack,
    ShmOffer,
    ShmAttach,
]
