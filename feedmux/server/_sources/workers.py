"""Sampling worker processes: each runs one shard of the streamer.

A worker pushes encoded data messages to the server process over an internal
endpoint of its own (the server merges them, :mod:`feedmux.server._sources.merge`;
in a seeded run the worker cuts them at the fixed merge order's turns), and,
after each epoch of its shard, an ``EndOfEpoch`` marker; it then waits until
the server has heard the end of that epoch from every worker, so epochs
leave the server one after the other (no shard runs ahead). At the start of
each epoch a worker reseeds its random state from (seed, its index, epoch)
(a fork copies the parent's: without that every worker would draw the same
numbers) and publishes its :func:`feedmux.worker_info`. Workers are forked before the
server creates its ZeroMQ context, create their own, and die with their
parent (``PR_SET_PDEATHSIG`` where the kernel offers it, and a parent-pid
check everywhere they wait), so no exit path leaves one behind; a stopping pool
kills a worker that has not stopped in time (or at once on a second signal), and
a worker's second SIGTERM ends it wherever its streamer is stuck.

With the shared-memory pool, the pool is opened before the fork and each worker
allocates in a region of it (:mod:`feedmux._plumbing.shmruns`): its owned copies
and ``shared_empty`` arrays are written there, and its messages carry 56-byte
references instead of the arrays. When a worker dies, the server stops the others
and takes back their runs that no trainer holds (:meth:`WorkerPool.reclaim`).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import time
from typing import Any

import zmq

from feedmux._plumbing.shm import ShmPool
from feedmux._plumbing.sockets import make_socket
from feedmux.protocol import EndOfEpoch, encode
from feedmux.sampling.epochs import EpochIterator, shard
from feedmux.sampling.mux import restart_passes
from feedmux.server._control.meters import SamplerMeter, SharedMeters
from feedmux.server._sources.producer import Frames, error_message, produce
from feedmux.server._sources.seeding import EpochSeeder
from feedmux.server.config import ServerConfig

__all__ = ["WorkerPool"]

log = logging.getLogger("feedmux.server")

#: How long a stopping pool waits for its workers before it kills them.
WORKER_STOP_TIMEOUT = 2.0


class WorkerPool:
    """N forked sampling processes, their epoch gate and their failure reports."""

    def __init__(self, streamer: Any, config: ServerConfig, endpoint: str,
                 align: int | None = None, shm: ShmPool | None = None) -> None:
        if config.seed is None:
            raise ValueError("expected the run's seed resolved before the workers start, got None")
        self.config = config
        self.endpoint = endpoint
        self.align = align  # cut messages at the fixed merge order's turns (seeded runs)
        # Shard in this process first, so a streamer that cannot be split fails here, clearly.
        self.shards = [shard(streamer, index, config.workers) for index in range(config.workers)]
        self._mp = multiprocessing.get_context("fork")
        self._released = self._mp.RawValue("q", 0)
        self._first = self._mp.RawValue("q", 1)  # the first epoch to sample (a resumed run)
        self._generation = self._mp.RawValue("q", 0)  # the run: a job resumed mid-run adds one
        self._stop = self._mp.Event()
        #: Each worker's sampling time and skipped streams, readable from this process.
        self.meters = SharedMeters(config.workers).meters
        self.processes: list[multiprocessing.process.BaseProcess] = []
        #: The shared-memory pool, opened before the fork: each worker gets a region of it.
        self.shm = shm
        if shm is not None:
            shm.split(config.workers)

    def start(self) -> None:
        for index, part in enumerate(self.shards):
            process = self._mp.Process(
                target=_worker_main,
                args=(part, self.config, index, self.endpoint_of(index), self.align,
                      (self._released, self._first, self._generation), self._stop, os.getpid(),
                      self.meters[index], self.shm),
                name=f"feedmux-worker-{index}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)
        log.info("started %d sampling worker(s): pids %s", len(self.processes),
                 ", ".join(str(p.pid) for p in self.processes))

    def endpoint_of(self, index: int) -> str:
        """The internal endpoint worker ``index`` pushes to (one each: merged in a fixed order)."""
        return f"{self.endpoint}-{index}"

    def release(self, epoch: int) -> None:
        """Let the workers start ``epoch``."""
        self._released.value = epoch

    def begin(self, epoch: int, generation: int = 0) -> None:
        """Let the workers start run ``generation`` at ``epoch`` (> 1: a resumed run; each
        worker samples the epochs of its shard before again, and discards them)."""
        self._first.value = epoch
        self.release(epoch)

    def rewind(self, generation: int) -> None:
        """A new run begins (a ranked job resumed from a checkpoint): every worker stops
        the run it samples, sends a marker (:meth:`is_marker`) and waits for :meth:`begin`."""
        self._released.value = 0
        self._generation.value = generation

    def is_marker(self, message: EndOfEpoch) -> bool:
        """Whether ``message`` is a worker's marker of the current run's start: what it
        sent before belongs to an earlier run."""
        return message.epoch == 0 and message.count == self._generation.value

    def liveness(self) -> dict[str, int | float | str | None]:
        """``worker.<index>.alive``: 1 while that worker process runs, else 0."""
        return {f"worker.{index}.alive": int(process.exitcode is None)
                for index, process in enumerate(self.processes)}

    def dead(self) -> list[int]:
        """The indices of the workers that are not running."""
        return [index for index, process in enumerate(self.processes)
                if process.exitcode is not None]

    def reclaim(self) -> None:
        """Stop every worker and take back the runs of the pool they had not handed to a
        trainer (the server fails, or a worker died): only the trainers' views stay."""
        self.stop()
        if self.shm is not None:
            for index in range(len(self.processes)):
                self.shm.adopt(index)

    def failure(self) -> str:
        """A description of the first worker that exited on its own, or ''."""
        if self._stop.is_set():
            return ""
        for index, process in enumerate(self.processes):
            if process.exitcode is not None:
                return (f"sampling worker {index} (pid {process.pid}) exited unexpectedly "
                        f"with code {process.exitcode}")
        return ""

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> None:
        """Stop every worker: ask, wait up to ``timeout`` s, then kill; never leaves one running.

        The kill also happens when the wait is cut short (a second SIGINT / SIGTERM
        raises in the server's main thread): a worker stuck in user code never
        looks at the request, and nothing else would stop it.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout
        try:
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
        finally:
            self._kill()

    def _kill(self) -> None:
        running = [process for process in self.processes if process.exitcode is None]
        # Every kill goes out, whatever signal arrives meanwhile; only then the waits.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for process in running:
                process.kill()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for process in running:
            log.warning("worker pid %s did not stop in time; killed it", process.pid)
            process.join(WORKER_STOP_TIMEOUT)


def _die_with_parent() -> None:
    # SIGKILL, not SIGTERM: a worker stuck in user code never returns to look at a
    # request, and with its server gone nothing it holds can reach anyone.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent-pid checks still apply
        pass


def _on_sigterm(terminated: list[bool]) -> Any:
    """The worker's SIGTERM handler: the first asks it to stop (it finishes what it
    sends), a second ends the process at once, wherever its streamer is stuck."""

    def handle(signum: int, frame: Any) -> None:
        if terminated:
            os._exit(128 + signum)
        terminated.append(True)

    return handle


def _worker_main(
    streamer: Any,
    config: ServerConfig,
    index: int,
    endpoint: str,
    align: int | None,
    gate: tuple[Any, Any, Any],
    stop_event: Any,
    parent_pid: int,
    meter: SamplerMeter,
    shm: ShmPool | None,
) -> None:
    _die_with_parent()

    released, first, generation = gate
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us
    terminated: list[bool] = []
    signal.signal(signal.SIGTERM, _on_sigterm(terminated))

    def stopping() -> bool:
        return bool(terminated) or stop_event.is_set() or os.getppid() != parent_pid

    if shm is not None:  # mapped by the fork: this worker allocates in its own region
        shm.enter_worker(index, stopping)
    context: zmq.Context[Any] = zmq.Context()
    push = make_socket(context, zmq.PUSH, hwm=config.hwm, heartbeats=False)
    push.connect(endpoint)

    run = [0]  # the generation this worker samples for

    def rewound() -> bool:
        return bool(generation.value != run[0])

    def send(frames: Frames, n_samples: int = 0, epoch: int = 0) -> bool:
        # Large arrays go as references to this worker's runs of the pool, if it can.
        placed = None if shm is None else shm.forward(frames)
        wire = frames if placed is None else placed.frames
        sent = False
        try:
            while not (sent or rewound()):
                try:
                    push.send_multipart(wire, flags=zmq.NOBLOCK, copy=False)
                    sent = True
                except zmq.Again:
                    if stopping():
                        break
                    push.poll(100, zmq.POLLOUT)
        finally:
            if placed is not None and shm is not None:
                if sent:
                    placed.delivered()  # the server's to send on or free
                else:
                    shm.cancel(placed)
        return sent

    def wait_for_release(epoch: int) -> bool:
        while released.value < epoch or rewound():
            if stopping() or rewound():
                return False
            time.sleep(0.002)
        return True

    def epoch_done(epoch: int, count: int) -> bool:
        return send(encode(EndOfEpoch(epoch=epoch, count=count, worker=index))) and (
            wait_for_release(epoch + 1)
        )

    try:
        while not stopping():
            if rewound():  # a new run: say where the previous one's messages end
                run[0] = generation.value
                restart_passes(streamer)
                send(encode(EndOfEpoch(epoch=0, count=run[0], worker=index)))
            if not wait_for_release(1):
                continue
            assert config.seed is not None  # resolved by the server before the pool
            seeder = EpochSeeder(config.seed, index, config.workers)
            items = EpochIterator(streamer, max_epochs=config.epochs, on_epoch_start=seeder)
            produce(
                items, send, policy=config.policy, server_id=config.server_id,
                skip_errors=config.on_error == "skip", epoch_done=epoch_done, meter=meter,
                align=align, start=(first.value, 0) if first.value > 1 else None, shm=shm,
            )
            while not (stopping() or rewound()):  # the run is over: wait for another
                time.sleep(0.01)
    except Exception as error:
        send(encode(error_message(error, config.server_id)))
    # Stay until the server says stop, so nothing queued here is dropped by an early close.
    while not stopping():
        time.sleep(0.01)
    push.close(linger=0)
    context.term()
