"""The sampler server: runs a streamer in cycle mode and pushes its samples.

This module and :mod:`feedmux.server._worker` are the only server code that
touches sockets. The server binds a PUSH data endpoint (samples, batched and
tagged with their epoch and position) and a ROUTER control endpoint (hello /
welcome, heartbeats, stats, errors, the end-of-stream handshake). With
``workers > 1`` the sampling runs in forked worker processes, each on a shard
of the streamers, and this process forwards their messages, numbering the
positions of each epoch across all shards.

Delivery over PUSH is at-most-once: what is queued for a trainer that dies is
lost. A finite run (``epochs=N``) ends with a handshake: the server asks the
trainers how many data messages they received and sends ``EndOfStream`` once
every message it sent is accounted for (or nobody's count has moved for a
while), so a trainer never mistakes a pause for the end and never stops early.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any

import numpy as np
import zmq

from feedmux._security import ServerCurve
from feedmux._transport import (
    DEFAULT_BIND,
    DEFAULT_HWM,
    HEARTBEAT_INTERVAL,
    bound_address,
    control_address_for,
    keep_freed_memory,
    make_socket,
    mapped_zmq_errors,
    readable,
    send_message,
)
from feedmux.errors import (
    ConfigurationError,
    FactoryError,
    FeedmuxError,
    ProtocolError,
    SamplingError,
    TransportError,
)
from feedmux.protocol import (
    PROTOCOL_VERSION,
    Drain,
    EndOfEpoch,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Message,
    Stats,
    StatsRequest,
    Welcome,
    decode,
    read_tags,
    replace_tags,
)
from feedmux.sampling.epochs import EpochIterator
from feedmux.server._producer import BatchPolicy, Frames, error_message, produce
from feedmux.server._reliable import ReliableDispatch
from feedmux.server._worker import WorkerPool
from feedmux.server.factory import Source, resolve_source

__all__ = ["Server", "ServerConfig", "serve"]

log = logging.getLogger("feedmux.server")

#: Exit codes of ``feedmux serve``.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: A trainer not heard from for this long no longer counts as connected.
TRAINER_TIMEOUT = 3 * HEARTBEAT_INTERVAL
#: Seconds a finished or failed server keeps repeating its last word (``last_word``).
FINAL_GRACE = 1.0
#: Seconds between two Drain questions of the end-of-stream handshake.
DRAIN_INTERVAL = 0.1
#: Control messages larger than this are refused by ZeroMQ before reaching Python.
MAX_CONTROL_BYTES = 1 << 20
#: Seconds ``Server.start()`` waits for the background server to bind.
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class ServerConfig:
    """Everything a server needs, as plain data (it crosses into worker processes)."""

    source: Source
    factory_kwargs: Mapping[str, Any] = field(default_factory=dict)
    bind: str = DEFAULT_BIND
    control: str | None = None
    workers: int = 1
    epochs: int | None = None
    epoch_size: int | None = None
    hwm: int = DEFAULT_HWM
    samples_per_message: int | None = None
    max_delay: float = 0.005
    on_error: str = "raise"
    log_every: float = 10.0
    drain_timeout: float = 30.0
    drain_idle: float = 3.0
    min_trainers: int = 0
    reliable: bool = False
    curve_secret: str | None = None
    curve_clients: str | None = None
    server_id: str = ""

    def __post_init__(self) -> None:
        def require(ok: bool, what: str, value: object) -> None:
            if not ok:
                raise ConfigurationError(f"expected {what}, got {value!r}")

        require(self.workers >= 1, "workers >= 1", self.workers)
        require(self.epochs is None or self.epochs >= 1, "epochs None or >= 1", self.epochs)
        require(self.epoch_size is None or self.epoch_size >= 1, "epoch_size >= 1", self.epoch_size)
        require(self.hwm >= 1, "hwm >= 1", self.hwm)
        require(
            self.samples_per_message is None or self.samples_per_message >= 1,
            "samples_per_message None or >= 1",
            self.samples_per_message,
        )
        require(self.on_error in ("raise", "skip"), "on_error 'raise' or 'skip'", self.on_error)
        require(self.log_every > 0, "log_every > 0 seconds", self.log_every)
        require(self.max_delay >= 0, "max_delay >= 0 seconds", self.max_delay)
        require(self.min_trainers >= 0, "min_trainers >= 0", self.min_trainers)
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
    def policy(self) -> BatchPolicy:
        return BatchPolicy(self.samples_per_message, self.max_delay)


@dataclass
class _Trainer:
    client_id: str
    last_seen: float
    received_messages: int = 0


class _Endpoints:
    """The server's two public sockets and the bookkeeping of what went through them."""

    def __init__(self, config: ServerConfig, stopping: _StopFlag) -> None:
        self.config = config
        self.stopping = stopping
        self.context: zmq.Context[Any] = zmq.Context()
        self.authenticator: Any = None
        security = None
        if config.curve_secret is not None:
            security = ServerCurve(config.curve_secret, config.curve_clients)
            self.authenticator = security.start(self.context)
        self.reliable: ReliableDispatch | None = None
        if config.reliable:
            # Credit bounds each trainer's queue, so the socket's own limit only has to
            # stay out of the way; with queues that never fill, ZMTP heartbeats are safe.
            self.data = make_socket(self.context, zmq.ROUTER, hwm=100_000, security=security)
            self.data.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self.reliable = ReliableDispatch(self.data, config.server_id)
        else:
            self.data = make_socket(self.context, zmq.PUSH, hwm=config.hwm, heartbeats=False,
                                    security=security)
        self.control = make_socket(
            self.context, zmq.ROUTER, hwm=1000, max_message_bytes=MAX_CONTROL_BYTES,
            security=security,
        )
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)
        with mapped_zmq_errors("bind the data endpoint", config.bind):
            self.data.bind(config.bind)
        with mapped_zmq_errors("bind the control endpoint", config.control_address):
            self.control.bind(config.control_address)
        # What the system gave us: a real port where the configuration said 0.
        self.data_address = bound_address(self.data)
        self.control_address = bound_address(self.control)
        self.trainers: dict[bytes, _Trainer] = {}
        self.started = time.monotonic()
        self.samples_sent = 0
        self.messages_sent = 0
        self.epoch = 0
        self.epochs_completed = 0
        self.epoch_size: int | None = config.epoch_size
        self.finished = False
        self.final_message: Error | EndOfStream | None = None
        self.departed = 0
        self.departed_received = 0
        self._last_log = self.started
        self._samples_at_last_log = 0
        self._rate = 0.0

    # -- data -------------------------------------------------------------------------------
    def send_data(self, frames: Frames, n_samples: int, epoch: int) -> bool:
        """Send one data message, serving control meanwhile; False if the server is stopping."""
        if self.reliable is not None:
            sent = self.reliable.send(list(frames), n_samples, epoch, self._wait_reliable)
        else:
            sent = self._push(frames)
        if not sent:
            return False
        self.messages_sent += 1
        self.samples_sent += n_samples
        self.epoch = max(self.epoch, epoch)
        if readable(self.control):
            self.serve_control(timeout=0)
        self.maybe_log()
        return not self.stopping

    def _push(self, frames: Frames) -> bool:
        while True:
            try:
                self.data.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                # No trainer connected, or all their queues are full (HWM): wait, but keep
                # answering the control socket and noticing a stop request.
                if self.stopping:
                    return False
                self.serve_control(timeout=0.1, also_writable=True)

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
        while readable(self.control):
            try:
                parts = self.control.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            identity, frames = parts[0].bytes, parts[1:]
            try:
                message = decode(frames)
            except ProtocolError as error:
                log.warning("malformed control message from %r: %s", identity, error)
                self.reply(identity, error_message(error, self.config.server_id))
                continue
            self.handle(identity, message)
        return True

    def handle(self, identity: bytes, message: Message) -> None:
        now = time.monotonic()
        if self.final_message is not None and not isinstance(message, StatsRequest):
            self.reply(identity, self.final_message)
        elif isinstance(message, Hello):
            known = self.trainers.get(identity)
            if message.role == "trainer":
                self.trainers[identity] = _Trainer(message.client_id, now)
                if known is None:
                    log.info("trainer %s connected", message.client_id)
            self.reply(identity, self.welcome())
        elif isinstance(message, Heartbeat):
            trainer = self.trainers.get(identity)
            if trainer is None:
                trainer = self.trainers[identity] = _Trainer(message.sender_id, now)
            trainer.last_seen = now
            trainer.received_messages = message.received_messages
            self.reply(identity, self.welcome())
        elif isinstance(message, StatsRequest):
            self.reply(identity, Stats(self.stats()))
        else:
            log.warning("unexpected %s on the control socket from %r", type(message).__name__,
                        identity)
            self.reply(identity, Error(
                type="feedmux.errors.ProtocolError",
                message=f"expected Hello, Heartbeat or StatsRequest, got {type(message).__name__}",
                server_id=self.config.server_id,
            ))

    def reply(self, identity: bytes, message: Message) -> None:
        try:
            send_message(self.control, message, prefix=[identity], flags=zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError):
            # The peer went away (ROUTER_MANDATORY) or its queue is full: forget it, but
            # remember what it had received for the end-of-stream count.
            gone = self.trainers.pop(identity, None)
            if gone is not None:
                self.departed += 1
                self.departed_received += gone.received_messages

    def broadcast(self, message: Message) -> None:
        for identity in list(self.trainers):
            self.reply(identity, message)

    def welcome(self) -> Welcome:
        return Welcome(
            server_id=self.config.server_id,
            epoch_size=self.epoch_size,
            epoch=self.epoch,
            samples_per_message=self.config.samples_per_message or 0,
            finished=self.finished,
            workers=self.config.workers,
            reliable=self.config.reliable,
        )

    def connected_trainers(self) -> int:
        now = time.monotonic()
        return sum(1 for t in self.trainers.values() if now - t.last_seen <= TRAINER_TIMEOUT)

    def stats(self) -> dict[str, int | float | str | None]:
        uptime = time.monotonic() - self.started
        return {
            "server_id": self.config.server_id,
            "protocol_version": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "samples_sent": self.samples_sent,
            "messages_sent": self.messages_sent,
            "epoch": self.epoch,
            "epochs_completed": self.epochs_completed,
            "epoch_size": self.epoch_size,
            "samples_per_second": round(self._rate or self.samples_sent / max(uptime, 1e-9), 1),
            "connected_trainers": self.connected_trainers(),
            "workers": self.config.workers,
            "uptime_s": round(uptime, 3),
            "finished": int(self.finished),
            **(self.reliable.stats() if self.reliable is not None else {}),
        }

    # -- epochs and logging -------------------------------------------------------------------
    def epoch_done(self, epoch: int, count: int) -> None:
        self.epochs_completed = max(self.epochs_completed, epoch)
        if self.epoch_size != count:
            if self.epoch_size is not None:
                log.warning("epoch %d had %d samples, expected %s", epoch, count, self.epoch_size)
            self.epoch_size = count
            log.info("epoch size is %d samples", count)
        log.info("epoch %d complete: %d samples", epoch, count)
        # Trainers size their epochs from this: tell them now rather than at their next heartbeat.
        self.broadcast(self.welcome())

    def maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < self.config.log_every:
            return
        self._rate = (self.samples_sent - self._samples_at_last_log) / (now - self._last_log)
        self._last_log, self._samples_at_last_log = now, self.samples_sent
        log.info(
            "epoch %d: %d samples sent, %.0f samples/s, %d trainer(s) connected",
            self.epoch, self.samples_sent, self._rate, self.connected_trainers(),
        )

    def wait_for_trainers(self) -> bool:
        """Hold sampling until ``min_trainers`` trainers said hello; False if stopped meanwhile.

        PUSH hands messages to whoever is connected, so without this the first
        trainer of a short run could take the whole stream before the others join.
        """
        wanted = self.config.min_trainers
        if wanted and self.connected_trainers() < wanted:
            log.info("waiting for %d trainer(s) to connect", wanted)
        while not self.stopping:
            # A send to a trainer that has gone fails (ROUTER_MANDATORY) and forgets it,
            # so one that connected and left does not count.
            self.broadcast(self.welcome())
            if self.connected_trainers() >= wanted:
                break
            self.serve_control(timeout=0.1)
        return not self.stopping

    def finish(self) -> None:
        """The end-of-stream handshake.

        Done when the trainers' counts add up to every message sent. While some
        are missing, the server waits: they are in flight or queued at a live
        trainer. Only once a trainer has gone (its queue died with it) does a
        count that stays put for ``drain_idle`` seconds end the wait early;
        ``drain_timeout`` bounds it in every case (a trainer that stopped reading).
        """
        self.finished = True
        config = self.config
        deadline = time.monotonic() + config.drain_timeout
        if self.reliable is not None:
            self._finish_reliable(deadline)
            return
        last_total, last_change = -1, time.monotonic()
        next_drain = 0.0
        while not self.stopping:
            now = time.monotonic()
            if now >= next_drain:
                # Ask at a steady pace: answering each reply with a new question would
                # make a drained trainer and the server ping-pong without end.
                next_drain = now + DRAIN_INTERVAL
                self.broadcast(Drain(sent_messages=self.messages_sent,
                                     server_id=config.server_id))
            self.serve_control(timeout=max(0.0, next_drain - time.monotonic()))
            total = self.departed_received + sum(
                t.received_messages for t in self.trainers.values()
            )
            now = time.monotonic()
            if total >= self.messages_sent:
                break
            if total != last_total:
                last_total, last_change = total, now
            stalled = (self.departed or not self.trainers) and now - last_change > config.drain_idle
            if stalled or now > deadline:
                log.warning(
                    "ending the stream with %d of %d data messages unconfirmed (%s)",
                    self.messages_sent - total, self.messages_sent,
                    f"{self.departed} trainer(s) went away" if stalled
                    else "a trainer stopped reading",
                )
                break
        log.info("stream finished after %d epoch(s), %d samples", self.epochs_completed,
                 self.samples_sent)
        self.last_word(EndOfStream(config.server_id, self.epochs_completed, self.messages_sent))

    def _finish_reliable(self, deadline: float) -> None:
        """Reliable mode: the stream ends once every message is acknowledged."""
        dispatch = self.reliable
        assert dispatch is not None
        while not self.stopping and time.monotonic() < deadline:
            dispatch.serve()
            dispatch.probe()
            dispatch.flush_resend()
            if not dispatch.unacknowledged:
                break
            self._wait_reliable()
        else:
            log.warning("ending the stream with %d message(s) unacknowledged",
                        dispatch.unacknowledged)
        end = EndOfStream(self.config.server_id, self.epochs_completed, self.messages_sent)
        dispatch.broadcast(end)
        log.info("stream finished after %d epoch(s), %d samples, %d re-sent message(s)",
                 self.epochs_completed, self.samples_sent, dispatch.resent_messages)
        self.last_word(end)

    def fail(self, error: BaseException | Error) -> None:
        """Tell every trainer about ``error`` (see :meth:`last_word`)."""
        message = error if isinstance(error, Error) else error_message(error, self.config.server_id)
        self.last_word(message)

    def last_word(self, message: Error | EndOfStream) -> None:
        """Broadcast the server's final message, and repeat it to whoever speaks next.

        The server keeps answering its control socket with ``message`` until it
        has been quiet for ``FINAL_GRACE`` seconds (at most ``4 * FINAL_GRACE``),
        so that a trainer whose hello or heartbeat crossed the broadcast, or
        connected just before the end, still learns why the stream stopped;
        then it lingers so the replies leave before the socket closes.
        """
        self.final_message = message
        self.broadcast(message)
        started = last_heard = time.monotonic()
        while not self.stopping:
            now = time.monotonic()
            if now - last_heard > FINAL_GRACE or now - started > 4 * FINAL_GRACE:
                break
            if self.serve_control(timeout=0.1):
                last_heard = time.monotonic()
        self.control.linger = 1000

    def close(self) -> None:
        # After a finished stream, give what is still queued a moment to reach the trainers.
        self.data.close(linger=1000 if self.finished else 0)
        self.control.close()
        if self.authenticator is not None:
            self.authenticator.stop()
        self.context.term()


