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
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from feedmux._transport import HEARTBEAT_INTERVAL
from feedmux.errors import ProtocolError
from feedmux.protocol import (
    PROTOCOL_VERSION,
    Drain,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Message,
    ShmAttach,
    ShmOffer,
    Stats,
    StatsRequest,
    Welcome,
)
from feedmux.server._producer import error_message
from feedmux.server.config import ServerConfig

__all__ = [
    "DRAIN_INTERVAL",
    "FINAL_GRACE",
    "NO_SENDS",
    "TRAINER_TIMEOUT",
    "ControlCore",
    "Phase",
    "Send",
    "Sends",
]

log = logging.getLogger("feedmux.server")

#: A trainer not heard from for this long no longer counts as connected.
TRAINER_TIMEOUT = 3 * HEARTBEAT_INTERVAL
#: Seconds a finished or failed server keeps repeating its last word while nobody speaks.
FINAL_GRACE = 1.0
#: Seconds between two Drain questions of the end-of-stream handshake.
DRAIN_INTERVAL = 0.1
#: How often the shell looks again while waiting for trainers or repeating the last word.
POLL_INTERVAL = 0.1

Send = tuple[bytes, Message]
Sends = Sequence[Send]
#: The answer of an event that sends nothing (shared: the data path allocates nothing).
NO_SENDS: Sends = ()

Stat = int | float | str | None


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
    shm: bool = False


