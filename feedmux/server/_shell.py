"""The server's socket shell: binds, polls, receives, decodes, sends, and asks the core.

:class:`Endpoints` owns the server's two public sockets (data and control,
both ROUTERs: each trainer connects a DEALER to each, its data DEALER named by
its client id) and the clock. Every decision — who
is connected, what to answer, when the stream may end — belongs to
:class:`~feedmux.server._control.core.ControlCore`; this module feeds it events with
the time and sends what it returns, reporting back the sends that failed. It
must never keep trainer or drain state of its own.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import zmq

from feedmux._plumbing.curve import ServerCurve
from feedmux._plumbing.handshakes import HandshakeLogger
from feedmux._plumbing.shm import Placement, ShmPool, carried_bytes
from feedmux._plumbing.sockets import (
    CONTROL_INBOUND_FRAME_BYTES,
    CONTROL_RCVHWM,
    DATA_INBOUND_FRAME_BYTES,
    DATA_RCVHWM,
    bind,
    make_socket,
    readable,
    send_message,
)
from feedmux.errors import ProtocolError
from feedmux.protocol import CONTROL_LIMITS, Ack, Error, decode, read_tags
from feedmux.server._control.core import ControlCore, Phase, Sends, Stat
from feedmux.server._control.meters import ControlMeter, SamplerMeter, sampler_stats
from feedmux.server._control.metrics import MetricsEndpoint
from feedmux.server._delivery.fanout import GroupFanout
from feedmux.server._delivery.pool import close_pool, open_pool, pooled, settled, through_pool
from feedmux.server._delivery.ranksend import RankSender
from feedmux.server._delivery.reliable import ReliableDispatch
from feedmux.server._sources.producer import Frames
from feedmux.server.config import ServerConfig

__all__ = ["Endpoints", "MAX_CONTROL_BYTES"]

log = logging.getLogger("feedmux.server")

#: Control frames larger than this are refused by ZeroMQ before reaching Python.
MAX_CONTROL_BYTES = CONTROL_INBOUND_FRAME_BYTES
#: Milliseconds a stopped server's data socket lingers (see :meth:`Endpoints.close`).
STOP_LINGER_MS = 200


class StopFlag(Protocol):
    def __bool__(self) -> bool: ...


class Endpoints:
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
        self.meters = [SamplerMeter()]
        #: Seconds the data path waited because no trainer could take a message.
        self.blocked_seconds = 0.0
        #: More figures for the statistics (the worker pool's liveness, the shm pool's use).
        self.probes: list[Callable[[], dict[str, Stat]]] = []
        #: Bytes of data messages handed to the data socket (or through the shm pool).
        self.bytes_sent = 0
        self.core = ControlCore(config, time.monotonic(), os.getpid(), self._extra_stats)
        #: The same-host shared-memory pool free trainers on this host read large arrays from.
        self.pool = shm(config)  # opened before the workers forked, if there are workers
        if self.pool is not None:
            self.core.shm = (self.pool.path, self.pool.token)
            self.probes.append(lambda: dict(self.pool.stats()) if self.pool else {})
        #: References to the pool on their way to one trainer (not yet received) at most:
        #: what its socket queues would hold of messages sent whole (--hwm, both ends).
        self.transit_cap = 2 * config.hwm
        #: Ranked delivery: each rank's messages to its holder, a successor's hand-over first.
        self.ranked = RankSender(self.data, self.core.retention, self._replayed)
        #: Consumer groups: every buffered message goes to each group (None: no groups).
        #: Opened with the server's groups: from the start (--group-buffer), or on the
        #: first trainer that asks for a group (the free trainers so far: group default).
        self.fanout: GroupFanout | None = self._fanout() if config.grouped else None
        self.metrics: MetricsEndpoint | None = None
        if config.metrics_port is not None:
            try:
                self.metrics = MetricsEndpoint(lambda: self.core.stats(time.monotonic()),
                                               config.metrics_port, config.metrics_host)
            except BaseException:
                self.close()
                raise

    def _fanout(self) -> GroupFanout:
        return GroupFanout(self.config, self.data, self.core,
                           lambda timeout: self.serve_control(timeout),
                           lambda: bool(self.stopping), self.deliver)

    def _extra_stats(self) -> dict[str, Stat]:
        blocked, sent_bytes = self.blocked_seconds, self.bytes_sent
        if self.fanout is not None:
            blocked += self.fanout.blocked_seconds
            sent_bytes += self.fanout.bytes_sent
        stats: dict[str, Stat] = dict(sampler_stats(self.meters, blocked))
        stats["bytes_sent"] = sent_bytes
        stats.update(self.control_meter.stats())
        # Where it listens: a data endpoint given to `feedmux stats` is recognised by it.
        stats["data_address"], stats["control_address"] = self.data_address, self.control_address
        if self.fanout is not None:
            stats.update(self.fanout.stats())
        if self.reliable is not None:
            stats.update(self.reliable.ledger.stats())
        for probe in self.probes:
            stats.update(probe())
        return stats

    def _open_sockets(self) -> None:
        config = self.config
        security = None
        if config.curve_secret is not None:
            security = ServerCurve(config.curve_secret, config.curve_clients)
            self.authenticator = security.start(self.context)
        self.data = _data_socket(self.context, config, security)
        self.reliable: ReliableDispatch | None = None
        if config.reliable:
            self.reliable = ReliableDispatch(self.data, config.server_id,
                                             lambda: self.serve_control(timeout=0),
                                             self.control_meter)
        self.control = make_socket(
            self.context, zmq.ROUTER, hwm=1000, max_message_bytes=CONTROL_INBOUND_FRAME_BYTES,
            security=security,
        )
        self.control.rcvhwm = CONTROL_RCVHWM
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # What the system gave us: a real port where the configuration said 0.
        self.data_address = bind(self.data, config.bind, "data")
        self.control_address = bind(self.control, config.control_address, "control")
        if security is not None:  # log the peers CURVE refuses (libzmq drops them silently)
            self.handshakes = HandshakeLogger(
                [self.data, self.control], [self.data_address, self.control_address]).start()

    # -- data -------------------------------------------------------------------------------
    def send_data(self, frames: Frames, n_samples: int, epoch: int, rank: int = -1) -> bool:
        """Send one data message (to ``rank``, or -1: any free trainer), serving control
        meanwhile; False if the server is stopping."""
        core = self.core
        sent = False
        if self.fanout is None:
            nbytes = carried_bytes(frames)
            if self.reliable is not None:
                sent = self.reliable.send(list(frames), n_samples, epoch,
                                         lambda: _wait_for_credit(self))
            else:
                placed = None
                if self.pool is not None:  # trainers on this host: the pool
                    frames, placed = pooled(self.pool, core, frames, self.serve_control,
                                            self.stopping)
                try:
                    sent = self._push(frames, rank, placed)
                finally:  # unless delivered (went by socket, or nowhere): its runs back
                    frames = settled(self.pool, placed, frames, sent)
            if sent:
                self.bytes_sent += nbytes
                core.data_sent(n_samples, epoch)
            elif self.fanout is None:
                return False
        # Groups, from the start or opened while this message waited (it goes to them then,
        # not to whichever trainer is free): the fan-out counts each delivery itself.
        if not sent and self.fanout is not None and not self.fanout.send(frames, n_samples,
                                                                         epoch):
            return False
        if readable(self.control):
            self.serve_control(timeout=0)
        core.tick(time.monotonic())  # sampling: at most a throughput log line, never a send
        return not (self.stopping or core.restarting)

    def _push(self, frames: Frames, rank: int, placed: Placement | None = None) -> bool:
        """Send to ``rank`` or a free trainer (those ``placed`` is for get the message as
        placed in the shared-memory pool, the others as it is)."""
        core = self.core
        message = [b"", *frames]
        in_pool = None if placed is None else [b"", *placed]
        waited = capped = False
        blocked_since = 0.0
        while not core.restarting:  # a message of the previous run goes to nobody
            if self.fanout is not None:
                return False  # the groups opened meanwhile: the message is theirs
            if rank >= 0:
                sent, capped = _send_ranked(self, rank, frames, placed)
            else:
                sent, capped = _send_free(self, message, in_pool, placed)
            if sent:
                if blocked_since:
                    self.blocked_seconds += time.perf_counter() - blocked_since
                return True
            # Nobody took it: wait (blocked time: no trainer, or this rank's, could take it),
            # but keep answering the control socket and noticing a stop request. A ROUTER is
            # writable when any trainer's queue has room, which may not be this rank's: after
            # the first try, wait on control alone, briefly; so too when a trainer on this host
            # had room in its queue but too many pool references in transit.
            if not blocked_since:
                blocked_since = time.perf_counter()
            if self.stopping:
                self.blocked_seconds += time.perf_counter() - blocked_since
                return False
            if (rank < 0 and not capped) or not waited:
                self.serve_control(timeout=0.1, also_writable=True)
            else:
                self.serve_control(timeout=0.001)
            waited = True
        return False  # the job restarted from a checkpoint

    def _replayed(self, frames: Sequence[Any]) -> None:
        self.bytes_sent += sum(len(frame) for frame in frames)
        tags = read_tags(frames)
        self.core.data_sent(len(tags), int(tags[0, 0]))

    def _wait_reliable(self) -> bool:
        """Wait up to 0.1 s for credit, acknowledgements or control; False when stopping."""
        poller = zmq.Poller()
        poller.register(self.data, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        events = dict(poller.poll(100))
        if self.control in events:
            self.serve_control(timeout=0)
        return not self.stopping

    # -- control ----------------------------------------------------------------------------
    def serve_control(self, timeout: float, also_writable: bool = False) -> bool:
        """Answer every control message that arrives within ``timeout`` seconds.

        Returns whether there was any.
        """
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        if also_writable:
            poller.register(self.data, zmq.POLLOUT)
        events = dict(poller.poll(int(timeout * 1000)))
        if self.control not in events:
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
                if self.reliable is not None:  # a free trainer's hand-out mark: no answer
                    self.reliable.ledger.handed(message)
                continue
            self.deliver(core.receive(identity, message, time.monotonic()))
        self.control_meter.add(received, time.thread_time() - cpu_started)
        if self.fanout is None and core.tables.grouped:
            self.fanout = self._fanout()
        if self.ranked.retention is not core.retention:
            # The job restarted from a checkpoint: its previous ranks are owed nothing.
            self.ranked = RankSender(self.data, core.retention, self._replayed)
        if core.ranks.ranked and self.reliable is None:
            self.ranked.replay_taken_over(list(core.ranks.holders), core.rank_target)
        if self.fanout is not None:
            self.fanout.replay_taken_over()
        return True

    def deliver(self, sends: Sends) -> None:
        """Send what the core asked for; tell it about every peer a send found gone."""
        for identity, message in sends:
            try:
                send_message(self.control, message, prefix=[identity], flags=zmq.NOBLOCK)
            except zmq.Again:
                if self.core.ranks.ranked:
                    continue  # a rank busy in a long step: its holder stays (its acks tell)
                self.core.peer_gone(identity)
            except zmq.ZMQError:
                # The peer went away (ROUTER_MANDATORY) or cannot keep up: the core forgets
                # it but keeps what it had received for the end-of-stream count.
                self.core.peer_gone(identity)

    def run_phase(self, phase: Phase) -> None:
        """Serve control, ticking the core, until it leaves ``phase`` or the server stops."""
        core = self.core
        while core.phase is phase and not self.stopping:
            self.deliver(core.tick(time.monotonic()))
            if core.phase is not phase:
                return
            self.serve_control(timeout=core.wait_time(time.monotonic()))

    # -- the run's stages -------------------------------------------------------------------
    def wait_for_trainers(self) -> bool:
        """Hold sampling until ``min_trainers`` trainers said hello; False if stopped meanwhile.

        PUSH hands messages to whoever is connected, so without this the first
        trainer of a short run could take the whole stream before the others join.
        """
        self.deliver(self.core.begin())
        self.run_phase(Phase.WAITING)
        if self.core.phase is Phase.LAST_WORD:  # the ranks did not all come
            self.failed = True
            self._repeat_last_word()
            return False
        return not self.stopping

    def tick(self) -> None:
        """Time passed with nothing to send (the forwarding loop's idle turn)."""
        self.deliver(self.core.tick(time.monotonic()))

    def epoch_done(self, epoch: int, count: int) -> None:
        if self.fanout is not None:
            self.fanout.epoch_finished(epoch)
        self.deliver(self.core.epoch_finished(epoch, count))

    def finish(self) -> None:
        """The end-of-stream handshake (see :meth:`ControlCore.finish`), then the last word."""
        core = self.core
        if self.fanout is not None:
            self.fanout.flush(time.monotonic() + self.config.drain_timeout)
        self.deliver(core.finish(time.monotonic()))
        if self.reliable is not None:
            _finish_reliable(self, core.drain_deadline)
        else:
            self.run_phase(Phase.DRAINING)
            if core.phase is Phase.DRAINING:  # stopped meanwhile: still say it ended
                self.deliver(core.end_stream(time.monotonic()))
        self._repeat_last_word()

    def fail(self, error: BaseException | Error) -> None:
        """Tell every trainer about ``error``, and whoever speaks in the next moments."""
        self.deliver(self.core.fail(error, time.monotonic()))
        self._repeat_last_word()

    def _repeat_last_word(self) -> None:
        self.run_phase(Phase.LAST_WORD)
        # Let the replies leave before the socket closes.
        self.control.linger = 1000

    def close(self) -> None:
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
        self.context.term()

    def _stop_authenticator(self) -> None:
        if self.handshakes is not None:
            self.handshakes.stop()
        if self.authenticator is not None:
            self.authenticator.stop()


def _send_ranked(endpoints: Endpoints, rank: int, frames: Frames,
                 placed: Placement | None) -> tuple[bool, bool]:
    """Send a rank's message to its holder, as placed in the pool or as it is (see
    :func:`through_pool`). Returns (sent, held back for the transit cap)."""
    target = endpoints.core.rank_target(rank)
    if target is None:
        return False, False
    via_pool = through_pool(endpoints.pool, placed, target, endpoints.transit_cap)
    if via_pool is None:
        return False, True
    if not endpoints.ranked.send(rank, target, frames, placed if via_pool else None):
        return False, False
    if via_pool and endpoints.pool is not None and placed is not None:
        endpoints.pool.delivered(target, placed)  # its runs are the trainer's to release
    return True, False


def _send_free(endpoints: Endpoints, message: list[Any], in_pool: list[Any] | None,
               placed: Placement | None) -> tuple[bool, bool]:
    """Offer a message to each free trainer in turn, as placed in the pool or as it is
    (see :func:`through_pool`). Returns (sent, a trainer was skipped for the cap)."""
    capped = False
    for identity in endpoints.core.free_targets():
        via_pool = through_pool(endpoints.pool, placed, identity, endpoints.transit_cap)
        if via_pool is None:
            capped = True
            continue
        parts = in_pool if via_pool and in_pool is not None else message
        parts[0] = identity
        try:
            endpoints.data.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            # Again: its queue is full (HWM); EHOSTUNREACH: its data connection is not up
            # yet, or gone (the control heartbeats decide that). Next.
            continue
        if via_pool and endpoints.pool is not None and placed is not None:
            endpoints.pool.delivered(identity, placed)  # its runs are the trainer's to release
        endpoints.core.questions.sent_to(identity)  # its own end of stream comes from this
        return True, capped
    return False, capped


def _wait_for_credit(endpoints: Endpoints) -> bool:
    """Reliable mode's send path waits for credit: that time counts as blocked."""
    started = time.perf_counter()
    try:
        return endpoints._wait_reliable()
    finally:
        endpoints.blocked_seconds += time.perf_counter() - started


def _finish_reliable(endpoints: Endpoints, deadline: float) -> None:
    """Reliable mode: the stream ends once every message is acknowledged."""
    dispatch = endpoints.reliable
    assert dispatch is not None
    ledger = dispatch.ledger
    while not endpoints.stopping and time.monotonic() < deadline:
        dispatch.serve()
        dispatch.probe()
        dispatch.flush_resend()
        if not ledger.unacknowledged:
            break
        endpoints._wait_reliable()
    else:
        log.warning("ending the stream with %d message(s) unacknowledged",
                    ledger.unacknowledged)
    dispatch.broadcast(endpoints.core.end_message())
    log.info("%d data message(s) re-sent", ledger.resent_messages)
    endpoints.deliver(endpoints.core.end_stream(time.monotonic()))


def _data_socket(context: zmq.Context[Any], config: ServerConfig,
                 security: ServerCurve | None) -> zmq.Socket[Any]:
    """The data ROUTER (consumer groups' fan-out sends on it too), with its limits."""
    if config.reliable:
        # Credit bounds each trainer's queue, so the socket's own limit only has to
        # stay out of the way; with queues that never fill, ZMTP heartbeats are safe.
        data = make_socket(context, zmq.ROUTER, hwm=100_000, security=security,
                           max_message_bytes=DATA_INBOUND_FRAME_BYTES)
    else:
        # A ROUTER, so that the core can address a message: to a rank, or to the next
        # free trainer whose queue has room (an addressed send fails instead of blocking).
        # Trainers send nothing here: what a peer sends waits unread, bounded below.
        data = make_socket(context, zmq.ROUTER, hwm=config.hwm, heartbeats=False,
                           security=security, max_message_bytes=DATA_INBOUND_FRAME_BYTES)
    data.setsockopt(zmq.ROUTER_MANDATORY, 1)
    data.rcvhwm = DATA_RCVHWM
    return data
