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
    "RESUME_CHECKPOINT",
    "RESUME_LIVE",
    "STATS_NEXT_PAGE",
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
    "Scale",
    "ShmAttach",
    "ShmOffer",
    "StatValue",
    "Stats",
    "StatsRequest",
    "Welcome",
    "stats_order",
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
    #: A message's frames compressed for a slow link (feedmux.protocol._compress).
    COMPRESSED = 15
    SCALE = 16


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


#: The last word of :attr:`Hello.resume`: the position was restored from a checkpoint
#: (every rank of the job announces the same), or is where a live rank stands after its
#: server restarted (each rank its own).
RESUME_LIVE, RESUME_CHECKPOINT = 0, 1


@dataclass(frozen=True)
class Hello:
    """A trainer introduces itself to a server (client to server).

    ``rank`` is the trainer's rank in a data-parallel job of ``world_size``
    ranks, or -1 for a free trainer (dynamic dealing). ``group`` names the
    consumer group the trainer belongs to ("" : the default group): every group
    receives the whole stream, its members split it.

    ``resume`` is empty, or the position a ranked trainer restored from a
    checkpoint (or kept across a server restart) asks the server to continue
    from: ``(epoch, position, world_size, kind)``, the next round of ``epoch``
    its job needs (a global position), the world size the job had then, and
    :data:`RESUME_CHECKPOINT` or :data:`RESUME_LIVE` (docs/resume.md).

    ``handed`` is empty, or what a free trainer that outlived its
    server handed out lately: ``(epoch, start, end, ...)`` triples, positions
    ``start .. end - 1`` of ``epoch``, so that the restarted server deals none
    of them again. ``handed_below`` is empty, or the last summary that server
    sent it of what every trainer had handed out (see :class:`Heartbeat`).

    ``batch_size`` is 0, or the number of samples of one training step the
    trainer asks the server to stack into each data message (every trainer of
    a server asks the same); ``drop_last`` says whether an epoch's last,
    partial batch is dropped (True) or sent short (docs/stream.md).

    ``bucket_by`` is empty, or the field of a sample whose value (an int, or an
    array's first dimension) is its length: a trainer with ``batch_size`` asks
    the server to build its batches from samples of similar length (a ranked
    job: each step's batches, and every rank of it asks the same; docs/ddp.md).

    ``codecs`` are the codecs of compressed frames (``c`` of kind 15) the trainer
    inflates; the server compresses its messages with those only. Empty: a trainer
    older than the field, which is sent raw (docs/protocol.md).

    ``predecessor`` is empty, or what a ranked trainer's predecessor of the same
    rank (a process that died on this host) handed out last, as its mark file
    says: ``(epoch, position)`` of server ``predecessor_server``. The server
    replays that rank's unfinished messages from after it when it is further on
    than the last mark it got (docs/ddp.md).
    """

    client_id: str
    role: str = "trainer"
    world_size: int = 1
    rank: int = -1
    group: str = ""
    resume: tuple[int, ...] = ()
    handed: tuple[int, ...] = ()
    batch_size: int = 0
    handed_below: tuple[int, ...] = ()
    drop_last: bool = False
    bucket_by: str = ""
    codecs: tuple[int, ...] = ()
    predecessor: tuple[int, ...] = ()
    predecessor_server: str = ""


@dataclass(frozen=True)
class Welcome:
    """The server's answer to :class:`Hello`: who it is and what it serves.

    ``world_size`` is the number of ranks the server deals each epoch to (0:
    free trainers) and ``uneven`` how it evens their shares ("pad" or "drop").
    ``unknown`` answers a heartbeat from a trainer the server has no hello of (a
    restarted server, the hello sent to the process before it): say hello.
    """

    server_id: str
    epoch_size: int | None = None
    epoch: int = 0
    samples_per_message: int = 1
    finished: bool = False
    workers: int = 1
    reliable: bool = False
    world_size: int = 0
    uneven: str = ""
    unknown: bool = False