class ControlCore:
    """Trainer registry, handshake, liveness, drain and statistics of one server.

    ``started`` is the time the server started; ``pid`` is reported in the
    statistics; ``extra_stats`` adds the reliable dispatch's figures to them.
    """

    def __init__(self, config: ServerConfig, started: float, pid: int = 0,
                 extra_stats: Callable[[], dict[str, int]] | None = None) -> None:
        self.config = config
        self.pid = pid
        self.extra_stats = extra_stats
        self.trainers: dict[bytes, _Trainer] = {}
        self.phase = Phase.SAMPLING
        self.started = started
        self.samples_sent = 0
        self.messages_sent = 0
        self.epoch = 0
        self.epochs_completed = 0
        self.epoch_size: int | None = config.epoch_size
        self.finished = False
        self.final_message: Error | EndOfStream | None = None
        self.departed = 0
        self.departed_received = 0
        self._last_log = started
        self._samples_at_last_log = 0
        self._rate = 0.0
        self._welcomed = False
        self.drain_deadline = 0.0
        self._next_drain = 0.0
        self._last_total = -1
        self._last_change = 0.0
        self._final_started = self._last_heard = 0.0
        #: (path, token) of the shared-memory pool offered to trainers, if there is one.
        self.shm: tuple[str, str] | None = None

    # -- events: the trainers ---------------------------------------------------------------
    def receive(self, identity: bytes, message: Message, now: float) -> Sends:
        """A decoded control message from ``identity``."""
        self._last_heard = now
        if self.final_message is not None and not isinstance(message, StatsRequest):
            return [(identity, self.final_message)]
        if isinstance(message, Hello):
            if message.role == "trainer":
                known = identity in self.trainers
                self.trainers[identity] = _Trainer(message.client_id, now)
                if not known:
                    log.info("trainer %s connected", message.client_id)
            if self.shm is not None:
                return [(identity, self.welcome()),
                        (identity, ShmOffer(self.shm[0], self.config.server_id))]
            return [(identity, self.welcome())]
        if isinstance(message, ShmAttach):
            trainer = self.trainers.get(identity)
            if trainer is not None and self.shm is not None and message.token == self.shm[1]:
                trainer.shm = True
                log.info("trainer %s shares this host: large arrays go through shared memory",
                         trainer.client_id)
            return NO_SENDS
        if isinstance(message, Heartbeat):
            trainer = self.trainers.get(identity)
            if trainer is None:
                trainer = self.trainers[identity] = _Trainer(message.sender_id, now)
            trainer.last_seen = now
            trainer.received_messages = message.received_messages
            return [(identity, self.welcome())]
        if isinstance(message, StatsRequest):
            return [(identity, Stats(self.stats(now)))]
        log.warning("unexpected %s on the control socket from %r", type(message).__name__,
                    identity)
        return [(identity, Error(
            type="feedmux.errors.ProtocolError",
            message=f"expected Hello, Heartbeat or StatsRequest, got {type(message).__name__}",
            server_id=self.config.server_id,
        ))]

    def malformed(self, identity: bytes, error: ProtocolError, now: float) -> Sends:
        """A control message from ``identity`` that did not decode."""
        self._last_heard = now
        log.warning("malformed control message from %r: %s", identity, error)
        return [(identity, error_message(error, self.config.server_id))]

    def peer_gone(self, identity: bytes) -> None:
        """A send to ``identity`` failed: forget it, keep what it had received for the count."""
        gone = self.trainers.pop(identity, None)
        if gone is not None:
            self.departed += 1
            self.departed_received += gone.received_messages

    # -- events: the sampler ----------------------------------------------------------------
    def begin(self) -> Sends:
        """The sockets are bound: hold sampling until ``min_trainers`` said hello."""
        if self.config.min_trainers:
            self.phase = Phase.WAITING
            log.info("waiting for %d trainer(s) to connect", self.config.min_trainers)
        return NO_SENDS

    def data_sent(self, n_samples: int, epoch: int) -> None:
        """One data message left (the hot path: counters only)."""
        self.messages_sent += 1
        self.samples_sent += n_samples
        if epoch > self.epoch:
            self.epoch = epoch

    def epoch_finished(self, epoch: int, count: int) -> Sends:
        """Every sample of ``epoch`` (``count`` of them) has been sent."""
        self.epochs_completed = max(self.epochs_completed, epoch)
        if self.epoch_size != count:
            if self.epoch_size is not None:
                log.warning("epoch %d had %d samples, expected %s", epoch, count, self.epoch_size)
            self.epoch_size = count
            log.info("epoch size is %d samples", count)
        log.info("epoch %d complete: %d samples", epoch, count)
        # Trainers size their epochs from this: tell them now rather than at their next heartbeat.
        return self.broadcast(self.welcome())

    def finish(self, now: float) -> Sends:
        """The last data message has left: start the end-of-stream handshake.

        It is done when the trainers' counts add up to every message sent.
        While some are missing, the server waits: they are in flight or queued
        at a live trainer. Only once a trainer has gone (its queue died with
        it) does a count that stays put for ``drain_idle`` seconds end the wait
        early; ``drain_timeout`` bounds it in every case (a trainer that
        stopped reading). Reliable mode ends on acknowledgements instead; the
        shell calls :meth:`end_stream` then.
        """
        self.finished = True
        self.phase = Phase.DRAINING
        self.drain_deadline = now + self.config.drain_timeout
        self._last_total, self._last_change, self._next_drain = -1, now, now
        return NO_SENDS

    def end_stream(self, now: float, reason: str = "") -> Sends:
        """Broadcast ``EndOfStream`` (``reason``: why some messages went unconfirmed)."""
        if reason:
            log.warning("ending the stream with %d of %d data messages unconfirmed (%s)",
                        self.messages_sent - self.received_total(), self.messages_sent, reason)
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
            if now - self._last_log >= self.config.log_every:
                self._log_throughput(now)
            return NO_SENDS
        if phase is Phase.WAITING:
            # Count only after a welcome went out since the last look: a send to a trainer
            # that has gone fails (ROUTER_MANDATORY) and forgets it, so one that connected
            # and left does not count.
            if self._welcomed and self.connected_trainers(now) >= self.config.min_trainers:
                self.phase = Phase.SAMPLING
                return NO_SENDS
            self._welcomed = True
            return self.broadcast(self.welcome())
        if phase is Phase.DRAINING:
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
        if total != self._last_total:
            self._last_total, self._last_change = total, now
        stalled = ((self.departed or not self.trainers)
                   and now - self._last_change > self.config.drain_idle)
        if stalled or now > self.drain_deadline:
            return self.end_stream(now, f"{self.departed} trainer(s) went away" if stalled
                                   else "a trainer stopped reading")
        if now < self._next_drain:
            return NO_SENDS
        # Ask at a steady pace: answering each reply with a new question would make a
        # drained trainer and the server ping-pong without end.
        self._next_drain = now + DRAIN_INTERVAL
        return self.broadcast(Drain(sent_messages=self.messages_sent,
                                    server_id=self.config.server_id))

    def _log_throughput(self, now: float) -> None:
        self._rate = (self.samples_sent - self._samples_at_last_log) / (now - self._last_log)
        self._last_log, self._samples_at_last_log = now, self.samples_sent
        log.info(
            "epoch %d: %d samples sent, %.0f samples/s, %d trainer(s) connected",
            self.epoch, self.samples_sent, self._rate, self.connected_trainers(now),
        )

    # -- state ------------------------------------------------------------------------------
    def broadcast(self, message: Message) -> Sends:
        return [(identity, message) for identity in self.trainers]

    def welcome(self) -> Welcome:
        config = self.config
        return Welcome(
            server_id=config.server_id,
            epoch_size=self.epoch_size,
            epoch=self.epoch,
            samples_per_message=config.samples_per_message or 0,
            finished=self.finished,
            workers=config.workers,
            reliable=config.reliable,
        )

    def shm_ready(self) -> bool:
        """Whether every known trainer mapped the pool (PUSH may deal to any of them)."""
        return self.shm is not None and bool(self.trainers) and all(
            trainer.shm for trainer in self.trainers.values())

    def received_total(self) -> int:
        """Data messages the trainers, present and departed, said they received."""
        return self.departed_received + sum(t.received_messages for t in self.trainers.values())

    def connected_trainers(self, now: float) -> int:
        return sum(1 for t in self.trainers.values() if now - t.last_seen <= TRAINER_TIMEOUT)

    def stats(self, now: float) -> dict[str, Stat]:
        uptime = now - self.started
        return {
            "server_id": self.config.server_id,
            "protocol_version": PROTOCOL_VERSION,
            "pid": self.pid,
            "samples_sent": self.samples_sent,
            "messages_sent": self.messages_sent,
            "epoch": self.epoch,
            "epochs_completed": self.epochs_completed,
            "epoch_size": self.epoch_size,
            "samples_per_second": round(self._rate or self.samples_sent / max(uptime, 1e-9), 1),
            "connected_trainers": self.connected_trainers(now),
            "workers": self.config.workers,
            "uptime_s": round(uptime, 3),
            "finished": int(self.finished),
            **(self.extra_stats() if self.extra_stats is not None else {}),
        }
