"""The server's settings as one frozen, validated record.

This module owns :class:`ServerConfig`: every option of a server, checked once
at construction, as plain data that crosses into forked worker processes, and
the one table of combination rules (:data:`REFUSED`, :data:`OFF`): which
things a server's options, its state and a trainer's hello may ask for
together, and for each pair that does not combine, why. The table is data,
read by one small engine (:func:`refusal`) that :class:`ServerConfig` applies
to its options and the rank tables apply to each hello; a rule changes by
editing its entry, never by a conditional elsewhere. The parsers and checks of
options that are more than a bound (``workers``, ``group_buffer``, the bucket
edges, the metrics extra) live here too, with the small records they make
(:class:`WorkerRange`, :class:`BucketSpec`): this module is the lowest part of
the server, which every other part reads and which imports none of them but the
source's type. It must never open a socket or start anything; the server and
its workers only read it.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import re
import uuid
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple, TypeVar

from feedmux._plumbing.shm import DEFAULT_SHM_SIZE
from feedmux._plumbing.sockets import DEFAULT_BIND, DEFAULT_HWM, control_address_for
from feedmux.errors import ConfigurationError
from feedmux.protocol import parse_compress
from feedmux.server.factory import Source

__all__ = ["ASKS", "DEFAULT_AUTO_MAX", "DEFAULT_GROUP_BUFFER", "EXIT_FAILED", "EXIT_OK",
           "EXIT_USAGE", "JOIN_MODES", "OFF", "REFUSED", "RELIABLE_IS_DEFAULT", "BucketSpec",
           "ServerConfig", "WorkerRange", "check_edges", "check_metrics_available",
           "deprecated_reliable", "disabled", "parse_group_buffer", "parse_workers", "refusal"]

#: A server process's exit codes: done, failed, a bad command line or source.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: Said (a DeprecationWarning; the CLI's warning line) to a server given ``reliable`` /
#: ``--reliable``: the one free delivery does what it asked for, whatever its value.
RELIABLE_IS_DEFAULT = (
    "reliable is deprecated and does nothing: every free trainer gets every sample of an "
    "epoch exactly once by default (it gets credit and acknowledges what it handed out, "
    "what reliable=True did), so what a trainer that leaves, closes, dies or hangs had not "
    "handed out goes to the others; at-most-once plain delivery is gone. Drop the option")


def deprecated_reliable(options: dict[str, Any], stacklevel: int = 3) -> None:
    """Take a ``reliable`` option out of ``options``, with a DeprecationWarning if it was
    there (it is a no-op now: :data:`RELIABLE_IS_DEFAULT`)."""
    if "reliable" in options:
        del options["reliable"]
        warnings.warn(RELIABLE_IS_DEFAULT, DeprecationWarning, stacklevel=stacklevel)


_Config = TypeVar("_Config")


def _taking_reliable(cls: type[_Config]) -> type[_Config]:
    """Let ``cls(..., reliable=...)`` be called as before, with a DeprecationWarning
    whatever the value (:data:`RELIABLE_IS_DEFAULT`). ``reliable`` is no field of it:
    ``dataclasses.replace`` and a copy into a worker process never pass it, so only the
    caller who gave it is warned, once."""
    made = cls.__dict__["__init__"]

    @functools.wraps(made)
    def __init__(self: _Config, *args: Any, reliable: bool | None = None,
                 **options: Any) -> None:
        if reliable is not None:
            warnings.warn(RELIABLE_IS_DEFAULT, DeprecationWarning, stacklevel=2)
        made(self, *args, **options)

    setattr(cls, "__init__", __init__)  # noqa: B010 (mypy refuses assigning a method)
    return cls


#: What a server's options (``group_buffer``, ``shm``), the state it is in
#: (``groups``, ``ranked_job``: what its trainers made of it so far) or a trainer's hello
#: (``group``, ``rank``, ``batch_size``, ``resume``, ``live``) may ask for, in words.
ASKS: dict[str, str] = {
    "group_buffer": "a consumer groups' buffer (--group-buffer)",
    "shm": "the shared-memory pool",
    "groups": "consumer groups (a trainer asked for one)",
    "ranked_job": "a ranked job outside any group (its ranks are dealt as sampled)",
    "group": "a consumer group (group=)",
    "rank": "a rank (rank=)",
    "batch_size": "server-built batches (batch_size=)",
    "resume": "a resume position (a checkpoint's, or a rank's that outlived its server)",
    "live": "a live rank's position (a rank that outlived its server)",
}

_NO_LIVE = ("a rank that outlived its server goes on with the old process's dealing, and "
            "a consumer group's stream on the new process begins afresh (the group joins "
            "it at a whole epoch); restart the job from its checkpoint "
            "(load_state_dict), which a ranked group resumes from, or resume it on a "
            "server of its own (no group=), started with the same --seed")

#: Pairs that do not combine, each with the real reason (one entry per rule). A pair of
#: options is refused when the server starts; a pair with a hello's ask, to that trainer.
REFUSED: dict[tuple[str, str], str] = {
    ("ranked_job", "group"): (
        "this server deals to a ranked job outside any group, and deals its ranks as the "
        "sampler draws, before any buffer, so another group cannot share that stream; "
        "give the job a group= too, or start the server with --group-buffer (its "
        "trainers without group= then form the group 'default')"),
    ("groups", "live"): _NO_LIVE,
    ("group", "live"): _NO_LIVE,
}

#: Pairs that combine with the second one switched off, each with why (logged once).
OFF: dict[tuple[str, str], str] = {}


def refusal(asked: Collection[str]) -> str | None:
    """Why the things ``asked`` for together do not combine (:data:`REFUSED`), or None.

    Examples
    --------
    >>> refusal({"groups", "live"})[:72]
    "expected consumer groups (a trainer asked for one) or a live rank's posi"
    >>> refusal({"group", "rank", "batch_size"}) is None
    True
    """
    for (first, second), reason in REFUSED.items():
        if first in asked and second in asked:
            return f"expected {ASKS[first]} or {ASKS[second]}, got both: {reason}"
    return None


def disabled(asked: Collection[str], what: str) -> str | None:
    """Why ``what`` is off alongside the others ``asked`` for (:data:`OFF`), or None.

    Examples
    --------
    >>> disabled({"shm"}, "shm") is None
    True
    """
    for (first, second), reason in OFF.items():
        if second == what and first in asked and what in asked:
            return reason
    return None


#: The most workers ``auto`` runs when no maximum is given (then also the shards).
DEFAULT_AUTO_MAX = 16


@dataclass(frozen=True)
class WorkerRange:
    """The workers option: a fixed count, or ``auto`` between ``minimum`` and ``maximum``."""

    minimum: int
    maximum: int
    auto: bool


def parse_workers(value: int | str) -> WorkerRange:
    """``N``, ``auto``, ``auto:MAX`` or ``auto:MIN-MAX``.

    Examples
    --------
    >>> parse_workers(3), parse_workers("auto:2-6").maximum, parse_workers("auto").maximum
    (WorkerRange(minimum=3, maximum=3, auto=False), 6, 16)
    >>> parse_workers("auto:0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: expected workers N >= 1, 'auto', 'auto:MAX' or 'auto:MIN-MAX' with 1 <= ...
    """
    expected = ("expected workers N >= 1, 'auto', 'auto:MAX' or 'auto:MIN-MAX' with "
                "1 <= MIN <= MAX")
    if isinstance(value, bool):
        raise ValueError(f"{expected}, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{expected}, got {value!r}")
        return WorkerRange(value, value, auto=False)
    text = str(value).strip()
    if text.isdigit():
        return parse_workers(int(text))
    match = re.fullmatch(r"auto(?::(?:(\d+)-)?(\d+))?", text)
    if match is None:
        raise ValueError(f"{expected}, got {value!r}")
    minimum = int(match[1]) if match[1] else 1
    maximum = int(match[2]) if match[2] else DEFAULT_AUTO_MAX
    if not 1 <= minimum <= maximum:
        raise ValueError(f"{expected}, got {value!r}")
    return WorkerRange(minimum, maximum, auto=True)


#: The groups' buffer when ``--group-buffer`` does not say (why bytes: the docstring of
#: :mod:`feedmux.server._delivery.groups`).
DEFAULT_GROUP_BUFFER = "64MiB"
#: When a group that joins mid-stream starts: at the next epoch boundary, or with the next message.
JOIN_MODES = ("epoch", "now")

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def parse_group_buffer(value: int | str) -> tuple[int, int]:
    """``(max_messages, max_bytes)`` from ``--group-buffer``: a count of messages or a size.

    A plain number is a count of messages; a number with a unit (``B``, ``KiB``,
    ``MiB``, ``GiB``, ``KB``, ``MB``, ``GB``) is a size in bytes. The other
    limit is 0 (none).

    Examples
    --------
    >>> parse_group_buffer(64), parse_group_buffer("64MiB"), parse_group_buffer("1000")
    ((64, 0), (0, 67108864), (1000, 0))
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigurationError(f"expected group_buffer >= 1 message, got {value}")
        return value, 0
    match = _SIZE.match(str(value).lower()) if isinstance(value, str) else None
    if match is None or match.group(2) not in _UNITS or int(match.group(1)) < 1:
        raise ConfigurationError(
            f"expected group_buffer a count of messages (e.g. 256) or a size "
            f"(e.g. 64MiB), got {value!r}")
    number, unit = int(match.group(1)), match.group(2)
    return (number, 0) if not unit else (0, number * _UNITS[unit])


def check_edges(edges: Sequence[int]) -> tuple[int, ...]:
    """``edges`` as a tuple of ascending ints >= 1, or a clear error.

    Examples
    --------
    >>> check_edges([16, 64, 256])
    (16, 64, 256)
    >>> check_edges([64, 16])
    Traceback (most recent call last):
    ...
    feedmux.errors.ConfigurationError: expected bucket edges strictly ascending ints >= 1, \
got [64, 16]
    """
    values = list(edges)
    if not all(type(edge) is int and edge >= 1 for edge in values) or any(
            b <= a for a, b in itertools.pairwise(values)):
        raise ConfigurationError(
            f"expected bucket edges strictly ascending ints >= 1, got {values!r}")
    return tuple(values)


class BucketSpec(NamedTuple):
    """Coordinated steps (``bucket_by=``, :mod:`feedmux.server._delivery.buckets`): the
    sample field that gives a sample's length, the window in samples (0: the default) and
    the bucket edges (none: the runs of similar lengths in the window), the run's seed (the
    ranks' turns)."""

    key: str
    window: int = 0
    edges: tuple[int, ...] = ()
    seed: int = 0


def check_metrics_available() -> None:
    """Raise :class:`ConfigurationError` naming the extra when prometheus-client is missing."""
    if importlib.util.find_spec("prometheus_client") is None:
        raise ConfigurationError(
            "expected prometheus-client for metrics_port / --metrics-port, got no such "
            "module: install the extra with  pip install 'feedmux[metrics]'"
        )


@_taking_reliable
@dataclass(frozen=True)
class ServerConfig:
    """Everything a server needs, as plain data (it crosses into worker processes)."""

    source: Source
    factory_kwargs: Mapping[str, Any] = field(default_factory=dict)
    bind: str = DEFAULT_BIND
    control: str | None = None
    # N, or "auto" / "auto:MAX" / "auto:MIN-MAX" (docs/autoscale.md).
    workers: int | str = 1
    # The run's shards (docs/autoscale.md); None: chosen from the source.
    shards: int | None = None
    epochs: int | None = None
    epoch_size: int | None = None
    hwm: int = DEFAULT_HWM
    samples_per_message: int | None = None
    max_delay: float = 0.005
    on_error: str = "raise"
    # With on_error "skip": errors skipped in a row (no sample sent in between) that stop
    # the run (0: no limit; an epoch of nothing but skips stops it anyway).
    max_skips: int = 1000
    log_every: float = 10.0
    # A field of the samples whose summed length or value is reported per second too.
    count_field: str = ""
    drain_timeout: float = 30.0
    drain_idle: float = 3.0
    min_trainers: int = 0
    #: Always True: every free trainer gets credit and acknowledges its hand-outs (a trainer
    #: that goes leaves what it had not handed out to the others). Not a field: given to the
    #: constructor, in either value, it only warns (:func:`_taking_reliable`).
    reliable: ClassVar[bool] = True
    uneven: str = "pad"
    rank_timeout: float = 60.0
    # The consumer groups' buffer (docs/groups.md); None: DEFAULT_GROUP_BUFFER (every
    # server but a ranked job's sends through it, its free trainers the group default).
    group_buffer: int | str | None = None
    join: str = "epoch"
    group_timeout: float = 10.0
    curve_secret: str | None = None
    curve_clients: str | None = None
    server_id: str = ""
    zero_copy: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # The run's seed (reseeds every sampling process per epoch); None: the mux's, or fresh.
    seed: int | None = None
    # A served map-style dataset: a permutation of its indices each epoch, or in order
    # (--no-shuffle); refused for a streamer or mux, whose order is its own.
    shuffle: bool = True
    # The same-host shared-memory pool (docs/server.md): off with --no-shm.
    shm: bool = True
    shm_size: int = DEFAULT_SHM_SIZE
    # Coordinated steps for ranked batches (docs/ddp.md): the sample field that gives a
    # sample's length for trainers that name none (""), the window in samples (0: the
    # default, 16 steps of world_size x batch_size) and the bucket edges (none: the runs of
    # similar lengths in the window).
    bucket_by: str = ""
    bucket_window: int = 0
    bucket_edges: tuple[int, ...] = ()
    # Compression of the trainers' socket links (docs/scale-out.md "Across hosts"):
    # auto, off, lz4, zstd or zstd:LEVEL.
    compress: str = "auto"

    @property
    def worker_range(self) -> WorkerRange:
        """The workers option parsed: a fixed count, or auto between a minimum and a maximum."""
        return parse_workers(self.workers)

    def __post_init__(self) -> None:
        def require(ok: bool, what: str, value: object) -> None:
            if not ok:
                raise ConfigurationError(f"expected {what}, got {value!r}")

        try:
            parse_workers(self.workers)
        except ValueError as error:
            raise ConfigurationError(str(error)) from None
        require(self.shards is None or self.shards >= 1, "shards None or >= 1", self.shards)
        try:
            parse_compress(self.compress)
        except ValueError as error:
            raise ConfigurationError(f"compress: {error}") from None
        require(self.epochs is None or self.epochs >= 1, "epochs None or >= 1", self.epochs)
        require(self.epoch_size is None or self.epoch_size >= 1, "epoch_size >= 1", self.epoch_size)
        require(self.hwm >= 1, "hwm >= 1", self.hwm)
        require(
            self.samples_per_message is None or self.samples_per_message >= 1,
            "samples_per_message None or >= 1",
            self.samples_per_message,
        )
        require(self.on_error in ("raise", "skip"), "on_error 'raise' or 'skip'", self.on_error)
        require(isinstance(self.max_skips, int) and self.max_skips >= 0, "max_skips an int >= 0",
                self.max_skips)
        require(self.log_every > 0, "log_every > 0 seconds", self.log_every)
        require(self.max_delay >= 0, "max_delay >= 0 seconds", self.max_delay)
        require(self.min_trainers >= 0, "min_trainers >= 0", self.min_trainers)
        require(self.uneven in ("pad", "drop"), "uneven 'pad' or 'drop'", self.uneven)
        require(self.rank_timeout > 0, "rank_timeout > 0 seconds", self.rank_timeout)
        require(self.join in JOIN_MODES, "join 'epoch' or 'now'", self.join)
        require(self.group_timeout > 0, "group_timeout > 0 seconds", self.group_timeout)
        if self.group_buffer is not None:
            parse_group_buffer(self.group_buffer)  # raises a clear error on a bad limit
        require(self.metrics_port is None or 0 <= self.metrics_port <= 65535,
                "metrics_port None or a TCP port 0-65535", self.metrics_port)
        require(
            self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                                  and self.seed >= 0),
            "seed None or an int >= 0", self.seed,
        )
        require(self.shm_size >= 1 << 20, "shm_size >= 1 MiB", self.shm_size)
        require(type(self.bucket_by) is str, "bucket_by a field name (a str)", self.bucket_by)
        require(type(self.bucket_window) is int and self.bucket_window >= 0,
                "bucket_window an int >= 0 samples (0: the default)", self.bucket_window)
        object.__setattr__(self, "bucket_edges", check_edges(self.bucket_edges))
        if (refused := refusal(self.asks)) is not None:
            raise ConfigurationError(refused)
        if self.metrics_port is not None:
            check_metrics_available()
        if not self.server_id:
            object.__setattr__(self, "server_id", uuid.uuid4().hex[:12])

    def options(self) -> dict[str, Any]:
        """Every setting but the source, as keyword arguments of :class:`Server`."""
        return {item.name: getattr(self, item.name) for item in fields(self)
                if item.name != "source"}

    @property
    def control_address(self) -> str:
        """The control endpoint: explicit, or derived from the data endpoint."""
        return self.control or control_address_for(self.bind)

    @property
    def asks(self) -> frozenset[str]:
        """What these options ask for, in the words of the combination table (:data:`ASKS`)."""
        options = {"group_buffer": self.group_buffer is not None, "shm": self.shm}
        return frozenset(name for name, asked in options.items() if asked)

    @property
    def grouped(self) -> bool:
        """Whether the server's trainers are consumer groups from its start (``group_buffer``
        set: its trainers without ``group=`` are the group ``default``, a ranked job too).
        Without it, a ranked job without ``group=`` has the server to itself, and any other
        server's free trainers are the group ``default`` all the same
        (:mod:`~feedmux.server._delivery.paths`)."""
        return self.group_buffer is not None

    @property
    def group_limits(self) -> tuple[int, int]:
        """The groups' buffer as ``(max_messages, max_bytes)``: ``group_buffer``, or the
        default (:data:`DEFAULT_GROUP_BUFFER`)."""
        return parse_group_buffer(self.group_buffer or DEFAULT_GROUP_BUFFER)

    @property
    def buckets(self) -> BucketSpec:
        """The window, edges and seed of coordinated steps (the field: the ranks' own, or
        ``bucket_by``)."""
        return BucketSpec(self.bucket_by, self.bucket_window, self.bucket_edges,
                          self.seed or 0)
