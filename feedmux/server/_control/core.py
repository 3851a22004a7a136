"""The server's control logic as a state machine: events in, messages to send out.

:class:`ControlCore` owns the trainer registry, the hello / welcome handshake,
heartbeats and liveness, the wait for ``min_trainers``, the end-of-stream
handshake (drain questions, the accounting of what every trainer — present or
departed — received, the bounded waits), the final word repeated to late
speakers, and the statistics. Each event is a method call that is given the
time (``now``, seconds on a monotonic clock) and returns the messages to send
as ``(identity, message)`` pairs. It must never touch a socket, read a clock,
start a thread or sleep: the shell (:mod:`feedmux.server._shell`) does the I/O
and reports back what failed (:meth:`ControlCore.peer_gone`).

Phases: ``WAITING`` (for ``min_trainers``) → ``SAMPLING`` → ``DRAINING`` (after
the last data message of a finite run) → ``LAST_WORD`` (the final message has
gone out and is repeated to whoever speaks) → ``DONE``. A failure goes straight
to ``LAST_WORD`` from any phase.

Over 500 lines of code: the handshake, the registry, liveness and the end of
stream are one state machine, each event reading and moving the same registry
and phase; split into modules, each part would write the others' fields (what
tests/test_private_reaches.py forbids). The parts with state of their own
already live beside it (ranks, resume, rates, hand-outs).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from feedmux._plumbing.shmtable import pid_namespace
from feedmux._plumbing.sockets import HEARTBEAT_INTERVAL
from feedmux._ratelog import RateLimitedLog
from feedmux.errors import ProtocolError, VersionMismatchError
from feedmux.protocol import (
    Ack,
    Drain,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Message,
    Scale,
    ShmAttach,
    ShmOffer,
    Stats,
    StatsRequest,
    Welcome,
)
from feedmux.server._control.handouts import HandOuts
from feedmux.server._control.ranks import RANK_REFUSED, RankTables
from feedmux.server._control.rates import STEP, WINDOW, RateWindow
from feedmux.server._control.report import Stat, core_stats, progress_line, stats_page
from feedmux.server._control.resume import (
    CHECKPOINT,
    Handed,
    Start,
    agreed_start,
    check_announcement,
    describe,
    not_whole,
)
from feedmux.server._control.scaling import ScaleRequests
from feedmux.server._control.waiting import POLL_INTERVAL, TrainerWait
from feedmux.server._delivery.groups import DEFAULT_GROUP
from feedmux.server._delivery.ledger import Ledger
from feedmux.server._delivery.registry import Send, Sends
from feedmux.server._sources.producer import error_message
from feedmux.server.config import ServerConfig, refusal

__all__ = [
    "CLIENT_ID_TAKEN",
    "DRAIN_INTERVAL",
    "FINAL_GRACE",
    "NO_SENDS",
    "TRAINER_TIMEOUT",
    "ControlCore",
    "Phase",
    "Send",
    "Sends",
    "Stat",
]

log = logging.getLogger("feedmux.server")
#: Lines any peer can trigger (malformed or unexpected messages) go through this.
peer_log = RateLimitedLog(log)

#: A trainer not heard from for this long no longer counts as connected.
TRAINER_TIMEOUT = 3 * HEARTBEAT_INTERVAL
#: Seconds a finished or failed server keeps repeating its last word while nobody speaks.
FINAL_GRACE = 1.0
#: Seconds between two Drain questions of the end-of-stream handshake.
DRAIN_INTERVAL = 0.1
#: A trainer heard within this long answers the drain questions (it waits for data).
ANSWERING = 2 * HEARTBEAT_INTERVAL
#: A ranked trainer heard within this long keeps its rank when a control send to it fails
#: while sampling: its control connection is down (a link that went down and comes back; the
#: trainer reconnects under the same identity), which is not a departure. Longer than a
#: data connection to a host that is really gone takes to close when idle (TCP keepalive:
#: 10 s + 3 probes 5 s apart) or, on a reliable server, holding data unacknowledged
#: (``HALF_OPEN_TIMEOUT``, 15 s). A plain server's data connection with data in flight has
#: no such bound (see ``make_socket``): there a holder that really died is replaced by a
#: contender, admitted once the holder has not been heard for ``TRAINER_TIMEOUT``.
CONTROL_GRACE = 30.0
#: The error type of a hello refused because a live trainer holds its client id.
CLIENT_ID_TAKEN = "feedmux.errors.ClientIdInUseError"
#: The error type a free trainer gets for a batch whose samples do not stack.
BATCH_NOT_BUILT = "feedmux.errors.DataError"
#: Trainer ids remembered to count reconnects (ids come from peers: the set is bounded).
MAX_REMEMBERED_TRAINERS = 10_000
#: The batch shape of a trainer that takes single samples.
NO_BATCH_SHAPE = (0, False, "")
#: Refused ranks' reasons kept for the job's other ranks (hellos come from peers: bounded).
MAX_REFUSALS = 4
#: Refused ranks' client ids the core remembers (each a few dozen bytes: anyone can say
#: hello).
MAX_REFUSED_RANKS = 64

#: The answer of an event that sends nothing (shared: the data path allocates nothing).
NO_SENDS: Sends = ()


class Phase(enum.Enum):
    WAITING = "waiting for trainers"
    SAMPLING = "sampling"
    DRAINING = "draining"
    LAST_WORD = "repeating the last word"
    DONE = "done"


@dataclass
class _Trainer:
    client_id: str
    last_seen: float
    received_messages: int = 0
    rank: int = -1
    group: str = DEFAULT_GROUP
    #: What a free reliable trainer that outlived its server handed out lately (its hello).
    handed: tuple[int, ...] = ()
    #: The old server's last summary of every trainer's hand-outs that it read (its hello).
    handed_below: tuple[int, ...] = ()
    #: How many free trainers share the stream, itself included, as its hello said (its
    #: ``world_size``: each worker of a DataLoader says how many workers there are).
    sharers: int = 1
    #: It mapped this server's shared-memory pool (proved by the pool's token).
    shm: bool = False
    #: A free trainer's batch shape, ``(batch_size, drop_last, bucket_by)`` (0: single
    #: samples; "": batches of consecutive samples).
    batch: tuple[int, bool, str] = NO_BATCH_SHAPE
    #: The codecs of compressed frames it inflates (its hello; none: an older trainer).
    codecs: frozenset[int] = frozenset()
    #: When a drain last sent it a heartbeat to see whether it is still there.
    probed: float = float("-inf")
    #: Its latest reported wait fraction and when it came (None: it reports none;
    #: ``waitshare.py`` reads it).
    wait: tuple[float, float] | None = None
    #: Its received messages per second over the last seconds (its heartbeats' counts).
    rates: RateWindow = field(default_factory=RateWindow)
    #: It was said lost in the log (silent for ``TRAINER_TIMEOUT``) and has not spoken since.
    silent: bool = False
    #: A control send to it failed since it was last heard (a ranked trainer kept through
    #: an outage): its client id does not hold off a newcomer's hello.
    unreachable: bool = False

    def heard(self, beat: Heartbeat, now: float) -> None:
        """Its heartbeat at ``now``: alive, its count, its wait when it says it (an answer
        to a drain, or an older trainer, says none: the last report stands until stale)."""
        self.last_seen = now
        self.unreachable = False
        self.received_messages = beat.received_messages
        self.rates.add(now, beat.received_messages)
        if beat.wait_fraction is not None:
            self.wait = (beat.wait_fraction, now)

    def describe(self) -> str:
        """``trainer ID`` with its rank and group when it has them, for the log."""
        rank = f" (rank {self.rank})" if self.rank >= 0 else ""
        group = f" of group {self.group}" if self.group != DEFAULT_GROUP else ""
        return f"trainer {self.client_id}{rank}{group}"


class Questions:
    """What the server asks all its trainers (drains, epoch sizes): never a trainer that
    has not answered the last question, and when a free trainer's own stream is over.

    A trainer that is not reading (a torch DataLoader worker whose results wait in
    the DataLoader's queue, a long training step) must not find its control queue
    filled with questions: libzmq stops reading a connection whose queue is full,
    its ZMTP heartbeats then time out, and libzmq 4.3 can abort the trainer
    (``_input_stopped``, libzmq issue 3937). So a trainer asked and not heard
    since is asked nothing more until it speaks.

    Examples
    --------
    >>> questions = Questions()
    >>> questions.ask([b"t1", b"t2"], "size?")
    [(b't1', 'size?'), (b't2', 'size?')]
    >>> questions.ask([b"t1", b"t2"], "drained?")  # neither has answered yet
    []
    >>> questions.heard(b"t2"); questions.ask([b"t1", b"t2"], "drained?")
    [(b't2', 'drained?')]
    """

    def __init__(self) -> None:
        self._unanswered: set[bytes] = set()

    def ask(self, trainers: Collection[bytes], message: Message) -> Sends:
        """``message`` to each of ``trainers`` that answered the last question."""
        self._unanswered &= set(trainers)
        asked = [identity for identity in trainers if identity not in self._unanswered]
        self._unanswered.update(asked)
        return [(identity, message) for identity in asked]

    def heard(self, identity: bytes) -> None:
        """The trainer ``identity`` spoke: it may be asked again."""
        self._unanswered.discard(identity)


def _group_of(trainers: Mapping[bytes, _Trainer], client_id: str) -> str | None:
    """The group of the trainer ``client_id`` (its acknowledging socket is not its own);
    None once it is gone (its last acknowledgement can arrive after its departure)."""
    return next((t.group for t in list(trainers.values()) if t.client_id == client_id), None)


class ControlCore:
    """Trainer registry, handshake, liveness, drain and statistics of one server.

    ``started`` is the time the server started; ``pid`` is reported in the
    statistics; ``extra_stats`` adds the reliable dispatch's figures to them.
    """

    def __init__(self, config: ServerConfig, started: float, pid: int = 0,
                 extra_stats: Callable[[], dict[str, Stat]] | None = None) -> None:
        self.config = config
        self.pid = pid
        self.extra_stats = extra_stats
        self.trainers: dict[bytes, _Trainer] = {}
        self.phase = Phase.SAMPLING
        self.started = started
        self.samples_sent = 0
        self.messages_sent = 0
        self.epoch = 0
        self.epoch_position = 0
        self.epochs_completed = 0
        self.reconnects = 0
        self._seen_clients: set[str] = set()
        self.epoch_size: int | None = config.epoch_size
        self.finished = False
        self.final_message: Error | EndOfStream | None = None
        self.departed = 0
        #: Control sends that found a ranked trainer's control link down (it kept its rank).
        self.unreachable_sends = 0
        self.departed_received = 0
        self._last_log = started
        #: Samples sent per second over the last ``WINDOW`` seconds (None: no rate yet).
        self.rate: float | None = None
        self.rates = RateWindow()
        #: The count field's sum so far (``--count-field``; set by the shell, which reads the
        #: sampling processes' meters), and its rate as ``rate``'s.
        self.counted: Callable[[], float] | None = None
        self.count_rate: float | None = None
        self.count_rates = RateWindow()
        self._next_look = started
        #: The ledgers of what the trainers were sent and did not hand out yet, where the
        #: server learns hand-outs (the ranks'; the shell adds the reliable free trainers').
        self.handout_ledgers: Callable[[], list[Ledger]] = lambda: self.tables.ranked_ledgers()
        #: The client ids of the trainers that granted credit, where the data path deals by
        #: credit (the shell sets it on a reliable server; None: every trainer is dealt to).
        self.granted: Callable[[], Collection[str] | None] = lambda: None
        #: The batch shapes of the free trainers that asked for batches, by client id.
        self._batch_shapes: dict[bytes, tuple[int, bool, str]] = {}
        self.handouts = HandOuts()
        #: The latest refused ranks (rank, client id, why): the job's other ranks hear why.
        self.refusals: deque[tuple[int, str, str]] = deque(maxlen=MAX_REFUSALS)
        #: The client ids of the latest refused ranks (and of the ranks of groups given
        #: up): a heartbeat of one (its loader has not read the error yet) is answered with
        #: a welcome, never taken for a free trainer's.
        self.refused_ranks: deque[str] = deque(maxlen=MAX_REFUSED_RANKS)
        #: The wait for trainers before sampling (who is missing, when welcomed).
        self.wait = TrainerWait()
        self.drain_deadline = 0.0
        self._next_drain = 0.0
        self.questions = Questions()
        self._last_total = (-1, -1)  # (received, sent) at the drain's last change
        self._last_change = 0.0
        self._final_started = self._last_heard = 0.0
        #: The rank tables: the server's own, or one per consumer group.
        self.tables = RankTables(config.grouped, 4 * config.hwm + 64)
        self.tables.batches.default_bucket_by = config.bucket_by
        self.ranks = self.tables.server
        #: What each rank was sent beyond what it handed out (for a restarted rank).
        self.retention = self.tables.retention
        #: Where the ranks agreed to resume, (epoch, position); None: from the start.
        self.start_at: tuple[int, int] | None = None
        #: Live ranks further on than ``start_at``: where each is (nothing before is re-dealt).
        self.ranks_ahead: dict[int, tuple[int, int]] = {}
        #: Free reliable trainers that outlived their server: what they had (not re-dealt).
        self.handed = Handed(())
        #: Set when a ranked job restarted from a checkpoint mid-run: the sampler must
        #: stop, and start again at ``start_at`` once the new job's ranks are all here.
        self.restarting = False
        #: The oldest epoch the stream can still give a consumer group whole (the shell
        #: sets it to the groups' buffer's once it has one); without a buffer, any before
        #: sampling starts, else none the sampler may have begun.
        self.oldest_whole: Callable[[], int] = lambda: (
            1 if self.phase is Phase.WAITING else self.epoch + 2)
        #: (path, token) of the shared-memory pool offered to trainers, if there is one.
        self.shm: tuple[str, str] | None = None
        #: ``feedmux scale`` requests, for the sampling workers' pool.
        self.scaling = ScaleRequests(config.server_id)

    # -- events: the trainers ---------------------------------------------------------------
    def receive(self, identity: bytes, message: Message, now: float) -> Sends:
        """A decoded control message from ``identity``."""
        self._last_heard = now
        if isinstance(message, Ack) and message.rank >= 0:
            # A ranked trainer's hand-out mark, from a socket that reads nothing: no answer.
            # It is also the sign of life of the rank's holder (sent from the loader's thread);
            # one for a rank the trainer's group does not deal to counts for nothing.
            group = _group_of(self.trainers, message.client_id) if self.tables.grouped else ""
            holder = self.tables.acknowledged(group, message, self.config.server_id)
            if holder and holder in self.trainers:
                self.trainers[holder].last_seen = now
            return NO_SENDS
        if self.final_message is not None and not isinstance(message, StatsRequest):
            return [(identity, self.final_message)]
        if isinstance(message, Hello):
            if message.role == "trainer":
                return self._hello(identity, message, now)
            return [(identity, self._probe_welcome(message))]
        if isinstance(message, ShmAttach):
            self._shm_attached(identity, message)
            return NO_SENDS
        if isinstance(message, Heartbeat):
            trainer = self.trainers.get(identity)
            if trainer is None and (self.phase is Phase.WAITING
                                    or self.tables.of(message.group).ranked
                                    or message.sender_id in self.refused_ranks):
                # A ranked trainer is known by its hello alone (its rank), and so is every
                # trainer before sampling starts (a rank's heartbeat must not start a free
                # run): the welcome tells it this is a new server, it says hello.
                return [(identity, self._unknown_welcome(message.group))]
            if trainer is None:
                if (taken := self._id_taken(identity, message.sender_id, now)) is not None:
                    return taken  # not a trainer of its own: its hello was refused
                trainer = self.trainers[identity] = _Trainer(
                    message.sender_id, now, group=message.group or DEFAULT_GROUP)
                self._count_reconnect(message.sender_id)
            trainer.heard(message, now)
            return self._heartbeat_answer(identity, trainer)
        if isinstance(message, StatsRequest):
            return [(identity, Stats(stats_page(self.stats(now), message.after)))]
        if isinstance(message, Scale):
            return [(identity, self.scaling.request(message))]
        peer_log.log(logging.WARNING, "unexpected", "unexpected %s on the control socket from %r",
                     type(message).__name__, identity[:16])
        problem = f"expected Hello, Heartbeat, StatsRequest or Scale, got {type(message).__name__}"
        return [(identity, Error(type="feedmux.errors.ProtocolError", message=problem,
                                 server_id=self.config.server_id))]

    def _hello(self, identity: bytes, message: Hello, now: float) -> Sends:
        """A trainer's hello: admit it (its rank, if any) or tell it why not."""
        sends: list[Send] = []
        if (taken := self._id_taken(identity, message.client_id, now)) is not None:
            return taken
        if (why := self._not_whole(message)) is not None:
            log.warning("refused trainer %s: %s", message.client_id, why)
            self.refused_ranks.append(message.client_id)
            return [(identity, Error(type=RANK_REFUSED, message=why,
                                     server_id=self.config.server_id))]
        if self._restarts_job(message):
            sends = self._restart_job(message)
        elif self.tables.restarts_group(message):
            sends = self._restart_group(identity, message)
        refused = self.tables.admit(identity, message, lambda holder: self._alive(holder, now))
        if refused is not None:
            log.warning("refused trainer %s: %s", message.client_id, refused[1])
            if message.rank >= 0 and self.phase is Phase.WAITING:
                self.refusals.append((message.rank, message.client_id[:64], refused[1]))
            if message.rank >= 0:
                self.refused_ranks.append(message.client_id)
            sends.append((identity, Error(type=refused[0], message=refused[1],
                                          server_id=self.config.server_id)))
            holder = self.tables.of(message.group).holder(message.rank)
            if holder is not None and holder[0] != identity:
                # Is the holder still there? A failed send tells (peer_gone frees the rank).
                sends.append((holder[0], self.welcome(message.group)))
            return sends
        if (said := self.tables.predecessor_said(message, self.config.server_id)) is not None:
            log.info("rank %d: its predecessor handed out up to %s (its mark file), past the "
                     "last mark it sent", message.rank, said)
        known = identity in self.trainers
        group = message.group or DEFAULT_GROUP
        # A free reliable trainer that outlived its server: what it had is not dealt again.
        self.trainers[identity] = _Trainer(message.client_id, now, rank=message.rank, group=group,
                                           handed=self.handed.heard(message),
                                           handed_below=message.handed_below,
                                           codecs=frozenset(message.codecs),
                                           batch=(message.batch_size, message.drop_last,
                                                  message.bucket_by)
                                           if message.rank < 0 else NO_BATCH_SHAPE,
                                           sharers=max(1, message.world_size)
                                           if message.rank < 0 else 1)
        shape = self.trainers[identity].batch
        self._batch_shapes.pop(message.client_id.encode(), None)
        if shape != NO_BATCH_SHAPE:  # (ids come from peers: bounded, the oldest forgotten)
            if len(self._batch_shapes) >= MAX_REMEMBERED_TRAINERS:
                del self._batch_shapes[next(iter(self._batch_shapes))]
            self._batch_shapes[message.client_id.encode()] = shape
        if not known:
            rank = f" as rank {message.rank} of {message.world_size}" if message.rank >= 0 else ""
            where = f" in group {group}" if self.tables.grouped else ""
            log.info("trainer %s connected%s%s", message.client_id, rank, where)
            self._count_reconnect(message.client_id)
        return [*sends, (identity, self.welcome(group)), *self._shm_offer(identity)]

    def _id_taken(self, identity: bytes, client_id: str, now: float) -> Sends | None:
        """The refusal of a newcomer ``identity`` whose ``client_id`` another live trainer
        holds (a data socket is named by the id: two would take each other's data), or
        None. The holder is not disturbed: it is only sent a welcome, whose failed send
        tells that it is gone (forgotten, or marked unreachable), and then the
        newcomer's next hello is admitted."""
        holder = next((other for other, trainer in self.trainers.items()
                       if other != identity and trainer.client_id == client_id
                       and not trainer.unreachable and self._alive(other, now)), None)
        if holder is None:
            return None
        peer_log.log(logging.WARNING, "client id", "refused a second trainer with client_id "
                     "%s: a live trainer holds it", client_id[:64])
        problem = (f"client_id {client_id!r} is in use by a live trainer of this server: "
                   "expected a client_id that no other connected RemoteLoader has (or none: "
                   "each loader then makes its own), got it from a second loader")
        return [(identity, Error(type=CLIENT_ID_TAKEN, message=problem,
                                 server_id=self.config.server_id)),
                (holder, self.welcome(self.trainers[holder].group))]

    def _alive(self, identity: bytes, now: float) -> bool:
        trainer = self.trainers.get(identity)
        return trainer is not None and now - trainer.last_seen <= TRAINER_TIMEOUT

    # -- where data goes --------------------------------------------------------------------
    def rank_target(self, rank: int, group: str = "") -> bytes | None:
        """The data-socket identity of the holder of ``rank`` (of ``group``; None while
        nobody holds it)."""
        holder = self.tables.of(group).holder(rank)
        return None if holder is None else holder[1].encode()

    def sharers(self, client_id: str) -> int:
        """How many free trainers share the stream with trainer ``client_id``, itself
        included, as its hello said (1: it said nothing, or it is not connected)."""
        for trainer in list(self.trainers.values()):
            if trainer.client_id == client_id:
                return trainer.sharers
        return 1

    def batch_shape(self, client_id: bytes) -> tuple[int, bool, str]:
        """Free trainer ``client_id``'s batch shape, ``(batch_size, drop_last, bucket_by)``
        (0: single samples, as for a trainer not connected); on the data path: a dict
        lookup."""
        return self._batch_shapes.get(client_id, NO_BATCH_SHAPE)

    def batch_hint(self) -> int:
        """The largest batch size a connected free trainer asked for (0: none): what the
        sampled messages are sized by (whole batches of it), so that cutting them is
        slicing. Once per message: the registry is small."""
        return max((trainer.batch[0] for trainer in list(self.trainers.values())
                    if trainer.rank < 0), default=0)

    def batch_shapes(self, audience: str,
                     refused: Collection[bytes] = ()) -> set[tuple[int, bool, str]]:
        """The batch shapes of the free trainers of ``audience`` ("": the server's, or the
        group default's; else a group's) that the data path can deal to (those that granted
        credit and are not lost, where it deals by credit), but the trainers ``refused``."""
        group = audience or DEFAULT_GROUP
        granted = self.granted()
        return {trainer.batch for trainer in list(self.trainers.values())
                if trainer.group == group and trainer.rank < 0
                and trainer.client_id.encode() not in refused
                and (granted is None or trainer.client_id in granted)}

    def refuse_batch(self, client_id: str, problem: str) -> Sends:
        """A batch for free trainer ``client_id`` could not be built (its samples do not
        stack): its error, not the server's; the others go on. Nobody to tell (it is
        gone): only the log says it."""
        log.warning("trainer %s gets an error instead of a batch: %s", client_id[:64], problem)
        return [(identity, Error(type=BATCH_NOT_BUILT, message=problem,
                                 server_id=self.config.server_id))
                for identity, trainer in list(self.trainers.items())
                if trainer.client_id == client_id]

    def _count_reconnect(self, client_id: str) -> None:
        """A trainer id seen before arrived on a new connection: count a reconnect."""
        if client_id in self._seen_clients:
            self.reconnects += 1
        elif len(self._seen_clients) < MAX_REMEMBERED_TRAINERS:  # bounded: ids come from peers
            self._seen_clients.add(client_id)

    def malformed(self, identity: bytes, error: ProtocolError, now: float) -> Sends:
        """A control message from ``identity`` that did not decode.

        The peer may be anyone who can reach the port, so it gets the error's kind
        and nothing else (no detail of the decoder, no traceback); the detail goes
        to the log, rate-limited.
        """
        self._last_heard = now
        peer_log.log(logging.WARNING, "malformed", "malformed control message from %r: %s",
                     identity[:16], error)
        return [(identity, malformed_reply(error, self.config.server_id))]

    def control_full(self, identity: bytes) -> None:
        """A control message to ``identity`` found its queue full: on a ranked job's
        server, a rank busy in a long step (its holder stays: its acknowledgements tell
        whether it lives); any other trainer is taken for gone."""
        if not self.ranks.ranked:
            self.peer_gone(identity)

    def peer_gone(self, identity: bytes, lost: bool = True) -> None:
        """A send to ``identity`` failed (``lost``; else its run is over): forget it, keep
        what it had received for the count."""
        gone = self.trainers.pop(identity, None)
        self.tables.release(identity)
        if gone is not None:
            self.departed += 1
            self.departed_received += gone.received_messages
            if not lost:
                return
            if self.phase in (Phase.WAITING, Phase.SAMPLING):
                log.warning("%s lost (its connection is gone): %s", gone.describe(),
                            self._fate(gone))
            elif self.phase is Phase.DRAINING:
                log.info("%s left during the end of the stream", gone.describe())

    def gave_up(self, identity: bytes, lost: bool = True) -> None:
        """``identity``'s group was given up, and it was told why: forget it (as
        :meth:`peer_gone`), and take a beat of it (its loader has not read the error yet)
        for a refused rank's."""
        trainer = self.trainers.get(identity)
        if trainer is not None and trainer.rank >= 0:
            self.refused_ranks.append(trainer.client_id)
        self.peer_gone(identity, lost)

    def _fate(self, trainer: _Trainer) -> str:
        """What becomes of the samples a lost trainer was sent and had not handed out."""
        if trainer.rank >= 0:
            return (f"the samples it was sent and had not handed out are kept for the next "
                    f"trainer of rank {trainer.rank}")
        return "the samples it had not handed out are re-dealt to the other trainers"

    # -- events: the sampler ----------------------------------------------------------------
    def begin(self) -> Sends:
        """The sockets are bound: hold sampling until the trainers said hello.

        The first hello tells the mode: free trainers (then ``min_trainers``,
        at least one, must be connected) or the ranks of one job (then all of
        them, within ``rank_timeout`` seconds of the first).
        """
        self.phase = Phase.WAITING
        log.info("waiting for %d trainer(s) to connect", max(1, self.config.min_trainers))
        return NO_SENDS

    def restarted(self) -> None:
        """The sampler stopped the run of a job that restarted from a checkpoint
        (:attr:`restarting`) and starts the new job's run, at ``start_at`` once its
        ranks are all here."""
        self.restarting = False

    def data_sent(self, n_samples: int, epoch: int) -> None:
        """One data message left (the hot path: counters only)."""
        self.messages_sent += 1
        self.samples_sent += n_samples
        if epoch > self.epoch:
            self.epoch, self.epoch_position = epoch, 0
        self.epoch_position += n_samples

    def epoch_finished(self, epoch: int, count: int) -> Sends:
        """Every sample of ``epoch`` (``count`` of them) has been sent."""
        self.epochs_completed = max(self.epochs_completed, epoch)
        if count and self.epoch_size != count:  # 0: the epoch failed at once (on_error skip)
            if self.epoch_size is not None:
                log.warning("epoch %d had %d samples, expected %s", epoch, count, self.epoch_size)
            self.epoch_size = count
            log.info("epoch size is %d samples", count)
        # Sampled, not consumed: a deep queue and a slow trainer are far behind this.
        log.info("epoch %d sampled: %d samples sent to the trainers", epoch, count)
        self.handouts.sampled(epoch)
        # Trainers size their epochs from this: tell them now rather than at their next heartbeat.
        return self.questions.ask(self.trainers, self.welcome())

    def finish(self, now: float) -> Sends:
        """The last data message has left: start the end-of-stream handshake.

        It is done when the trainers' counts add up to every message sent.
        While some are missing, the server waits: they are in flight or queued
        at a live trainer. Only once a trainer has gone (its queue died with
        it) does a count that stays put for ``drain_idle`` seconds end the wait
        early, and then only while every trainer still here keeps answering
        the drain questions: a trainer waiting for data answers each one, a
        slow trainer busy with its tail answers none until it reads again, and
        is waited for. ``drain_timeout`` bounds the wait in every case (a
        trainer that stopped reading). Reliable mode ends on acknowledgements instead; the
        shell calls :meth:`end_stream` then.
        """
        self.finished = True
        self.phase = Phase.DRAINING
        self.drain_deadline = now + self.config.drain_timeout
        self._last_total, self._last_change, self._next_drain = (-1, -1), now, now
        return NO_SENDS

    def end_stream(self, now: float, reason: str = "") -> Sends:
        """Broadcast ``EndOfStream`` (``reason``: why some messages went unconfirmed)."""
        if reason:
            log.warning("ending the stream with %d of %d data messages unconfirmed (%s)",
                        self.messages_sent - self.received_total(), self.messages_sent, reason)
        self._log_handed_out()
        log.info("stream finished after %d epoch(s), %d samples", self.epochs_completed,
                 self.samples_sent)
        return self.last_word(self.end_message(), now)

    def end_message(self) -> EndOfStream:
        return EndOfStream(self.config.server_id, self.epochs_completed, self.messages_sent)

    def fail(self, error: BaseException | Error, now: float) -> Sends:
        """Sampling failed: tell every trainer, and whoever speaks next."""
        message = error if isinstance(error, Error) else error_message(error, self.config.server_id)
        return self.last_word(message, now)

    def last_word(self, message: Error | EndOfStream, now: float) -> Sends:
        """Broadcast the server's final message and repeat it to whoever speaks next.

        The server keeps answering with ``message`` until it has been quiet for
        ``FINAL_GRACE`` seconds (at most ``4 * FINAL_GRACE``), so that a trainer
        whose hello or heartbeat crossed the broadcast, or connected just
        before the end, still learns why the stream stopped.
        """
        self.final_message = message
        self.phase = Phase.LAST_WORD
        self._final_started = self._last_heard = now
        return self.broadcast(message)

    # -- time -------------------------------------------------------------------------------
    def tick(self, now: float) -> Sends:
        """Time has passed: move on if the phase is over, and say what is due."""
        phase = self.phase
        if phase is Phase.SAMPLING:
            if now >= self._next_look:
                self.look(now)
                if now - self._last_log >= self.config.log_every:
                    self._log_throughput(now)
            return NO_SENDS
        if phase is Phase.WAITING:
            return self._tick_waiting(now)
        if phase is Phase.DRAINING:
            if now >= self._next_look:
                self.look(now)
            return self._drain(now)
        if phase is Phase.LAST_WORD:
            if (now - self._last_heard > FINAL_GRACE
                    or now - self._final_started > 4 * FINAL_GRACE):
                self.phase = Phase.DONE
        return NO_SENDS

    def wait_time(self, now: float) -> float:
        """How long the shell may wait for control messages before the next :meth:`tick`."""
        if self.phase is Phase.DRAINING:
            return max(0.0, self._next_drain - now)
        return POLL_INTERVAL

    def _drain(self, now: float) -> Sends:
        total = self.received_total()
        if total >= self.messages_sent:
            return self.end_stream(now)
        # Progress is a count that moved, or a message sent meanwhile (a restarted rank's
        # hand-over: its predecessor's rest is sent during the drain, then received).
        if (total, self.messages_sent) != self._last_total:
            self._last_total, self._last_change = (total, self.messages_sent), now
        # Not while a dead rank's rest waits for its successor (drain_timeout bounds that).
        idle = now - self._last_change > self.config.drain_idle and not self._owed_to_a_successor()
        stalled = idle and (not self.trainers or (self.departed and self._all_answering(now)))
        if stalled or now > self.drain_deadline:
            return self.end_stream(now, f"{self.departed} trainer(s) went away" if stalled
                                   else "a trainer stopped reading")
        if now < self._next_drain:
            return NO_SENDS
        # Ask at a steady pace: answering each reply with a new question would make a
        # drained trainer and the server ping-pong without end.
        self._next_drain = now + DRAIN_INTERVAL
        drain = Drain(self.messages_sent, self.config.server_id)
        return [*self.questions.ask(self.trainers, drain), *self._probe_silent(now)]

    def _probe_silent(self, now: float) -> Sends:
        """A heartbeat, once per :data:`TRAINER_TIMEOUT`, to each trainer silent that long.

        A trainer asked a question it never answered is asked nothing more, so no send
        would find a SIGKILLed one gone (ROUTER_MANDATORY) and the drain waited its whole
        timeout for it; a live trainer busy in a long step finds one small message every
        few seconds in its queue, and ignores it.
        """
        silent = [(identity, trainer) for identity, trainer in self.trainers.items()
                  if now - max(trainer.last_seen, trainer.probed) > TRAINER_TIMEOUT]
        for _, trainer in silent:
            trainer.probed = now
        return [(identity, Heartbeat(sender_id=self.config.server_id)) for identity, _ in silent]

    def _all_answering(self, now: float) -> bool:
        """Whether every trainer was heard lately: each is waiting for data, none reading."""
        return all(now - t.last_seen <= ANSWERING for t in self.trainers.values())

    def look(self, now: float) -> None:
        """The rates, the trainers gone silent, the epochs handed out: every :data:`STEP`
        seconds (not on each data message), from :meth:`tick` and from the shell's waits
        for a trainer (a sampler held back by a full queue sends nothing and ticks not)."""
        if now < self._next_look:
            return
        self._next_look = now + STEP
        self.rates.add(now, self.samples_sent)
        self.rate = self.rates.rate()
        if self.counted is not None:
            self.count_rates.add(now, self.counted())
            self.count_rate = self.count_rates.rate()
        # A rank's loader proves it lives from a thread of its own (its hand-out marks,
        # every second even in a long step), so its silence is a loss; a free trainer in a
        # long step is silent and well (a reliable one is judged by the reliable link).
        ranks = [t for t in list(self.trainers.values()) if t.rank >= 0]
        for trainer in ranks if self.phase is Phase.SAMPLING else ():
            silent = now - trainer.last_seen > TRAINER_TIMEOUT
            if silent and not trainer.silent:
                log.warning("%s lost (no heartbeat for %.0f s): if it does not come back, %s",
                            trainer.describe(), now - trainer.last_seen, self._fate(trainer))
            elif trainer.silent and not silent:
                log.info("%s is back", trainer.describe())
            trainer.silent = silent
        self._log_handed_out()

    def _log_handed_out(self) -> None:
        """Say which sampled epochs the trainers handed out whole."""
        if not self.handouts.pending:
            return
        ledgers = self.handout_ledgers()
        if not ledgers:
            return
        held = [epoch for ledger in ledgers if (epoch := ledger.oldest_epoch()) is not None]
        for epoch in self.handouts.handed(min(held) if held else None):
            log.info("epoch %d handed out: the trainers took every sample of it", epoch)

    def _log_throughput(self, now: float) -> None:
        self._last_log = now
        counted = ""
        if self.counted is not None and self.count_rate is not None:
            counted = f", {self.count_rate:.0f} {self.config.count_field}/s"
        rate = "- samples/s (no rate yet)" if self.rate is None else (
            f"{self.rate:.0f} samples/s{counted} over the last {WINDOW:.0f} s")
        log.info(
            "epoch %d: %d samples sent, %s, %d trainer(s) connected%s",
            self.epoch, self.samples_sent, rate, self.connected_trainers(now),
            progress_line(self.epoch, self.epoch_position, self.epoch_size, self.rate),
        )

    # -- state ------------------------------------------------------------------------------
    def broadcast(self, message: Message) -> Sends:
        return [(identity, message) for identity in self.trainers]

    def welcome(self, group: str = "") -> Welcome:
        """What the server serves (to a trainer of ``group``: its world size)."""
        config = self.config
        ranks = self.tables.of(group)
        return Welcome(
            server_id=config.server_id,
            epoch_size=self.epoch_size,
            epoch=self.epoch,
            samples_per_message=config.samples_per_message or 0,
            finished=self.finished,
            workers=config.worker_range.maximum,
            reliable=config.reliable,
            world_size=ranks.world_size or 0,
            uneven=config.uneven if ranks.ranked else "",
        )

    def received_total(self) -> int:
        """Data messages the trainers, present and departed, said they received."""
        return self.departed_received + sum(
            t.received_messages for t in list(self.trainers.values()))

    def connected_trainers(self, now: float) -> int:
        return sum(1 for t in list(self.trainers.values()) if now - t.last_seen <= TRAINER_TIMEOUT)

    def live_members(self, now: float) -> dict[str, list[bytes]]:
        """Each group's trainers heard within ``TRAINER_TIMEOUT``, by data-socket identity."""
        groups: dict[str, list[bytes]] = {}
        for trainer in list(self.trainers.values()):
            if now - trainer.last_seen <= TRAINER_TIMEOUT:
                groups.setdefault(trainer.group, []).append(trainer.client_id.encode())
        return groups

    def dealt_trainers(self, now: float) -> int:
        """Connected trainers the data path can deal to now: those that granted credit, on
        a server that deals by credit. A trainer welcomed whose grant is still on its way
        gets nothing of the first messages: a short epoch would all go to the others, and
        a DataLoader's worker would start its first pass in the second epoch."""
        granted = self.granted()
        return sum(1 for t in list(self.trainers.values())
                   if now - t.last_seen <= TRAINER_TIMEOUT
                   and (granted is None or t.client_id in granted))

    def stats(self, now: float) -> dict[str, Stat]:
        return core_stats(self, now, TRAINER_TIMEOUT)

    def _heartbeat_answer(self, identity: bytes, trainer: _Trainer) -> Sends:
        """A trainer's heartbeat: the welcome (its end of stream comes with everyone's, once
        what every trainer had is handed out or dealt again)."""
        self.questions.heard(identity)
        return [(identity, self.welcome(trainer.group))]

    def _unknown_welcome(self, group: str) -> Welcome:
        """The welcome to a heartbeat from a trainer this server has no hello of. One it
        waits for is asked for its hello: the hello it sent may have gone to the process
        before this one, killed before it read it (it may never say it again otherwise)."""
        welcome = self.welcome(group)
        waiting = self.phase is Phase.WAITING
        return dataclasses.replace(welcome, unknown=True) if waiting else welcome

    def unreachable(self, identity: bytes, now: float) -> None:
        """A control send to ``identity`` failed (no connection to it now): forget it
        (:meth:`ControlCore.peer_gone`), unless it is a ranked trainer heard within
        :data:`CONTROL_GRACE` while sampling. A rank's holder whose control link is down
        for a while keeps its rank: its data connection has no heartbeats and outlives
        the outage, and its control connection comes back under the same identity, so
        forgetting it would leave its rank to a successor that never comes. The message
        that failed is lost; each heartbeat asks for a fresh welcome. A holder that really
        died is still replaced: a contender is admitted once the holder has not been heard
        for :data:`TRAINER_TIMEOUT`, and a failed data send forgets it at once."""
        trainer = self.trainers.get(identity)
        if (trainer is None or trainer.rank < 0 or self.phase is not Phase.SAMPLING
                or now - trainer.last_seen > CONTROL_GRACE):
            self.peer_gone(identity)
        else:
            trainer.unreachable = True
            self.unreachable_sends += 1

    def _tick_waiting(self, now: float) -> Sends:
        """:meth:`ControlCore.tick` while waiting for trainers: start once they are all here
        (and, for a job's ranks, agree where), fail when ranks never come, else welcome them."""
        # Count only after a welcome went out since the last look: a send to a trainer that
        # has gone fails (ROUTER_MANDATORY) and forgets it, so one that connected and left
        # does not count.
        config = self.config
        wait = self.wait
        if wait.ready(self.ranks, self.dealt_trainers(now), config.min_trainers, now):
            start, problem = agreed_start(self.ranks.resumes, self.ranks.world_size or 0)
            if not (self.ranks.ranked or self.tables.grouped):
                free = [t for t in self.trainers.values() if t.rank < 0]
                # A bucketing trainer's batches do not follow the positions (what its shape's
                # window held lies below its latest hand-out): no frontier past its summary.
                self.handed = Handed((t.handed for t in free if t.handed and not t.batch[2]),
                                     (t.handed_below for t in free if t.handed_below),
                                     ((t.handed, t.handed_below) for t in free
                                      if t.handed and t.batch[2]))
                start = Start(self.handed.start, {})
            if self.tables.grouped and start is not None:
                # A ranked group resumed from a checkpoint gets that epoch whole (its ranked
                # stage cuts it): the sampler seeks to it when no other group wants the ones before.
                start = Start(self.tables.resume_from(), {})
            if start is None:
                log.error("%s", problem)
                return self.fail(Error(type=RANK_REFUSED, message=problem,
                                       server_id=config.server_id), now)
            self.start_at, self.ranks_ahead = start
            if self.start_at is not None:
                log.info("resuming the job at epoch %d, position %d", *self.start_at)
            self.phase = Phase.SAMPLING
            return NO_SENDS
        if self.ranks.ranked and wait.overdue(now, config.rank_timeout):
            missing = self.ranks.missing()
            return self.fail(Error(
                type="feedmux.errors.TransportTimeoutError",
                message=(f"rank(s) {missing} of {self.ranks.world_size} never connected "
                         f"within the rank timeout of {config.rank_timeout:g} s"
                         f"{self._refusals(missing)}"),
                server_id=config.server_id), now)
        if not wait.welcome_due(now):
            return NO_SENDS
        return [(identity, self.welcome(trainer.group))
                for identity, trainer in self.trainers.items()]

    def _refusals(self, missing: list[int]) -> str:
        """Why the missing ranks were refused, when a trainer said it was one of them (or,
        failing that, any rank refused while the job waited): the other ranks learn the
        cause, not only that a rank never came."""
        refusals = [r for r in self.refusals if r[0] in missing] or list(self.refusals)
        if not refusals:
            return ""
        told = "; ".join(f"rank {rank} (trainer {client_id}) was refused: {why}"
                         for rank, client_id, why in refusals)
        return f"; {told}"

    def _owed_to_a_successor(self) -> bool:
        """Whether a rank (of the server's job or of a ranked group) has messages its holder's
        predecessor was sent and never handed out: nobody holds the rank yet, or its new
        holder has not been re-sent them (its successor gets them first: the stream must not
        end before they went)."""
        return self.tables.owed_to_a_successor()

    def _shm_offer(self, identity: bytes) -> list[Send]:
        """The pool offered after a welcome: a trainer on this host can map it."""
        if self.shm is None:
            return []
        return [(identity, ShmOffer(self.shm[0], self.config.server_id))]

    def _shm_attached(self, identity: bytes, message: ShmAttach) -> None:
        """A trainer says it mapped the pool: with the right token, it shares this host."""
        trainer = self.trainers.get(identity)
        if trainer is None or self.shm is None or message.token != self.shm[1]:
            return
        if message.pid_namespace not in (0, own := pid_namespace()):
            # The pool's claims name the trainer by a pid this process cannot see: it would
            # take the trainer for dead and write over the arrays it holds.
            log.warning("trainer %s maps the shared-memory pool from another PID namespace "
                        "(%d, this server's %d: a container with ipc: host needs pid: host "
                        "too, docs/containers.md); its samples go over the sockets",
                        trainer.client_id, message.pid_namespace, own)
            return
        trainer.shm = True
        log.info("trainer %s shares this host: large arrays go through shared memory",
                 trainer.client_id)

    def _restarts_job(self, message: Hello) -> bool:
        """Whether ``message`` is a rank of a job restarted from a checkpoint while this
        server samples for the previous run (not a member of the current one saying
        hello again, nor a consumer group's rank: :func:`_restart_group`)."""
        return (check_announcement(message.resume) is None and bool(message.resume)
                and message.resume[3] == CHECKPOINT and message.rank >= 0
                and message.group in ("", DEFAULT_GROUP)
                and not self.tables.grouped and self.phase in (Phase.SAMPLING, Phase.DRAINING)
                and message.client_id not in {c for _, c in self.ranks.holders.values()})

    def _restart_job(self, message: Hello) -> list[Send]:
        """A rank resumes from a checkpoint while its job runs: the whole job restarted
        (torchrun restarts every rank). Forget the previous job's ranks and what they
        were sent, and wait for the new job's ranks to agree where to sample from."""
        log.warning("trainer %s (rank %d) resumes from %s: the job restarted from a "
                    "checkpoint; waiting for its ranks, then sampling from there",
                    message.client_id, message.rank, describe(message.resume))
        over = Error(type=RANK_REFUSED, server_id=self.config.server_id, message=(
            f"the job restarted from a checkpoint ({describe(message.resume)}, announced by "
            f"rank {message.rank}): this trainer belongs to the previous run"))
        sends: list[Send] = [(identity, over) for identity in self.tables.restart()
                             if self.trainers.pop(identity, None) is not None]
        self.ranks, self.retention = self.tables.server, self.tables.retention
        self.messages_sent = self.departed = self.departed_received = 0
        self.finished, self.restarting = False, True
        self.phase = Phase.WAITING
        self.wait.reset()
        return sends

    def _not_whole(self, message: Hello) -> str | None:
        """Why ``message``, a rank of a ranked group restored from a checkpoint that starts
        its job's run, cannot resume on this server (its stream no longer gives the
        checkpoint's epoch whole), or None. A rank joining the run its checkpoint started
        is not asked again (its group reads the epoch already)."""
        resume = message.resume
        if (message.rank < 0 or check_announcement(resume) is not None or not resume
                or resume[3] != CHECKPOINT or not (self.tables.grouped or message.group)):
            return None
        tables = self.tables
        if refusal(tables.asks(message)) is not None:
            return None  # refused for the reason of the combination table
        if (tables.grouped and tables.of(message.group).ranked
                and not tables.restarts_group(message)):
            return None
        oldest = self.oldest_whole()
        return None if resume[0] >= oldest else not_whole(message.group or DEFAULT_GROUP,
                                                          resume, oldest)

    def _restart_group(self, identity: bytes, message: Hello) -> list[Send]:
        """A rank of a ranked group resumes from a checkpoint while its group runs: the
        group's job restarted. Its previous run's trainers are told it is over and forgotten
        with the group's ranks (the fan-out then joins the group anew at the checkpoint)."""
        name = message.group or DEFAULT_GROUP
        log.warning("trainer %s (rank %d of group %r) resumes from %s: the group's job "
                    "restarted from a checkpoint", message.client_id, message.rank, name,
                    describe(message.resume))
        over = Error(type=RANK_REFUSED, server_id=self.config.server_id, message=(
            f"the job of group {name!r} restarted from a checkpoint ({describe(message.resume)}, "
            f"announced by rank {message.rank}): this trainer belongs to the previous run"))
        previous = [other for other, trainer in list(self.trainers.items())
                    if trainer.group == name and other != identity]
        for other in previous:
            self.peer_gone(other, lost=False)
        self.tables.forget(name)
        return [(other, over) for other in previous]

    def _probe_welcome(self, message: Hello) -> Welcome:
        """The welcome a trainer that has not joined yet gets (``len()`` asks before the
        first sample): a rank's tells how the server would deal to its job."""
        welcome = self.welcome(message.group)
        if message.rank < 0 or self.tables.grouped or self.ranks.world_size is not None:
            return welcome
        return dataclasses.replace(welcome, world_size=message.world_size,
                                   uneven=self.config.uneven)


def trainer_codecs(core: ControlCore, target: bytes) -> frozenset[int]:
    """The codecs the trainer of data-socket identity ``target`` inflates (none when it
    is not known by a hello)."""
    for trainer in list(core.trainers.values()):
        if trainer.client_id.encode() == target:
            return trainer.codecs
    return frozenset()


def malformed_reply(error: ProtocolError, server_id: str) -> Error:
    """What a peer whose message did not decode is told: the error's kind, no detail.

    A peer of another version is told both versions (its own it sent; no detail
    of the decoder), so that an old trainer can say what to upgrade.
    """
    if isinstance(error, VersionMismatchError):
        return Error(type="feedmux.errors.VersionMismatchError", message=str(error)[:200],
                     server_id=server_id)
    return Error(type="feedmux.errors.ProtocolError", message="malformed control message",
                 server_id=server_id)
