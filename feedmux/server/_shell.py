"""The server's socket shell: binds, polls, receives, decodes, sends, and asks the core.

:class:`Endpoints` owns the server's two public sockets (data: PUSH, or a
ROUTER in reliable mode; control: ROUTER) and the clock. Every decision — who
is connected, what to answer, when the stream may end — belongs to
:class:`~feedmux.server._core.ControlCore`; this module feeds it events with
the time and sends what it returns, reporting back the sends that failed. It
must never keep trainer or drain state of its own.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Protocol

import zmq

from feedmux._security import ServerCurve
from feedmux._transport import (
    bound_address,
    make_socket,
    mapped_zmq_errors,
    readable,
    send_message,
)
from feedmux.errors import ProtocolError
from feedmux.protocol import Error, decode
from feedmux.server._core import ControlCore, Phase, Sends
from feedmux.server._producer import Frames
from feedmux.server._reliable import ReliableDispatch
from feedmux.server._shm_server import close_pool, open_pool, place_or_wait
from feedmux.server.config import ServerConfig

__all__ = ["Endpoints", "MAX_CONTROL_BYTES"]

log = logging.getLogger("feedmux.server")

#: Control messages larger than this are refused by ZeroMQ before reaching Python.
MAX_CONTROL_BYTES = 1 << 20


class StopFlag(Protocol):
    def __bool__(self) -> bool: ...


class Endpoints:
    """The server's two public sockets around its :class:`ControlCore`."""

    def __init__(self, config: ServerConfig, stopping: StopFlag) -> None:
        self.config = config
        self.stopping = stopping
        self.context: zmq.Context[Any] = zmq.Context()
        self.authenticator: Any = None
        try:
            self._open_sockets()
        except BaseException:
            self._stop_authenticator()
            self.context.destroy(linger=0)  # closes whichever socket was opened
            raise
        self.pool = open_pool(config)
        self.core = ControlCore(config, time.monotonic(), os.getpid(), self._extra_stats)
        if self.pool is not None:
            self.core.shm = (self.pool.path, self.pool.token)

    def _extra_stats(self) -> dict[str, int]:
        stats = self.reliable.ledger.stats() if self.reliable is not None else {}
        return {**stats, **(self.pool.stats() if self.pool is not None else {})}

    def _open_sockets(self) -> None:
        config = self.config
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

    # -- data -------------------------------------------------------------------------------
    def send_data(self, frames: Frames, n_samples: int, epoch: int) -> bool:
        """Send one data message, serving control meanwhile; False if the server is stopping."""
        if self.reliable is not None:
            sent = self.reliable.send(list(frames), n_samples, epoch, self._wait_reliable)
        else:
            if self.pool is not None and len(frames) > 2 and self.core.shm_ready():
                placed = place_or_wait(self.pool, frames, self.serve_control, self.stopping)
                if placed is None:
                    return False
                frames = placed
            sent = self._push(frames)
        if not sent:
            return False
        core = self.core
        core.data_sent(n_samples, epoch)
        if readable(self.control):
            self.serve_control(timeout=0)
        core.tick(time.monotonic())  # sampling: at most a throughput log line, never a send
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
        core = self.core
        while readable(self.control):
            try:
                parts = self.control.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            identity = parts[0].bytes
            try:
                message = decode(parts[1:])
            except ProtocolError as error:
                self.deliver(core.malformed(identity, error, time.monotonic()))
                continue
            self.deliver(core.receive(identity, message, time.monotonic()))
        return True

    def deliver(self, sends: Sends) -> None:
        """Send what the core asked for; tell it about every peer a send found gone."""
        for identity, message in sends:
            try:
                send_message(self.control, message, prefix=[identity], flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # also zmq.Again: its queue is full
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
        return not self.stopping

    def tick(self) -> None:
        """Time passed with nothing to send (the forwarding loop's idle turn)."""
        self.deliver(self.core.tick(time.monotonic()))

    def epoch_done(self, epoch: int, count: int) -> None:
        self.deliver(self.core.epoch_finished(epoch, count))

    def finish(self) -> None:
        """The end-of-stream handshake (see :meth:`ControlCore.finish`), then the last word."""
        core = self.core
        self.deliver(core.finish(time.monotonic()))
        if self.reliable is not None:
            self._finish_reliable(core.drain_deadline)
        else:
            self.run_phase(Phase.DRAINING)
            if core.phase is Phase.DRAINING:  # stopped meanwhile: still say it ended
                self.deliver(core.end_stream(time.monotonic()))
        self._repeat_last_word()

    def _finish_reliable(self, deadline: float) -> None:
        """Reliable mode: the stream ends once every message is acknowledged."""
        dispatch = self.reliable
        assert dispatch is not None
        ledger = dispatch.ledger
        while not self.stopping and time.monotonic() < deadline:
            dispatch.serve()
            dispatch.probe()
            dispatch.flush_resend()
            if not ledger.unacknowledged:
                break
            self._wait_reliable()
        else:
            log.warning("ending the stream with %d message(s) unacknowledged",
                        ledger.unacknowledged)
        dispatch.broadcast(self.core.end_message())
        log.info("%d data message(s) re-sent", ledger.resent_messages)
        self.deliver(self.core.end_stream(time.monotonic()))

    def fail(self, error: BaseException | Error) -> None:
        """Tell every trainer about ``error``, and whoever speaks in the next moments."""
        self.deliver(self.core.fail(error, time.monotonic()))
        self._repeat_last_word()

    def _repeat_last_word(self) -> None:
        self.run_phase(Phase.LAST_WORD)
        # Let the replies leave before the socket closes.
        self.control.linger = 1000

    def close(self) -> None:
        # After a finished stream, give what is still queued a moment to reach the trainers.
        self.data.close(linger=1000 if self.core.finished else 0)
        self.control.close()
        close_pool(self.pool)
        self._stop_authenticator()
        self.context.term()

    def _stop_authenticator(self) -> None:
        if self.authenticator is not None:
            self.authenticator.stop()