class _StopFlag:
    """Set by SIGTERM / SIGINT; checked by every loop of the server."""

    def __init__(self) -> None:
        self.stopped = False

    def __bool__(self) -> bool:
        return self.stopped

    def set(self, signum: int = 0, frame: FrameType | None = None) -> None:
        if signum:
            log.info("received %s, shutting down", signal.Signals(signum).name)
        self.stopped = True


class Server:
    """A sampler server: ``run()`` it here, or ``start()`` it in a background process.

    Parameters
    ----------
    source : str, streamer or callable
        ``"module:attr"``, a Streamer / mux, or a callable returning one.
    bind : str
        The data endpoint (PUSH). Default ``tcp://127.0.0.1:5555``: loopback only.
    control : str, optional
        The control endpoint (ROUTER); default: the data port + 1 (port 0 when
        the data port is 0). Once bound, :attr:`data_address` and
        :attr:`control_address` give the real endpoints.
    workers : int
        Sampling processes; the streamers are sharded across them.
    epochs : int, optional
        Stop after this many epochs (default: serve forever).
    epoch_size : int, optional
        Declare the epoch size up front (otherwise measured after one epoch).
    hwm : int
        Messages queued per trainer before sampling blocks (bounds memory).
    samples_per_message : int, optional
        Fixed transport batch; None sizes each message from its first sample.
    reliable : bool
        Credit-based delivery with acknowledgements: a trainer that dies loses
        nothing, its unacknowledged messages go to the others (trainers must
        use ``RemoteLoader(..., reliable=True)``).
    curve_secret : str, optional
        The server's secret certificate (``feedmux keygen``): CURVE encryption
        on the data and control sockets.
    curve_clients : str, optional
        A directory of the client certificates allowed to connect; without it,
        any client that knows the server's public key may.
    min_trainers : int
        Start sampling only once this many trainers have connected (default 0),
        so that a short run is split among all of them from its first sample.
    on_error : {"raise", "skip"}
        A streamer that raises ends the server (trainers get ``RemoteError``) or is skipped.
    factory_kwargs : mapping, optional
        Keyword arguments for a factory source.
    """

    def __init__(self, source: Source, **options: Any) -> None:
        self.config = ServerConfig(source=source, **options)
        self._process: multiprocessing.process.BaseProcess | None = None
        self._stop = _StopFlag()
        self._bound: tuple[str, str] | None = None
        # In a process started by start(): where to tell the parent what was bound.
        self._report: Connection | None = None

    @property
    def data_address(self) -> str:
        """The data endpoint as bound (a real port where ``bind`` said port 0)."""
        return self._addresses()[0]

    @property
    def control_address(self) -> str:
        """The control endpoint as bound (a real port where it said, or defaulted to, 0)."""
        return self._addresses()[1]

    def _addresses(self) -> tuple[str, str]:
        if self._bound is None:
            raise RuntimeError("this server has not bound its endpoints yet: start() or run() it")
        return self._bound

    def _tell_parent(self, *report: str) -> None:
        if self._report is not None:
            try:
                self._report.send(report)
            except OSError:  # the parent stopped waiting: nobody to tell
                pass
            self._report.close()
            self._report = None

    # -- running here -------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until done, failed or signalled; return the process exit code."""
        config = self.config
        try:
            streamer = resolve_source(config.source, config.factory_kwargs)
        except FactoryError as error:
            log.error("%s", error)
            self._tell_parent("failed", str(error))
            return EXIT_USAGE
        # Samplers allocate large arrays (and the forwarding process receives every
        # worker message) into fresh memory: let this process and its workers reuse
        # freed buffers instead of faulting in new pages for each sample.
        keep_freed_memory()
        previous = _install_signal_handlers(self._stop)
        try:
            if config.workers == 1:
                return self._run_local(streamer)
            return self._run_workers(streamer)
        finally:
            _restore_signal_handlers(previous)

    def _open(self) -> _Endpoints | None:
        try:
            endpoints = _Endpoints(self.config, self._stop)
        except (TransportError, ConfigurationError) as error:
            log.error("%s", error)
            self._tell_parent("failed", str(error))
            return None
        config = self.config
        self._bound = (endpoints.data_address, endpoints.control_address)
        source = config.source if isinstance(config.source, str) else type(config.source).__name__
        # A stable, documented line (docs/server.md): tests and scripts read the bound
        # endpoints from it when they asked for port 0.
        log.info(
            "serving %s: data %s, control %s, %d worker(s), epoch size %s, server id %s",
            source, endpoints.data_address, endpoints.control_address, config.workers,
            config.epoch_size or "measured after the first epoch", config.server_id,
        )
        self._tell_parent("bound", *self._bound)
        return endpoints

    def _run_local(self, streamer: Any) -> int:
        endpoints = self._open()
        if endpoints is None:
            return EXIT_USAGE
        config = self.config
        try:
            if not endpoints.wait_for_trainers():
                return EXIT_OK
            items = EpochIterator(streamer, max_epochs=config.epochs)

            def epoch_done(epoch: int, count: int) -> bool:
                endpoints.epoch_done(epoch, count)
                return not self._stop

            produce(
                items, endpoints.send_data, policy=config.policy, server_id=config.server_id,
                skip_errors=config.on_error == "skip", epoch_done=epoch_done,
            )
            if not self._stop:
                endpoints.finish()
            return EXIT_OK
        except Exception as error:
            log.error("sampling failed: %s: %s", type(error).__name__, error, exc_info=error)
            endpoints.fail(error)
            return EXIT_FAILED
        finally:
            endpoints.close()

    def _run_workers(self, streamer: Any) -> int:
        config = self.config
        with tempfile.TemporaryDirectory(prefix="feedmux-") as scratch:
            try:
                pool = WorkerPool(streamer, config, f"ipc://{scratch}/workers")
            except SamplingError as error:
                log.error("cannot shard the streamer over %d workers: %s", config.workers, error)
                return EXIT_USAGE
            pool.start()  # fork before this process creates its ZeroMQ context
            try:
                endpoints = self._open()
                if endpoints is None:
                    return EXIT_USAGE
                try:
                    return _forward(pool, endpoints, config, self._stop)
                finally:
                    endpoints.close()
            finally:
                pool.stop()

    # -- running in the background ------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT) -> Server:
        """Run the server in a background process (forked); return self once it has bound.

        Afterwards :attr:`data_address` and :attr:`control_address` give the
        bound endpoints. Raises :class:`TransportError` if the server could not
        bind or resolve its source, died, or had not bound within ``timeout`` s
        (the process is stopped then).
        """
        if self._process is not None:
            raise RuntimeError("this server was already started")
        context = multiprocessing.get_context("fork")
        reader, writer = context.Pipe(duplex=False)
        process = self._process = context.Process(
            target=_run_in_child, args=(self.config, writer), daemon=False,
            name=f"feedmux-server-{self.config.server_id}",
        )
        process.start()
        writer.close()
        try:
            report = _wait_for_report(reader, process, timeout)
        finally:
            reader.close()
        if report is not None and report[0] == "bound":
            self._bound = (report[1], report[2])
            return self
        if report is None:
            problem = (f"it did not bind within {timeout} s" if process.exitcode is None
                       else f"it exited with code {process.exitcode} before binding")
        else:
            problem = report[1]
        self.stop()
        raise TransportError(f"cannot start server {self.config.server_id}: {problem}")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode if self._process else None

    def join(self, timeout: float | None = None) -> int | None:
        """Wait for the background server to exit; return its exit code (None if still up)."""
        if self._process is None:
            raise RuntimeError("this server was not started")
        self._process.join(timeout)
        return self._process.exitcode

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the background server, wait up to ``timeout`` s, then SIGKILL it."""
        process = self._process
        if process is None or process.exitcode is not None:
            return self.exitcode
        process.terminate()
        process.join(timeout)
        if process.exitcode is None:
            log.warning("server pid %s ignored SIGTERM for %.1f s; killing it",
                        process.pid, timeout)
            process.kill()
            process.join(timeout)
        return process.exitcode

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(source: Source, **options: Any) -> int:
    """Run a sampler server in this process until it ends; return the exit code.

    Takes the same arguments as :class:`Server`.
    """
    return Server(source, **options).run()


def _run_in_child(config: ServerConfig, report: Connection) -> None:
    server = Server(config.source, **config.options())
    server._report = report
    raise SystemExit(server.run())


def _wait_for_report(reader: Connection, process: multiprocessing.process.BaseProcess,
                     timeout: float) -> tuple[str, ...] | None:
    """What a starting server process reported, or None if it died or stayed silent."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        # The sentinel too: forked workers may hold the pipe open after the server died.
        ready = wait([reader, process.sentinel], remaining)
        if reader in ready or reader.poll(0):
            try:
                report: tuple[str, ...] = reader.recv()
            except EOFError:
                return None
            return report
        if process.sentinel in ready:
            process.join(0)
            return None


