"""What a trainer knows about its servers: the pure control logic behind a RemoteLoader.

This module owns the trainer's side of the control conversation with each server:
the welcome (server id, epoch size, workers; a server that does not deal by credit,
an older feedmux, refused), a server
restart (a new server id on the same link), the answer to a drain (how many data
messages came from that server), the end of stream, errors a server sends, when a
heartbeat is due, how long to wait for data before timing out, and when every
server has finished. Events come in — a decoded control message, a data message
received, a tick at time ``now`` — and actions come out (:class:`Send` this message,
:class:`Resync` this link) or the exception to raise. It never imports zmq, never
reads a clock (time is always passed in) and never touches a socket: the socket
shell in ``remote.py`` does all of that and calls this module once per message,
never once per sample.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from feedmux.client._batches import check_batches, check_buckets
from feedmux.errors import (
    ConfigurationError,
    RemoteError,
    TransportError,
    TransportTimeoutError,
    VersionMismatchError,
)
from feedmux.protocol import (
    INFLATES,
    Drain,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Message,
    ShmOffer,
    Welcome,
)

__all__ = [
    "CLIENT_ID_TAKEN",
    "CONTROL_SILENCE_WARNING",
    "WAIT_NOTICE",
    "WAIT_REPEAT",
    "Action",
    "Grant",
    "Resync",
    "Send",
    "ServerLink",
    "ServerLinks",
    "batch_steps",
    "check_membership",
]

log = logging.getLogger("feedmux.client")


def rank_steps(epoch_size: int, world_size: int, uneven: str) -> int:
    """Samples each rank gets per epoch (the server's rule: pad rounds up, drop down).

    The same rule as the server's ``_dealing.rank_steps``: the client never imports
    the server, and the rule is one line.
    """
    if uneven == "drop":
        return epoch_size // world_size
    return -(-epoch_size // world_size)


def batch_steps(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches of ``batch_size`` that ``samples`` samples of one epoch make (the server's
    rule: the last, partial batch is dropped with ``drop_last``, else sent short).

    Examples
    --------
    >>> batch_steps(10, 4, False), batch_steps(10, 4, True), batch_steps(8, 4, False)
    (3, 2, 2)
    """
    if drop_last:
        return samples // batch_size
    return -(-samples // batch_size)


def check_membership(*, world_size: int, rank: int | None, group: str | None) -> None:
    """Check what a trainer says of itself in its hellos: its rank and its consumer group.

    Examples
    --------
    >>> check_membership(world_size=2, rank=1, group="eval")
    >>> check_membership(world_size=2, rank=2, group=None)
    Traceback (most recent call last):
    ...
    feedmux.errors.ConfigurationError: expected rank an int in [0, 2) for world_size 2, got 2
    """
    if rank is not None and not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ConfigurationError(
            f"expected rank an int in [0, {world_size}) for world_size {world_size}, got {rank!r}")
    if group is not None and not (isinstance(group, str) and group):
        raise ConfigurationError(f"expected group a non-empty str or None, got {group!r}")


#: Seconds of data without any answer on a control endpoint before a warning.
CONTROL_SILENCE_WARNING = 5.0
#: Seconds a trainer waits for data before it says so at WARNING (Python's default
#: logging shows it), naming both endpoints and the likely causes ...
WAIT_NOTICE = 10.0
#: ... and then again every this many seconds while the wait goes on.
WAIT_REPEAT = 30.0
#: Seconds of waiting after which a trainer looks at the shared-memory views it holds.
HELD_CHECK = 2.0
#: The share of a server's pool held by a trainer's views that makes it the likely cause.
HELD_SHARE = 0.5
#: The error type of a hello refused because a live trainer holds the rank.
RANK_TAKEN = "RankTakenError"
#: The error type of a hello refused because a live trainer holds this loader's client id.
CLIENT_ID_TAKEN = "ClientIdInUseError"
#: Hellos a refused client id says again (at the next beat) before the loader raises: the
#: holder may be this loader's own closed predecessor, which the server forgets once its
#: probe of it fails (a live holder answers, and the loader raises within a beat).
CLIENT_ID_RETRIES = 1
#: Heartbeat intervals a refused rank keeps saying hello: the server's liveness period
#: (three intervals without a heartbeat) and some margin, as the holder may be a crashed
#: predecessor whose death the server has not seen yet.
RANK_TAKEN_RETRIES = 5


@dataclass(frozen=True)
class Send:
    """Send ``message`` to the control endpoint of link number ``link`` (never blocking)."""

    link: int
    message: Hello | Heartbeat


@dataclass(frozen=True)
class Resync:
    """Link number ``link`` now talks to a new server process.

    The pending acknowledgement of that link means nothing to the new server
    (drop it) and the new server has granted this trainer no credit yet (grant
    it again); what the old process sent and this trainer has not handed out is
    dropped (the new one resumes where the trainer stands).
    """

    link: int


@dataclass(frozen=True)
class Attach:
    """The server of link ``link`` offers its shared-memory pool at ``path``: map it if we can."""

    link: int
    path: str


@dataclass(frozen=True)
class Grant:
    """Grant the server of link ``link`` this trainer's credit: when it first welcomes this
    trainer (its hello was admitted: granted before, a second loader with the same client id,
    refused, was dealt data meant for the trainer that holds the id), and again when the data
    socket points at new endpoints (what was queued for the old ones was dropped). A grant
    sets the credit, so a second one is harmless."""

    link: int


Action = Send | Resync | Attach | Grant


@dataclass
class ServerLink:
    """What this trainer knows about one server (one data and one control endpoint).

    Examples
    --------
    >>> link = ServerLink("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556")
    >>> link.welcome(Welcome("a", epoch_size=10, reliable=True))
    False
    >>> link.welcome(Welcome("b", epoch_size=12, reliable=True))  # a restart
    True
    >>> link.server_id, link.epoch_size
    ('b', 12)
    """

    data_address: str
    control_address: str
    server_id: str = ""
    epoch_size: int | None = None
    workers: int = 1
    finished: bool = False
    world_size: int = 0
    uneven: str = ""
    #: Whether the control endpoint was derived (the data port + 1), not given.
    control_derived: bool = False
    #: Ids this link's server had before it restarted: a ranked trainer drops what they
    #: sent that is still queued (the restarted server resumes where the trainer is).
    stale: set[str] = field(default_factory=set)

    def welcome(self, message: Welcome) -> bool:
        """Take the server's welcome; True when it comes from a restarted server.

        Raises :class:`~feedmux.errors.TransportError` when the server does not
        deal by credit (``Welcome.reliable`` false: an older feedmux's plain
        delivery): this trainer grants credit and waits for the envelopes, the
        server would push without them, and the two would never agree.
        """
        if not message.reliable:
            raise TransportError(
                f"expected a server that deals by credit and acknowledgements (every feedmux "
                f"server does now), got one with plain delivery at {self.control_address}: "
                f"an older feedmux (upgrade it, or start it with --reliable)")
        restarted = bool(self.server_id) and self.server_id != message.server_id
        if restarted:
            log.warning(
                "server at %s restarted: server id %s, before %s; continuing",
                self.control_address, message.server_id, self.server_id,
            )
            self.finished = False  # the new process serves a new stream
            self.stale.add(self.server_id)
        self.server_id = message.server_id
        self.epoch_size = message.epoch_size
        self.workers = message.workers
        self.world_size, self.uneven = message.world_size, message.uneven
        return restarted

    def end_of_stream(self, server_id: str, *, on_data_socket: bool = False) -> None:
        """The server with ``server_id`` said its stream has ended.

        On the control socket an end from a server that never welcomed this
        trainer counts (it may have finished before it answered); on the data
        socket an end without a server id counts. An end from an older
        server process on the same link never does.
        """
        if on_data_socket:
            if server_id in ("", self.server_id):
                self.finished = True
        elif server_id == self.server_id or not self.server_id:
            self.finished = True

    def error(self, message: Error) -> VersionMismatchError | RemoteError:
        """The exception to raise for an error message the server sent."""
        if message.type.rsplit(".", 1)[-1] == "VersionMismatchError":
            return VersionMismatchError(f"{message.message} (server {self.control_address})")
        return RemoteError(message.type, message.message, message.traceback,
                           message.server_id or self.control_address)


class ServerLinks:
    """A trainer's links to all its servers: events in, actions out, no sockets.

    Parameters
    ----------
    data_addresses, control_addresses : sequence of str
        One pair per server; link number ``i`` is the ``i``-th pair.
    client_id : str
        This trainer's id, sent in its hellos and heartbeats.
    world_size : int
        Trainers sharing the stream (sent in the hello).
    group : str
        This trainer's consumer group ("" : the default group), sent in its
        hellos and heartbeats.
    timeout : float, optional
        Seconds without data before :meth:`wait` raises; None waits forever.
    heartbeat_interval : float
        Seconds between heartbeats, and the longest single wait for data, so
        that heartbeats go out while the trainer waits.

    Examples
    --------
    >>> links = ServerLinks(["tcp://h:1"], ["tcp://h:2"], client_id="t", world_size=1,
    ...                     timeout=None, heartbeat_interval=1.0)
    >>> [action.message for action in links.hello()] == [Hello(client_id="t", codecs=INFLATES)]
    True
    >>> links.control(0, Welcome("s1", epoch_size=4, reliable=True))  # grant it credit
    [Grant(link=0)]
    >>> links.data("s1", first_epoch=1, now=0.0)
    ()
    >>> links.control(0, Drain(sent_messages=1, server_id="s1"))[0].message
    Heartbeat(sender_id='t', received_messages=1, group='', handed_below=(), wait_fraction=None)
    >>> links.control(0, EndOfStream("s1"))
    []
    >>> links.finished, len(links.links), links.epoch_size
    (True, 1, 4)
    """

    #: The codecs of compressed frames this trainer inflates, told in each hello: its
    #: servers compress its messages with those only.
    codecs: tuple[int, ...] = INFLATES

    def __init__(
        self,
        data_addresses: Sequence[str],
        control_addresses: Sequence[str],
        *,
        client_id: str,
        world_size: int,
        timeout: float | None,
        heartbeat_interval: float,
        rank: int = -1,
        group: str = "",
        batch_size: int | None = None,
        drop_last: bool = False,
        derived: Sequence[bool] = (),
        bucket_by: str | None = None,
        pad: bool = False,
    ) -> None:
        check_batches(batch_size, drop_last)
        check_buckets(bucket_by, pad, batch_size)
        self.links = [ServerLink(data, control)
                      for data, control in zip(data_addresses, control_addresses, strict=True)]
        for link, was_derived in zip(self.links, derived, strict=False):
            link.control_derived = was_derived
        self.client_id = client_id
        self.world_size = world_size
        self.rank = rank
        self.group = group
        #: The batches asked of every server (0: samples, no batches).
        self.batch_size = batch_size or 0
        self.drop_last = drop_last
        #: The sample field the ranks' steps are dealt by ("": none; docs/ddp.md), and
        #: whether a bucketed batch's variable-length leaves are padded with a mask.
        self.bucket_by, self.pad = bucket_by or "", pad
        self.timeout = timeout
        self.heartbeat_interval = heartbeat_interval
        #: Data messages received, by server id (a restarted server counts from 0).
        self.received: dict[str, int] = {}
        self._last_heartbeat = -math.inf
        #: Links whose hello was refused as a live duplicate rank: refusals so far.
        self._refused: dict[int, int] = {}
        self._first_data = True
        # Set at the first data message until every control endpoint has answered.
        self._silent_since: float | None = None
        #: ``position(link) -> (epoch, position, world_size, checkpoint)`` or ``()``: where a
        #: ranked trainer stands with the server of ``link``, said in each hello (the loader
        #: sets it; docs/resume.md).
        self.position: Callable[[int], tuple[int, ...]] = lambda index: ()
        #: ``handed(link) -> (epoch, start, end, ...)``: what a free trainer handed
        #: out lately, said to a restarted server (the loader sets it; docs/resume.md).
        self.handed: Callable[[int], tuple[int, ...]] = lambda index: ()
        #: ``predecessor(link) -> (server id, epoch, position)`` or None: what a ranked
        #: trainer's dead predecessor of the same rank handed out last of ``link``'s server,
        #: read from its mark file (the loader sets it; docs/ddp.md).
        self.predecessor: Callable[[int], tuple[str, int, int] | None] = lambda index: None
        #: ``handed_below(link) -> Hello.handed_below`` and ``summarized(link, values)``: the
        #: server's summary of every trainer's hand-outs, kept and said to a restarted server.
        self.handed_below: Callable[[int], tuple[int, ...]] = lambda index: ()
        self.summarized: Callable[[int, tuple[int, ...]], None] = lambda index, values: None
        #: ``views_held() -> (views, bytes, pool bytes)``: the shared-memory views this trainer
        #: holds (the loader sets it), said when it waits for data.
        self.views_held: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0)
        #: ``wait_share(now, waiting_from) -> fraction or None``: the share of the time since
        #: the last heartbeat that the training loop waited for data (the loader sets it from
        #: its input diagnosis); every heartbeat carries it (``Heartbeat.wait_fraction``).
        self.wait_share: Callable[[float, float | None], float | None] = lambda now, since: None
        # The wait being watched (its start), when its next notice is due, whether the
        # views were looked at.
        self._waiting: tuple[float, float, bool] = (math.nan, WAIT_NOTICE, False)

    # -- events ---------------------------------------------------------------------------
    def say_position(self, position: Callable[[int], tuple[int, ...]]) -> None:
        """Say ``position(link)`` in each hello from now on (a ranked loader's tracker)."""
        self.position = position

    def say_hand_outs(self, handed: Callable[[int], tuple[int, ...]],
                      handed_below: Callable[[int], tuple[int, ...]],
                      summarized: Callable[[int, tuple[int, ...]], None]) -> None:
        """Say ``handed(link)`` and ``handed_below(link)`` to a restarted server from now
        on, and keep each server's summary with ``summarized`` (a free loader's tracker)."""
        self.handed, self.handed_below, self.summarized = handed, handed_below, summarized

    def hello(self) -> list[Action]:
        """Introduce this trainer to every server (on connecting, and to a new server)."""
        return [Send(index, self._hello(index)) for index in range(len(self.links))]

    def probe(self) -> list[Action]:
        """Ask every server for its welcome without joining as a trainer (yet)."""
        probe = Hello(client_id=self.client_id, role="probe", world_size=self.world_size,
                      rank=self.rank, group=self.group)
        return [Send(index, probe) for index in range(len(self.links))]

    def _hello(self, index: int) -> Hello:
        predecessor = self.predecessor(index) if self.rank >= 0 else None
        return Hello(client_id=self.client_id, world_size=self.world_size, rank=self.rank,
                     group=self.group, resume=self.position(index) if self.rank >= 0 else (),
                     handed=self.handed(index) if self.links[index].stale else (),
                     handed_below=self.handed_below(index) if self.links[index].stale else (),
                     batch_size=self.batch_size, drop_last=self.drop_last,
                     bucket_by=self.bucket_by, codecs=self.codecs,
                     predecessor=() if predecessor is None else predecessor[1:],
                     predecessor_server="" if predecessor is None else predecessor[0])

    def control(self, index: int, message: Message) -> list[Action]:
        """A control message from the server of link ``index``; raises a server's error."""
        link = self.links[index]
        if isinstance(message, Welcome):
            first = not link.server_id
            if not link.welcome(message) and not message.unknown:
                return [Grant(index)] if first else []
            # A new server process knows a trainer by its hello (a rank also says where it
            # stands, so the restarted server resumes the job there: docs/resume.md); one
            # that has no hello of this trainer asks for it (the hello went to a process
            # killed before it read it).
            return [Resync(index), Send(index, self._hello(index))]
        if isinstance(message, ShmOffer):
            return [Attach(index, message.path)]
        if isinstance(message, Drain):
            # The server stops once every trainer received all it sent: say how many came.
            return [Send(index, Heartbeat(
                sender_id=self.client_id,
                received_messages=self.received.get(message.server_id, 0),
                group=self.group,
            ))]
        if isinstance(message, EndOfStream):
            link.end_of_stream(message.server_id)
        elif isinstance(message, Error):
            refusals = self._refused.get(index, 0) + 1
            kind = message.type.rsplit(".", 1)[-1]
            if kind == CLIENT_ID_TAKEN:
                if refusals <= CLIENT_ID_RETRIES:
                    self._refused[index] = refusals  # hello again at the next beat
                    return []
                raise ConfigurationError(f"{message.message} (server {link.control_address})")
            if kind == RANK_TAKEN and refusals <= RANK_TAKEN_RETRIES:
                # Maybe our own crashed predecessor: say hello again at each beat (instead
                # of a heartbeat) until data comes.
                log.warning("%s (server %s); trying again for a while", message.message,
                            link.control_address)
                self._refused[index] = refusals
                return []
            raise link.error(message)
        return []

    def move(self, index: int, data_address: str, control_address: str) -> list[Action]:
        """The server of link ``index`` now listens on these endpoints: say hello there."""
        link = self.links[index]
        log.warning("server %s moved: data %s, control %s (was %s, %s)", link.server_id or "?",
                    data_address, control_address, link.data_address, link.control_address)
        link.data_address, link.control_address = data_address, control_address
        self._refused.pop(index, None)
        if self.rank >= 0 and link.server_id:
            # A rank's server restarted elsewhere: nothing more of the old process is handed
            # out (the new one resumes where this rank stands, said in the hello).
            link.stale.add(link.server_id)
            return [Resync(index), Send(index, self._hello(index))]
        return [Grant(index), Send(index, self._hello(index))]

    def data_end_of_stream(self, index: int, server_id: str) -> None:
        """An end of stream on the data socket of link ``index``."""
        self.links[index].end_of_stream(server_id, on_data_socket=True)

    def data(self, server_id: str, first_epoch: int, *, now: float) -> Sequence[Action]:
        """A data message from ``server_id`` whose first sample is of ``first_epoch``.

        ``first_epoch`` is 0 for a message with no sample. This runs once per data
        message: an empty tuple when there is nothing to do keeps it cheap.
        """
        actions: Sequence[Action] = ()
        if self._first_data:
            self._first_data = False
            self._silent_since = now
        count = self.received.get(server_id)
        if count is None:
            count = 0
            if self._refused:  # data: this rank was admitted after all
                self._refused.clear()
            if server_id not in {link.server_id for link in self.links}:
                # A restarted server (or a first message racing its welcome): hello again.
                actions = self.hello()
        self.received[server_id] = count + 1
        if first_epoch > 1 and self.epoch_size is None:
            # An epoch has ended, so the server knows its size: ask now, not at the next beat.
            self._last_heartbeat = -math.inf
        if self._silent_since is not None:
            self._check_control_answers(now)
        return actions

    def tick(self, now: float, waiting_from: float | None = None) -> Sequence[Action]:
        """The heartbeats due at time ``now`` (each one also asks for a fresh welcome),
        while the loop waits for data since ``waiting_from`` (None: it does not wait).

        Each carries the share of the time since the last one that the loop waited
        for data: the trainer's wait as a whole, the same to every server.
        """
        if now - self._last_heartbeat < self.heartbeat_interval:
            return ()
        self._last_heartbeat = now
        waited = self.wait_share(now, waiting_from)
        return [
            Send(index, self._hello(index)) if index in self._refused else
            Send(index, Heartbeat(sender_id=self.client_id,
                                  received_messages=self.received.get(link.server_id, 0),
                                  group=self.group, wait_fraction=waited))
            for index, link in enumerate(self.links)
        ]

    def wait(self, waited_from: float, now: float) -> float:
        """Seconds to wait for data now, having waited since ``waited_from``.

        Raises :class:`~feedmux.errors.TransportTimeoutError` once the timeout has
        passed. Never more than a heartbeat interval, so heartbeats keep going out.
        After :data:`WAIT_NOTICE` seconds of a wait, and every :data:`WAIT_REPEAT`
        seconds after, it warns of what it waits for and the likely causes (a
        WARNING: a loader is never silent by default), and a trainer whose
        shared-memory views fill a server's pool is told so (WARNING).
        """
        waited = now - waited_from
        self._notice(waited_from, waited)
        if self.timeout is None:
            return self.heartbeat_interval
        if waited >= self.timeout:
            addresses = ", ".join(link.data_address for link in self.links)
            held = self.held_views()
            raise TransportTimeoutError(
                f"no data from {addresses} for {self.timeout:g} s ({self.describe()})"
                + (f"; {held}" if held else "")
            )
        return min(self.heartbeat_interval, self.timeout - waited)

    def _notice(self, waited_from: float, waited: float) -> None:
        started, due, looked = self._waiting
        if started != waited_from:  # a new wait
            started, due, looked = waited_from, WAIT_NOTICE, False
        if not looked and waited >= HELD_CHECK:
            looked = True
            held = self.held_views()
            if held:
                log.warning("%s", held)
        if waited >= due:
            due += WAIT_REPEAT
            log.warning("%s", self.waiting(waited))
        self._waiting = (started, due, looked)

    def waiting(self, waited: float) -> str:
        """What this trainer has been waiting ``waited`` seconds for, and the likely causes.

        Examples
        --------
        >>> links = ServerLinks(["tcp://h:5555"], ["tcp://h:5556"], client_id="t",
        ...                     world_size=1, timeout=None,
        ...                     heartbeat_interval=1.0)
        >>> links.waiting(10.0)
        'no answer from data tcp://h:5555 / control tcp://h:5556 for 10 s: no feedmux serve running there, a wrong host or port, a firewall in between, or the server busy sampling (a slow first sample)'
        """  # noqa: E501
        lines = []
        for link in self.links:
            if not link.server_id:
                lines.append(
                    f"no answer from data {link.data_address} / control "
                    f"{link.control_address} for {waited:.0f} s: no feedmux serve running "
                    "there, a wrong host or port, a firewall in between, or the server busy "
                    "sampling (a slow first sample)"
                    + (" (the control endpoint is derived from the data one unless given: "
                       "RemoteLoader(control=...))" if link.control_derived else ""))
            elif not link.finished:
                lines.append(
                    f"server {link.server_id} at data {link.data_address} / control "
                    f"{link.control_address} answers but has sent no data for {waited:.0f} s: "
                    + self._causes(link))
        return "; ".join(lines) or f"waiting {waited:.0f} s for the servers to end the stream"

    def _causes(self, link: ServerLink) -> str:
        if self.rank >= 0:
            return (f"it deals to the ranks once all {self.world_size} of them are connected "
                    "(see its log), or it is slow to sample")
        return ("it waits for more trainers (--min-trainers), is slow to sample, or other "
                f"trainers take what it has: feedmux top {link.control_address} shows which")

    def held_views(self) -> str:
        """Why no data may come: this trainer holds most of a server's shared memory ('' if not)."""
        views, held, pool = self.views_held()
        if not pool or held < HELD_SHARE * pool:
            return ""
        return (f"this trainer holds {views} view(s) of the server's shared memory "
                f"({held / 2**20:.0f} MiB of its {pool / 2**20:.0f} MiB pool), so the server "
                "has no room to send more: keep copies of what you keep (np.array(x)) or "
                "let the samples go sooner, or use RemoteLoader(shm=False) or a larger pool "
                "(feedmux serve --shm-size)")

    # -- decisions ------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether every server said its stream has ended."""
        return all(link.finished for link in self.links)

    @property
    def data_addresses(self) -> list[str]:
        """The data endpoint of each server, in link order (where it listens now)."""
        return [link.data_address for link in self.links]

    @property
    def server_ids(self) -> list[str]:
        """The id of each server, in link order ('' until it answered)."""
        return [link.server_id for link in self.links]

    @property
    def epoch_size(self) -> int | None:
        """The total epoch size over all servers, once every one of them knows it."""
        sizes = [link.epoch_size for link in self.links]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)

    def length(self) -> int:
        """This trainer's share of an epoch; TypeError while the epoch size is unknown."""
        total = self.epoch_size
        if not self.links or total is None:
            raise TypeError(
                "the epoch size is not known yet: the server learns it after its first epoch "
                "(or declare it with --epoch-size)"
            )
        if self.rank >= 0:
            ranked = [link for link in self.links if link.world_size]
            if ranked:  # steps per epoch: every rank takes the same number
                return sum(self._steps(rank_steps(link.epoch_size or 0, link.world_size,
                                                  link.uneven)) for link in ranked)
        if self.batch_size:  # each server cuts its epoch into batches: the trainers share them
            total = sum(self._steps(link.epoch_size or 0) for link in self.links)
        return max(1, total // self.world_size)

    def _steps(self, samples: int) -> int:
        """What ``samples`` samples of one server's epoch make: batches, or samples."""
        return batch_steps(samples, self.batch_size, self.drop_last) if self.batch_size else samples

    def describe(self) -> str:
        """Each control endpoint (said so where derived) with its server, for error messages.

        Examples
        --------
        >>> links = ServerLinks(["tcp://h:5555"], ["tcp://h:5556"], client_id="t",
        ...                     world_size=1, timeout=None,
        ...                     heartbeat_interval=1.0, derived=[True])
        >>> links.describe()
        'control tcp://h:5556 (derived from the data endpoint) never answered'
        """
        return ", ".join(
            f"control {link.control_address}"
            + (" (derived from the data endpoint)" if link.control_derived else "")
            + (f": server {link.server_id}" if link.server_id else " never answered")
            for link in self.links
        )

    def _check_control_answers(self, now: float) -> None:
        """Warn once when data flows but a control endpoint never answered (a wrong address)."""
        silent = [link.control_address for link in self.links if not link.server_id]
        if not silent:
            self._silent_since = None
            return
        assert self._silent_since is not None
        if now - self._silent_since > CONTROL_SILENCE_WARNING:
            log.warning(
                "data is arriving but the control endpoint(s) %s never answered in %g s: "
                "is the control address right? (default: data port + 1) Without it this "
                "loader learns no epoch size, no end of stream and no remote errors",
                ", ".join(silent), CONTROL_SILENCE_WARNING,
            )
            self._silent_since = None
