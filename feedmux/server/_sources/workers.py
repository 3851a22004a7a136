"""Sampling worker processes: each runs the shards the server assigns it.

The pool forks its worker processes (*slots*) at start, before the server
creates its ZeroMQ context, and spreads the shards over them once
(:attr:`WorkerPool.active`: the slots alive). A shard stays with its slot for the
run; only a worker's death moves its shards to the others
(:meth:`WorkerPool.rehome`). The number of workers that sample
(:attr:`WorkerPool.running`: ``--workers auto``, ``feedmux scale``) is a number
of turns to draw (:mod:`feedmux.server._sources.turns`), so a change never moves
a shard and takes effect within one message. A worker reads its shards from the
shared :class:`~feedmux.server._sources.assignment.Assignment` between messages,
runs each through a :class:`~feedmux.server._sources.runner.ShardRunner` in the
merge order while it holds a turn, and pushes their encoded data messages and,
after each epoch of a shard, an ``EndOfEpoch`` to the server over an internal
endpoint of its own (FIFO per worker; the server merges them,
:mod:`feedmux.server._sources.merge`). A shard's next epoch waits until the
server has heard the end of the epoch from every shard (the epoch gate), so
epochs leave the server one after the other. Each shard reseeds the
process-wide random state from (seed, shard, epoch) and keeps it as its own
(:class:`~feedmux.server._sources.shards.ShardRandom`). Workers die with their
parent (``PR_SET_PDEATHSIG`` where the kernel offers it, and a parent-pid
check everywhere they wait), so no exit path leaves one behind; a stopping pool
kills a worker that has not stopped in time (or at once on a second signal), and
a worker's second SIGTERM ends it wherever its streamer is stuck.

With the shared-memory pool, the pool is opened before the fork and each worker
allocates in a region of it (:mod:`feedmux._plumbing.shmruns`): its owned copies
and ``shared_empty`` arrays are written there, and its messages carry 56-byte
references instead of the arrays. A worker that dies (SIGKILL, OOM), with the pool or
without, hands its shards to the others and the run goes on with one worker fewer (a dead
worker is not replaced: forking once the server's ZeroMQ context exists is unsafe; the
run fails only when none is left). The server first takes what the dead worker's socket
already delivered, then takes back (:meth:`WorkerPool.bury`) every run of its region
that the server took no message of and no trainer holds: the state a worker writes
into the slot table before it sends (FORWARDED) and the server's record of the
references it took tell them apart. Its region is left idle; its shards get new
tickets, so nothing it still had on its way is taken.

A worker compresses the data messages it forwards with the codec the server publishes
in :attr:`WorkerPool.codec` (:mod:`feedmux.server._sources.packing`), except while a
trainer maps the pool.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import zmq

from feedmux._plumbing.shm import ShmPool
from feedmux._plumbing.sockets import make_socket
from feedmux._stderrlog import flush_logs
from feedmux.protocol import encode
from feedmux.server._control.meters import SamplerMeter, SharedMeters
from feedmux.server._sources.assignment import Assignment, ShardLedger, plan_owners
from feedmux.server._sources.owning import DrawnItems
from feedmux.server._sources.packing import SharedCodec, pack
from feedmux.server._sources.producer import Frames, SampleErrors, _Draw, error_message
from feedmux.server._sources.runner import ShardRunner, next_runner
from feedmux.server._sources.skips import SkipGuard
from feedmux.server._sources.turns import SamplingTurns
from feedmux.server.config import ServerConfig

__all__ = ["WorkerPool"]

log = logging.getLogger("feedmux.server")

#: How long a stopping pool waits for its workers before it kills them.
WORKER_STOP_TIMEOUT = 2.0
#: How long (ms) a worker whose queue to the server is full waits, keeping its turn,
#: before it gives the turn back: a server that is only busy (it forwards a message in
#: tens of µs) makes room within that, and handing the turn on at every full queue
#: made the workers pass it back and forth about once a message.
SEND_GRACE_MS = 2


class WorkerPool:
    """Forked sampling processes (one per *slot*), the shards' assignment, the turns to
    draw and the epoch gate.

    Every slot is forked at :meth:`start` (before the server creates its ZeroMQ
    context) and runs its shards for the run; :attr:`active` are the slots alive
    (a dead one's shards go to them), :attr:`running` how many of them draw at
    once (``active`` at first: the rest wait for a turn, with no CPU). A change of
    the count moves no shard and never forks.
    """

    def __init__(self, parts: list[Any], config: ServerConfig, endpoint: str, block: int,
                 shm: ShmPool | None = None, slots: int | None = None,
                 active: int | None = None) -> None:
        if config.seed is None:
            raise ValueError("expected the run's seed resolved before the workers start, got None")
        self.config = config
        self.endpoint = endpoint
        self.block = block  # samples per shard per turn of the merge order
        self.parts = parts
        #: How many worker processes are forked (the most that can run shards).
        if slots is None:
            slots = config.worker_range.maximum
        self.slots = slots = min(slots, len(parts))
        #: The slots that run shards: every one alive.
        self.active = list(range(slots))
        self._mp = multiprocessing.get_context("fork")
        #: How many of them draw at once (``active``: every slot at first).
        self.turns = SamplingTurns(slots, min(slots, active or slots), self._mp)
        self._released = self._mp.RawValue("q", 0)
        self._stop = self._mp.Event()
        self.assignment = Assignment(len(parts), self._mp.RawArray)
        #: The codec the workers compress the messages they forward with (none at first).
        self.codec = SharedCodec(self._mp.RawValue)
        #: The trainers' batch size while the server cuts the workers' messages into
        #: batches (0: it sends them on as they come): see :meth:`gather`.
        self._batch_size = self._mp.RawValue("i", 0)
        #: The shards' tickets, counted across the runs of the server.
        self.tickets = itertools.count(1)
        #: Each worker's sampling time and skipped streams, readable from this process.
        self.meters = SharedMeters(slots, config.count_field).meters
        self.processes: list[multiprocessing.process.BaseProcess] = []
        #: Shards given to another worker since a run began (a worker's death).
        self.shards_moved = 0
        #: Slots whose death was handled (their shards went to the others).
        self.lost: set[int] = set()
        #: The shared-memory pool, opened before the fork: each worker gets a region of it.
        self.shm = shm
        if shm is not None:
            shm.split(slots)

    def start(self) -> None:
        for index in range(self.slots):
            process = self._mp.Process(
                target=_worker_main,
                args=(self.parts, self.config, index, self.endpoint_of(index), self.block,
                      (self._released, self.assignment, self.codec, self.turns,
                       self._batch_size), self._stop,
                      os.getpid(),
                      self.meters[index], self.shm),
                name=f"feedmux-worker-{index}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)
        log.info("started %d sampling worker(s): pids %s", len(self.processes),
                 ", ".join(str(p.pid) for p in self.processes))
        log.info("%d of them sample at once, the %d shard(s) spread over all", self.running,
                 len(self.parts))

    def endpoint_of(self, index: int) -> str:
        """The internal endpoint worker ``index`` pushes to (one each: FIFO per worker)."""
        return f"{self.endpoint}-{index}"

    def gather(self, batch_size: int) -> None:
        """Tell the workers whether the server cuts their messages into batches of
        ``batch_size`` (0: no, it sends each on as it comes).

        While it does, a worker fills each message up to its merge block instead of
        shipping what it sampled within ``max_delay``: the server waits for a whole
        batch anyway, and each message it forwards costs it the same however few
        samples it carries (a worker's image every 2 ms made messages of 1-2 images).
        """
        if self._batch_size.value != batch_size:
            self._batch_size.value = batch_size

    def release(self, epoch: int) -> None:
        """Let the workers start ``epoch``."""
        self._released.value = epoch
        self.turns.wake_all()

    def place(self, ledger: ShardLedger, start: tuple[int, int] | None = None) -> list[int]:
        """Give every shard an owner among :attr:`active`; returns the shards that moved.

        With ``start`` (a new run) every shard gets a new ticket and starts there;
        otherwise only the shards whose owner changes do, from where the server's
        ``ledger`` says they stand (their old owner's messages still on their way are
        dropped by their ticket).
        """
        owners = self.assignment.owners()
        planned = plan_owners(owners, self.active)
        changes = {}
        for index, owner in enumerate(planned):
            if start is not None or owner != owners[index]:
                point = start or ledger.resume_point(index)
                changes[index] = (owner, ledger.assign(index, *point), *point)
        if start is not None:
            self._released.value = 0  # nobody runs ahead of the new run's start
        else:
            self.shards_moved += len(changes)
        self.assignment.write(changes)
        self.turns.wake_all()
        return sorted(changes)

    @property
    def running(self) -> int:
        """How many workers draw at once: the turns, at most the workers alive."""
        return min(self.turns.limit, len(self.active))

    def resize(self, count: int) -> None:
        """Let ``count`` workers draw at once (clamped to those alive); no shard moves."""
        self.turns.set_limit(max(1, min(count, len(self.active))))

    def rehome(self, ledger: ShardLedger) -> list[int]:
        """The dead slots' shards go to those alive; returns the shards moved."""
        for slot in self.lost:
            self.turns.forget(slot)
        self.active = [slot for slot in range(self.slots) if slot not in self.lost]
        return self.place(ledger)

    def owned(self, slot: int) -> list[int]:
        """The shards ``slot`` runs."""
        return [index for index, owner in enumerate(self.assignment.owners()) if owner == slot]

    def liveness(self) -> dict[str, int | float | str | None]:
        """``worker.<index>.alive`` (1 while that worker process runs, else 0),
        ``workers_sampling_now`` (those holding a turn to draw this instant) and
        ``shards_moved`` (shards given to another worker since the run began)."""
        figures: dict[str, int | float | str | None] = {
            f"worker.{index}.alive": int(process.exitcode is None)
            for index, process in enumerate(self.processes)}
        figures["workers_sampling_now"] = (len(self.active) if self.turns.free()
                                           else len(self.turns.holders()))
        figures["shards_moved"] = self.shards_moved
        return figures

    def dead(self) -> list[int]:
        """The indices of the workers that are not running."""
        return [index for index, process in enumerate(self.processes)
                if process.exitcode is not None]

    def casualties(self) -> list[int]:
        """Slots that died on their own since last asked (not stopped by the pool)."""
        if self._stop.is_set():
            return []
        fresh = [index for index in self.dead() if index not in self.lost]
        self.lost.update(fresh)
        return fresh

    def bury(self, slot: int) -> int:
        """Take back the pool's runs of ``slot``, which died, that nothing refers to (the
        server took no message of them, no trainer holds them: :meth:`ShmPool.adopt`);
        the server drained its socket first. Its region is left idle for the run.
        Returns the runs freed (0 without the pool)."""
        return 0 if self.shm is None else self.shm.adopt(slot)

    def reclaim(self) -> None:
        """Stop every worker and take back the runs of the pool they had not handed to a
        trainer (the server fails): only the trainers' views stay."""
        self.stop()
        if self.shm is not None:
            for index in range(len(self.processes)):
                self.shm.adopt(index, keep_received=False)

    def failure(self, slot: int) -> str:
        """A description of worker ``slot``'s exit."""
        process = self.processes[slot]
        return (f"sampling worker {slot} (pid {process.pid}) exited unexpectedly "
                f"with code {process.exitcode}")

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> None:
        """Stop every worker: ask, wait up to ``timeout`` s, then kill; never leaves one running.

        The kill also happens when the wait is cut short (a second SIGINT / SIGTERM
        raises in the server's main thread): a worker stuck in user code never
        looks at the request, and nothing else would stop it.
        """
        self._stop.set()
        self.turns.wake_all()
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
    parts: list[Any],
    config: ServerConfig,
    index: int,
    endpoint: str,
    block: int,
    shared: tuple[Any, Assignment, SharedCodec, SamplingTurns, Any],
    stop_event: Any,
    parent_pid: int,
    meter: SamplerMeter,
    shm: ShmPool | None,
) -> None:
    _die_with_parent()

    released, assignment, codec, turns, batch_size = shared
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

    def send(frames: Frames) -> bool:
        # Large arrays go as references to this worker's runs of the pool, if it can.
        placed = None if shm is None else shm.forward(frames)
        wire: Sequence[Any]
        if placed is not None:
            wire = placed.frames
        elif shm is not None and shm.wanted:  # the server compresses for the others
            wire = frames
        else:
            wire = pack(frames, codec.read())
        sent = False
        try:
            while not sent:
                try:
                    push.send_multipart(wire, flags=zmq.NOBLOCK, copy=False)
                    sent = True
                except zmq.Again:
                    if stopping():
                        break
                    if push.poll(SEND_GRACE_MS, zmq.POLLOUT):
                        continue  # the server was only busy: keep the turn
                    turns.release(index)  # a worker that cannot send does not draw
                    push.poll(100, zmq.POLLOUT)
        finally:
            if placed is not None and shm is not None:
                if sent:
                    placed.delivered()  # the server's to send on or free
                else:
                    shm.cancel(placed)
        return sent

    # A worker sees its shards' part of an epoch only: it stops on a streak of skips alone.
    errors = SampleErrors(config.on_error == "skip", meter,
                          guard=SkipGuard(config.max_skips, whole_epochs=False))
    drawn = _Draw(DrawnItems(shm) if config.policy.copy_arrays else None, errors.hook(), shm,
                  errors, meter)
    runners: dict[int, ShardRunner] = {}
    seen = -1
    try:
        while not stopping():
            if assignment.version != seen:  # shards came or went
                seen, owned = assignment.read(index)
                for shard_index in list(runners):
                    if owned.get(shard_index, (0,))[0] != runners[shard_index].ticket:
                        runners.pop(shard_index).close()
                for shard_index, (ticket, epoch, position) in owned.items():
                    if shard_index not in runners:
                        runners[shard_index] = ShardRunner(
                            parts[shard_index], shard_index, len(parts), config, ticket,
                            (epoch, position), block, drawn)
            runner = next_runner(runners.values(), released.value)
            if runner is None:  # nothing to draw until a release or an assignment
                turns.release(index)
                turns.rest(index)  # woken by a release, an assignment or a stop
                continue
            epoch, blocks, _ = runner.rank()
            if not turns.hold(index, epoch * 1e9 + blocks, stopping):
                continue
            runner.step(send, meter, batch_size.value)
            turns.passing(index, boundary=runner.at_boundary())
    except Exception as error:
        send(encode(error_message(error, config.server_id)))
    turns.release(index)
    # Stay until the server says stop, so nothing queued here is dropped by an early close.
    while not stopping():
        time.sleep(0.01)
    push.close(linger=0)
    context.term()
    flush_logs()  # the process ends with os._exit: no exit handler writes what is held