@dataclass(frozen=True)
class Heartbeat:
    """A sign of life, with how many data messages the sender has received.

    ``group`` repeats the trainer's consumer group ("" : the default group), so
    a server that lost track of the trainer puts it back in the right group.

    ``handed_below`` is empty, or (a server to its free trainers) what
    all its trainers had handed out: ``(epoch, position, e, start, end, ...)``,
    every sample of the stream before ``(epoch, position)`` was handed out by
    some trainer except positions ``start .. end - 1`` of epoch ``e`` of each
    triple after. A trainer that outlives the server repeats it in its hello to
    the restarted one (docs/resume.md).

    ``wait_fraction`` is None, or (a trainer's periodic heartbeat) the fraction of
    the wall time since its previous report that its training loop waited for data
    inside the loader, 0 to 1: the signal ``--workers auto`` grows on
    (docs/autoscale.md).
    """

    sender_id: str
    received_messages: int = 0
    group: str = ""
    handed_below: tuple[int, ...] = ()
    wait_fraction: float | None = None


@dataclass(frozen=True)
class Error:
    """An exception on the sender: its type name, message and formatted traceback."""

    type: str
    message: str
    traceback: str = ""
    server_id: str = ""


@dataclass(frozen=True)
class StatsRequest:
    """Ask a server for its :class:`Stats`: the page of figures whose keys come after
    ``after`` ("": the first page; a reply names the next page's ``after``)."""

    client_id: str = ""
    after: str = ""


#: One value of a :class:`Stats` map.
StatValue = int | float | str | None


@dataclass(frozen=True)
class Stats:
    """Counters and settings of a server, as a flat map of plain values.

    One page of them: the entries whose keys come after the request's ``after``
    in :func:`stats_order`, as many as fit in one control frame, and under
    :data:`STATS_NEXT_PAGE` the ``after`` of the next page (None: the last).
    """

    values: dict[str, StatValue] = field(default_factory=dict)


#: The key of a :class:`Stats` page that names where the next page starts.
STATS_NEXT_PAGE = "stats_next_after"


def stats_order(key: str) -> tuple[bool, str]:
    """The order of statistics pages: server-wide figures (no dot) first, then by key.

    Examples
    --------
    >>> sorted(["trainer.a.rank", "pid", "epoch"], key=stats_order)
    ['epoch', 'pid', 'trainer.a.rank']
    """
    return "." in key, key


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
    """The client can hold ``credits`` data messages in all (client to server, on the data
    socket)."""

    credits: int
    client_id: str = ""


@dataclass(frozen=True)
class Ack:
    """The client has handed out samples (client to server).

    On the data socket: every sample of the messages ``seqs``.
    A free trainer, on the control socket: the same for server
    ``server_id``'s messages ``seqs`` when ``position`` is -1, else every
    sample of its message ``seqs`` up to and including ``(epoch, position)``.
    A ranked trainer, on the control socket: every sample of its share up to
    and including ``(epoch, position)`` of server ``server_id``, as rank
    ``rank`` (``position`` -1: none).
    """

    seqs: Sequence[int] = ()
    client_id: str = ""
    server_id: str = ""
    rank: int = -1
    epoch: int = 0
    position: int = -1


@dataclass(frozen=True)
class ShmOffer:
    """The server has a shared-memory pool at ``path``: a trainer on its host may attach.

    Sent after the welcome that answers a hello (server to client).
    """

    path: str
    server_id: str = ""


@dataclass(frozen=True)
class ShmAttach:
    """The trainer mapped the pool and read its ``token``: proof it shares the host.

    ``pid_namespace`` identifies the trainer's PID namespace (the inode of
    ``/proc/self/ns/pid``; 0: unknown). The pool's claims name trainers by pid, so
    a server that sees another PID namespace (a container with ``ipc: host`` but
    not ``pid: host``) would take a living trainer for dead and write over the
    arrays it reads: that server keeps the trainer on the sockets.
    """

    token: str
    client_id: str = ""
    pid_namespace: int = 0


@dataclass(frozen=True)
class Scale:
    """Ask a server to run ``workers`` sampling workers from now on (``feedmux scale``);
    0 hands the count back to ``--workers auto``. Answered with :class:`Stats`."""

    workers: int
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
    Scale,
]
