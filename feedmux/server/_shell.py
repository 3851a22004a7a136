"""The server's socket shell: binds, polls, receives, decodes, sends, and asks the core.

:class:`SocketShell` owns the server's two public sockets (data and control,
both ROUTERs: each trainer connects a DEALER to each, its data DEALER named by
its client id) and the clock. Every decision — who
is connected, what to answer, when the stream may end — belongs to
:class:`~feedmux.server._control.core.ControlCore`; this module feeds it events with
the time and sends what it returns, reporting back the sends that failed. It
must never keep trainer or drain state of its own.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from feedmux._plumbing.curve import ServerCurve
from feedmux._plumbing.handshakes import HandshakeLogger
from feedmux._plumbing.shm import ShmPool
from feedmux._plumbing.sockets import (
    CONTROL_INBOUND_FRAME_BYTES,
    DATA_INBOUND_FRAME_BYTES,
    DATA_RCVHWM,
    UNLIMITED,
    bind,
    make_socket,
    readable,
    send_message,
)
from feedmux.errors import ProtocolError
from feedmux.protocol import CONTROL_LIMITS, Ack, Error, Heartbeat, decode, parse_compress
from feedmux.server._control.core import (
    ControlCore,
    Phase,
    Sends,
    Stat,
    trainer_codecs,
)
from feedmux.server._control.metrics import MetricsEndpoint
from feedmux.server._delivery.carrier import Carrier
from feedmux.server._delivery.compression import LinkCompression
from feedmux.server._delivery.dealer import Dealer, RankAudience
from feedmux.server._delivery.fanout import GroupFanout
from feedmux.server._delivery.outbox import Frames, Outbox
from feedmux.server._delivery.paths import NOT_OPEN, RankedJob, SendPath
from feedmux.server._delivery.pool import close_pool, open_pool
from feedmux.server._delivery.registry import shm_trainers
from feedmux.server._delivery.reliable import NO_ACK, ReliableFree, ReliableLink
from feedmux.server._sources.meters import ControlMeter, SamplerMeter, sampler_stats
from feedmux.server.config import ServerConfig

__all__ = ["SocketShell", "MAX_CONTROL_BYTES"]

log = logging.getLogger("feedmux.server")

#: Control frames larger than this are refused by ZeroMQ before reaching Python.
MAX_CONTROL_BYTES = CONTROL_INBOUND_FRAME_BYTES
#: Milliseconds a stopped server's data socket lingers (see :meth:`SocketShell.close`).
STOP_LINGER_MS = 200


class StopFlag(Protocol):
    def __bool__(self) -> bool: ...


class SocketShell:
    """The server's two public sockets around its :class:`ControlCore`."""

    def __init__(self, config: ServerConfig, stopping: StopFlag,
                 shm: Callable[[ServerConfig], ShmPool | None] = open_pool) -> None:
        self.config = config
        self.stopping = stopping
        #: The server thread's CPU on control messages (both sockets' control traffic).
        self.control_meter = ControlMeter()
        #: Set when the server gave up before sampling (the ranks did not all come).
        self.failed = False
        self.context: zmq.Context[Any] = zmq.Context()
        self.authenticator: Any = None
        self.handshakes: HandshakeLogger | None = None
        try:
            self._open_sockets()
        except BaseException:
            self._stop_authenticator()
            self.context.destroy(linger=0)  # closes whichever socket was opened
            raise
        #: The sampling processes' meters (the server's own, or its workers').
        self.meters = [SamplerMeter(count_field=config.count_field)]
        #: More figures for the statistics (the worker pool's liveness, the shm pool's use).
        self.extra_stats: list[Callable[[], dict[str, Stat]]] = []
        #: The statistics taken as the sockets closed (None while they are open).
        self.last_stats: dict[str, Stat] | None = None
        self.core = ControlCore(config, time.monotonic(), os.getpid(), self._extra_stats)
        if config.count_field:
            self.core.counted = lambda: sum(meter.counted for meter in self.meters)
        reliable = self.reliable  # the free trainers' credit and acknowledgements
        self.core.handout_ledgers = lambda: [*self.core.tables.ranked_ledgers(),
                                             *list(reliable.credits.ledgers.values())]
        self.core.granted = reliable.credits.granting  # dealt by credit: who has any
        #: The same-host shared-memory pool free trainers on this host read large arrays from.
        self.pool = shm(config)  # opened before the workers forked, if there are workers
        if self.pool is not None:
            self.core.shm = (self.pool.path, self.pool.token)
            self.extra_stats.append(lambda: dict(self.pool.stats()) if self.pool else {})
        # References to the pool on their way to one trainer (not yet received) at most:
        # what its socket queues would hold of messages sent whole (--hwm, both ends).
        self.compression = LinkCompression(
            parse_compress(config.compress),
            lambda target: target in shm_trainers(self.core) if self.pool is not None else False,
            inflates=lambda target: trainer_codecs(self.core, target))
        self.extra_stats.append(self.compression.stats)
        carrier = Carrier(self.pool, self.core, 2 * config.hwm, self.outbox, self._halted,
                          self.compression)
        # The free trainers' one recovery policy: credit, and a re-deal of a lost trainer's
        # rest within its audience (exactly once). Ranks: their messages need no sequence
        # number (the ranks' hand-out marks release them), so they go after the envelope of
        # one that needs none, within the credit their holder granted.
        self.dealer = Dealer(self.outbox, self.core, carrier, self._halted,
                             functools.partial(ReliableFree, reliable,
                                               sharers=self.core.sharers), [NO_ACK],
                             reliable.credits.takes, self.batch_refused)
        # What the free trainers' batch shapes hold is in no ledger: the summary of the
        # hand-outs lists it.
        reliable.summary.held = self.dealer.free_batches("").outstanding
        #: Where data messages go: chosen once, as sampling starts (:meth:`_open_path`).
        self.path: SendPath = NOT_OPEN
        self.metrics: MetricsEndpoint | None = None
        if config.metrics_port is not None:
            try:
                self.metrics = MetricsEndpoint(lambda: self.core.stats(time.monotonic()),
                                               config.metrics_port, config.metrics_host)
            except BaseException:
                self.close()
                raise

    def _open_path(self) -> SendPath:
        """The send path, once the first trainers are here (:mod:`~feedmux.server._delivery.paths`):
        a ranked job's own, or the consumer groups' (the free trainers are the group
        ``default``)."""
        core = self.core
        if core.ranks.ranked:
            ranks = RankAudience(core.rank_target, lambda: core.retention,
                                 lambda: list(core.ranks.holders), self.dealer.rank_sender)
            return RankedJob(self.dealer, ranks, core.data_sent, lambda: core.retention.held(),
                             self.outbox.count_bytes)
        # A run resumed from free trainers that outlived the previous server: what one
        # reports in a hello after sampling began is kept out as it is dealt.
        unreported = core.handed.fresh if core.handed.start is not None else None
        fanout = GroupFanout(self.config, self.dealer, core, lambda: bool(self.stopping),
                             self.deliver, unreported)
        # A ranked group resuming from a checkpoint needs its epoch whole from the buffer.
        core.oldest_whole = lambda: fanout.buffer.oldest_whole
        return fanout

    def _extra_stats(self) -> dict[str, Stat]:
        stats: dict[str, Stat] = dict(sampler_stats(self.meters, self.outbox.blocked_seconds))
        stats["bytes_sent"] = self.outbox.bytes_sent
        stats["stray_data_messages"] = self.outbox.stray_dropped
        stats.update(self.control_meter.stats())
        # Where it listens: a data endpoint given to `feedmux stats` is recognised by it.
        stats["data_address"], stats["control_address"] = self.data_address, self.control_address
        stats.update(self.path.stats())
        stats.update(self.reliable.credits.stats())
        stats.update(self.dealer.batch_stats())
        for figures in self.extra_stats:
            stats.update(figures())
        return stats

    def _open_sockets(self) -> None:
        config = self.config
        security = None
        if config.curve_secret is not None:
            security = ServerCurve(config.curve_secret, config.curve_clients)
            self.authenticator = security.start(self.context)
        self.data = _data_socket(self.context, config, security)
        self.control = make_socket(
            self.context, zmq.ROUTER, hwm=1000, max_message_bytes=CONTROL_INBOUND_FRAME_BYTES,
            security=security,
        )
        # Its receive queue is unbounded, as a trainer's sockets with pings are: a full one
        # stops libzmq reading the connection, and a ping that falls on such a connection
        # after its peer left aborts the process (libzmq 4.3.5, "Assertion failed:
        # !_io_error" in stream_engine_base.cpp, issue 4364, unfixed in its master; seen
        # once under load with 256 trainers). Its pings stay: a vanished trainer's
        # connection is closed by them within HALF_OPEN_TIMEOUT. What a trainer sends here
        # bounds the queue instead: a heartbeat a second, and an acknowledgement per message
        # it hands out, which stop with its data when the server stops sending (at most
        # CONTROL_INBOUND_FRAME_BYTES each).
        self.control.rcvhwm = UNLIMITED
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A trainer's control DEALER keeps its identity across reconnects (a link that went
        # down and up): the new connection takes it over from a pipe not yet seen dead.
        self.control.setsockopt(zmq.ROUTER_HANDOVER, 1)
        #: Everything sent on the data socket leaves through it.
        self.outbox = Outbox(self.data, self.control, self._serve_waiting)
        #: The free trainers' credit and acknowledgements, read from the data socket.
        self.reliable = ReliableLink(self.data, self.outbox, config.server_id,
                                     self._serve_waiting, self.control_meter.add)
        self.outbox.serve_data = self.reliable.serve
        # What the system gave us: a real port where the configuration said 0.
        self.data_address = bind(self.data, config.bind, "data")
        self.control_address = bind(self.control, config.control_address, "control")
        if security is not None:  # log the peers CURVE refuses (libzmq drops them silently)
            self.handshakes = HandshakeLogger(
                [self.data, self.control], [self.data_address, self.control_address]).start()

    # -- data -------------------------------------------------------------------------------
    def send_data(self, frames: Frames, n_samples: int, epoch: int, rank: int = -1) -> bool:
        """Send one data message (to ``rank``, or -1: the free trainers and every group)
        along the send path, serving control meanwhile; False if the server is stopping."""
        if not self.path.send(frames, n_samples, epoch, rank):
            return False
        if readable(self.control):
            self.serve_control(timeout=0)
        self._drop_stray()
        self.core.tick(time.monotonic())  # sampling: at most a throughput log line, never a send
        return not self._halted()

    def _drop_stray(self) -> None:
        """Read the data socket where the data path does not: the trainers' credit and
        acknowledgements (what is malformed there is dropped and counted)."""
        if readable(self.data):
            self.reliable.serve()

    def _ranks_owed(self) -> int:
        """Messages ranks were sent and have not handed out yet (the groups' ranks too),
        and the free trainers' batches not sent yet."""
        return self.path.ranks_owed() + self.dealer.batches_owed()

    def _halted(self) -> bool:
        """Whether sending stops: the server stops, or the job restarted from a checkpoint
        (a message of the previous run goes to nobody)."""
        return bool(self.stopping) or self.core.restarting

    # -- control ----------------------------------------------------------------------------
    def serve_control(self, timeout: float) -> bool:
        """Answer every control message that arrives within ``timeout`` seconds, and do
        the data side of what they said.

        Returns whether there was any.
        """
        if not self.answer_control(timeout):
            return False
        self.follow_control()
        return True

    def answer_control(self, timeout: float) -> bool:
        """Answer every control message that arrives within ``timeout`` seconds; nothing
        is sent on the data socket (:class:`~feedmux.server._standin.ControlStandIn`
        answers so from its thread while the server's draws samples).

        Returns whether there was any.
        """
        if not self.control.poll(int(timeout * 1000)):
            return False
        core = self.core
        cpu_started, received = time.thread_time(), 0
        while readable(self.control):
            try:
                parts = self.control.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            received += 1
            identity = parts[0].bytes
            try:
                message = decode(parts[1:], limits=CONTROL_LIMITS)
            except ProtocolError as error:
                self.deliver(core.malformed(identity, error, time.monotonic()))
                continue
            if isinstance(message, Ack) and message.rank < 0:
                self.reliable.marked(message)  # a free trainer's hand-out mark: no answer
                continue
            if isinstance(message, Heartbeat):
                self.reliable.reading(message.sender_id)  # its loader reads: summaries again
            self.deliver(core.receive(identity, message, time.monotonic()))
        self.control_meter.add(received, time.thread_time() - cpu_started)
        return True

    def follow_control(self) -> None:
        """The data side of the control messages answered: a rank's successor gets what
        its predecessor had not handed out."""
        self.path.replay_taken_over()

    def _serve_waiting(self) -> None:
        """While the data path waits for a trainer: answer control, and keep the rates,
        the trainers' liveness and the hand-outs looked at (nothing is sent meanwhile)."""
        self.serve_control(timeout=0)
        self.core.look(time.monotonic())

    def batch_refused(self, client_id: str, problem: str) -> None:
        """A batch could not be built: the error of the trainer it was for."""
        self.deliver(self.core.refuse_batch(client_id, problem))

    def deliver(self, sends: Sends) -> None:
        """Send what the core asked for; tell it about every peer a send found gone."""
        for identity, message in sends:
            try:
                send_message(self.control, message, prefix=[identity], flags=zmq.NOBLOCK)
            except zmq.Again:
                self.core.control_full(identity)
            except zmq.ZMQError:
                # No connection to the peer now (ROUTER_MANDATORY): gone, or a rank whose
                # control link is down a while (the core decides); a forgotten one's
                # received messages still count for the end of stream.
                self.core.unreachable(identity, time.monotonic())

    def run_phase(self, phase: Phase, meanwhile: Callable[[], None] | None = None) -> None:
        """Serve control, ticking the core, until it leaves ``phase`` or the server stops;
        ``meanwhile()`` after each turn (what a control message asked for, at once)."""
        core = self.core
        while core.phase is phase and not self.stopping:
            self.deliver(core.tick(time.monotonic()))
            if core.phase is not phase:
                return
            self.serve_control(timeout=core.wait_time(time.monotonic()))
            self._drop_stray()
            if meanwhile is not None:
                meanwhile()

    # -- the run's stages -------------------------------------------------------------------
    def wait_for_trainers(self, meanwhile: Callable[[], None] | None = None) -> bool:
        """Hold sampling until ``min_trainers`` trainers said hello (and, dealt by credit,
        granted some); False if stopped meanwhile. ``meanwhile()`` runs after each turn
        of the wait (the workers' count asked for over control).

        Free trainers are dealt whatever a connected one has room for, so without
        this the first trainer of a short run could take the whole stream before the
        others join.
        """
        self.deliver(self.core.begin())
        self.run_phase(Phase.WAITING, meanwhile)
        if self.core.phase is Phase.LAST_WORD:  # the ranks did not all come
            self.failed = True
            self._repeat_last_word()
            return False
        if self.path is NOT_OPEN:  # once: a job restarted from a checkpoint keeps it
            self.path = self._open_path()
        return not self.stopping

    def tick(self) -> None:
        """Time passed with nothing to send (the forwarding loop's idle turn)."""
        self._drop_stray()
        self.deliver(self.core.tick(time.monotonic()))

    def epoch_done(self, epoch: int, count: int) -> None:
        self.path.epoch_finished(epoch)
        self.deliver(self.core.epoch_finished(epoch, count))

    def finish(self) -> None:
        """The end-of-stream handshake (see :meth:`ControlCore.finish`), then the last word."""
        core = self.core
        self.path.flush(time.monotonic() + self.config.drain_timeout)
        self.path.finish_batches()  # every free trainer's last, partial batch
        self.deliver(core.finish(time.monotonic()))
        # Ranks' messages count too: a dead rank's go to its successor first.
        self.reliable.finish(core.drain_deadline, lambda: bool(self.stopping),
                             self.path.redeal, self._ranks_owed, core.end_message)
        self.reliable.broadcast(core.end_message())
        self.deliver(core.end_stream(time.monotonic()))
        self._repeat_last_word()

    def fail(self, error: BaseException | Error) -> None:
        """Tell every trainer about ``error``, and whoever speaks in the next moments; what
        the send path held for them is let go (its runs of the pool back)."""
        self.path.abandon()
        self.deliver(self.core.fail(error, time.monotonic()))
        self._repeat_last_word()

    def _repeat_last_word(self) -> None:
        self.run_phase(Phase.LAST_WORD)
        # Let the replies leave before the socket closes.
        self.control.linger = 1000

    def close(self) -> None:
        # The figures as the server stopped: whoever asks after its control socket has
        # closed (a fleet actor, the process that ran it) still gets them.
        self.last_stats = self.core.stats(time.monotonic())
        try:
            if self.metrics is not None:
                self.metrics.close()
            # After a finished stream, give what is still queued a moment to reach the
            # trainers. Never at once: data messages are multipart, and libzmq 4.3.5
            # aborts the process (session_base.cpp:233) when a connection part-way
            # through writing one fails while its socket closes with linger 0 (trainers
            # stopped with the server); lingering, a closing connection stays readable
            # until it has written its message or failed.
            self.data.close(linger=1000 if self.core.finished else STOP_LINGER_MS)
            self.control.close()
        finally:
            close_pool(self.pool)  # also when a second signal cuts the closing short
            self._stop_authenticator()
        # Not term(): it waits for every socket of the context, and a loop whose own
        # closing a second signal cut short (forward's sockets to the workers) leaves
        # one open, so term() would never return and the server, stuck there with its
        # workers, would ignore every later signal. The sockets closed above keep their
        # linger; any left open are closed at once.
        self.context.destroy(linger=0)

    def _stop_authenticator(self) -> None:
        if self.handshakes is not None:
            self.handshakes.stop()
        if self.authenticator is not None:
            self.authenticator.stop()


def _data_socket(context: zmq.Context[Any], config: ServerConfig,
                 security: ServerCurve | None) -> zmq.Socket[Any]:
    """The data ROUTER (consumer groups' fan-out sends on it too), with its limits."""
    # Credit bounds each trainer's queue, so the socket's own limit only has to stay out
    # of the way. No ZMTP heartbeats: a short outage is a pause, and a silent trainer is
    # found by its silence (reliable.SILENCE_GRACE). Half-open connections are bounded: a
    # trainer's libzmq reads whatever comes (no receive limit), so its window stays open
    # unless the whole process is frozen.
    data = make_socket(context, zmq.ROUTER, hwm=100_000, heartbeats=False,
                       security=security, max_message_bytes=DATA_INBOUND_FRAME_BYTES)
    data.setsockopt(zmq.ROUTER_MANDATORY, 1)
    data.rcvhwm = DATA_RCVHWM
    return data