def _install_signal_handlers(stop: _StopFlag) -> dict[int, Any]:
    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[signum] = signal.signal(signum, stop.set)
        except ValueError:  # not the main thread: the caller handles signals
            break
    return previous


def _restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _forward(pool: WorkerPool, endpoints: _Endpoints, config: ServerConfig, stop: _StopFlag) -> int:
    """Forward the workers' messages, numbering positions per epoch across shards."""
    inbound = make_socket(endpoints.context, zmq.PULL, hwm=config.hwm, heartbeats=False)
    with mapped_zmq_errors("bind the internal endpoint", pool.endpoint):
        inbound.bind(pool.endpoint)
    if not endpoints.wait_for_trainers():
        return EXIT_OK
    pool.release(1)
    positions: dict[int, int] = {}
    finished_shards: dict[int, set[int]] = {}
    poller = zmq.Poller()
    poller.register(inbound, zmq.POLLIN)
    poller.register(endpoints.control, zmq.POLLIN)
    try:
        while not stop:
            events = dict(poller.poll(100))
            if endpoints.control in events:
                endpoints.serve_control(timeout=0)
            failure = pool.failure()
            if failure:
                raise FeedmuxError(failure)
            if inbound not in events:
                endpoints.maybe_log()
                continue
            frames = inbound.recv_multipart(copy=False)
            if len(frames) > 1:  # data: header + tags frame + buffers
                tags = read_tags(frames).copy()
                for epoch in np.unique(tags[:, 0]):
                    rows = tags[:, 0] == epoch
                    start = positions.get(int(epoch), 0)
                    count = int(rows.sum())
                    tags[rows, 1] = np.arange(start, start + count)
                    positions[int(epoch)] = start + count
                if not endpoints.send_data(replace_tags(frames, tags), len(tags), int(tags[-1, 0])):
                    break
                continue
            message = decode(frames)
            if isinstance(message, Error):
                log.error("sampling worker failed: %s: %s", message.type, message.message)
                endpoints.fail(message)
                return EXIT_FAILED
            if isinstance(message, EndOfEpoch):
                done = finished_shards.setdefault(message.epoch, set())
                done.add(message.worker)
                if len(done) == config.workers:
                    endpoints.epoch_done(message.epoch, positions.get(message.epoch, 0))
                    if config.epochs is not None and message.epoch >= config.epochs:
                        endpoints.finish()
                        return EXIT_OK
                    pool.release(message.epoch + 1)
        return EXIT_OK
    except Exception as error:
        log.error("server failed: %s", error)
        endpoints.fail(error)
        return EXIT_FAILED
    finally:
        inbound.close(linger=0)

