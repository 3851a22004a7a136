"""Sampling worker processes: each runs the shards the server assigns it.

The pool forks one process at start, before the server creates its ZeroMQ
context: the zygote (:mod:`feedmux.server._sources.zygote`), which forks the
workers when they are wanted, so that a worker exists only while it samples.
Each worker has a *seat* (its meter, its wake-up, its region of the
shared-memory pool, and with its generation its endpoint); :attr:`WorkerPool.active`
are the seats whose worker runs shards, :attr:`WorkerPool.target` how many the
server wants running. With ``auto`` the pool has one more seat, the *home* seat of
the server's own process (:attr:`WorkerPool.home`), which runs every shard while the
target is one (:mod:`feedmux.server._sources.inprocess`): no worker process then.
The server's staffing (:mod:`feedmux.server._sources.staffing`) matches them: it forks more, asks
surplus workers to end after their current message (:meth:`WorkerPool.retire`),
and puts a new worker in the seat of one that died; each time the shards are
spread again over the workers running (:meth:`WorkerPool.place`), a shard that
changes hands getting a new ticket. A worker reads its shards from the shared
:class:`~feedmux.server._sources.assignment.Assignment` between messages, runs
each through a :class:`~feedmux.server._sources.runner.ShardRunner` in the merge
order, and pushes their encoded data messages and, after each epoch of a shard,
an ``EndOfEpoch`` to the server over an internal endpoint of its own (FIFO per
worker; the server merges them, :mod:`feedmux.server._sources.merge`). A shard's
next epoch waits until the server has heard the end of the epoch from every
shard (the epoch gate), so epochs leave the server one after the other. Each
shard reseeds the process-wide random state from (seed, shard, epoch) and keeps
it as its own (:class:`~feedmux.server._sources.shards.ShardRandom`). Workers end
with their server: the zygote SIGKILLs them when the server's end of its socket
pair closes (the server ended, however), and a worker checks that its server
still runs wherever it waits; a stopping pool kills a worker that has not
stopped in time (or at once on a second signal), and a worker's second SIGTERM
ends it wherever its streamer is stuck.

With the shared-memory pool, the pool is opened before the fork and each seat
allocates in a region of it (:mod:`feedmux._plumbing.shmruns`): its owned copies
and ``shared_empty`` arrays are written there, and its messages carry 56-byte
references instead of the arrays. When a worker ends (it died, SIGKILL or OOM, or
it was asked to end), with the pool or without, the server first takes what its
socket already delivered, then takes back (:meth:`WorkerPool.bury`) every run of
its region that the server took no message of and no trainer holds: the state a
worker writes into the slot table before it sends (FORWARDED) and the server's
record of the references it took tell them apart. The seat's next worker
allocates in the same region around what is still held; its socket is a new one,
so nothing the dead worker still had on its way is ever read.

A worker compresses the data messages it forwards with the codec the server publishes
in :attr:`WorkerPool.codec` (:mod:`feedmux.server._sources.packing`), except while a
trainer maps the pool.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import zmq

from feedmux._plumbing.shm import ShmPool
from feedmux._plumbing.sockets import make_socket
from feedmux._stderrlog import flush_logs
from feedmux.protocol import encode
from feedmux.server._delivery.outbox import Frames
from feedmux.server._sources.assignment import Assignment, ShardLedger, plan_owners
from feedmux.server._sources.meters import SamplerMeter, SharedMeters
from feedmux.server._sources.owning import DrawnItems
from feedmux.server._sources.packing import SharedCodec, pack
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import Draw, SampleErrors, error_message
from feedmux.server._sources.runner import SeatRunners
from feedmux.server._sources.skips import SkipGuard
from feedmux.server._sources.wakeups import Wakeups
from feedmux.server._sources.zygote import Zygote, pid_alive
from feedmux.server.config import ServerConfig

__all__ = ["WorkerPool"]

log = logging.getLogger("feedmux.server")

#: How long a stopping pool waits for its workers before it kills them.
WORKER_STOP_TIMEOUT = 2.0
#: Seconds between two looks at the workers' pids once their zygote is gone.
ORPHAN_CHECK = 0.1
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class WorkerPool:
    """The sampling workers: their seats, the zygote that forks them, the shards'
    assignment and the epoch gate.

    :meth:`start` forks the zygote (before the server creates its ZeroMQ context);
    the workers are forked from it by :meth:`spawn`, one per *seat* (the seat names
    the worker's meter, wake-up, region of the shared-memory pool and, with its
    generation, its endpoint). :attr:`active` are the seats whose worker runs
    shards, :attr:`target` how many the server wants running (``--workers``,
    ``auto``, ``feedmux scale``): the server's staffing
    (:mod:`feedmux.server._sources.staffing`) forks, retires and replaces workers
    to match it.
    """

    def __init__(self, parts: list[Any], config: ServerConfig, endpoint: str, block: int,
                 shm: ShmPool | None = None, slots: int | None = None,
                 active: int | None = None, home: bool = False) -> None:
        if config.seed is None:
            raise ValueError("expected the run's seed resolved before the workers start, got None")
        self.config = config
        self.endpoint = endpoint
        self.block = block  # samples per shard per turn of the merge order
        self.parts = parts
        #: How many seats there are (the most workers that can run shards at once).
        if slots is None:
            slots = config.worker_range.maximum
        self.slots = slots = min(slots, len(parts))
        #: How many workers to run (the staffing forks or retires workers to match).
        self.target = max(1, min(slots, active or slots))
        #: The seat of the server's own process (``home``: ``auto``), which runs the shards
        #: while the target is one (:mod:`feedmux.server._sources.inprocess`), else None.
        #: It is the seat after the workers' (its meter too), never forked nor freed.
        self.home = slots if home else None
        #: The CPU seconds the server's own process spent drawing for the home seat (set
        #: by :class:`~feedmux.server._sources.inprocess.InProcessSeat`).
        self.home_cpu: Callable[[], float] = lambda: 0.0
        #: The seats whose worker runs shards (in seat order).
        self.active: list[int] = []
        #: Seat -> the pid of its worker, while it runs (a retiring one too).
        self.pids: dict[int, int] = {}
        #: Seats whose worker was asked to end (the count went down): their shards moved.
        self.retiring: set[int] = set()
        #: Seats whose worker died and was not replaced (no zygote): shown DOWN.
        self.down: set[int] = set()
        #: Seat -> (pid, exit code: None when unknown) of its last worker that ended.
        self.ended_as: dict[int, tuple[int, int | None]] = {}
        #: How many workers each seat has had: a worker's endpoint names its generation,
        #: so that nothing of a dead one is ever read from its successor's socket.
        self.generations = [0] * slots
        #: Workers forked, and of them the replacements of a dead one.
        self.started = 0
        self.replaced = 0
        self._mp = multiprocessing.get_context("fork")
        self.wakeups = Wakeups(slots, self._mp)
        self._retire = self._mp.RawArray("b", slots)
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
        #: Each seat's sampling time and skipped streams, readable from this process.
        self.meters = SharedMeters(slots + home, config.count_field).meters
        #: Shards given to another worker since a run began (a count change, a death).
        self.shards_moved = 0
        #: The shared-memory pool, opened before the fork: each seat gets a region of it.
        self.shm = shm
        if shm is not None:
            shm.split(slots)
        self.zygote = Zygote(self._work)
        self._orphans_checked = 0.0

    def start(self) -> None:
        """Fork the zygote (before this process makes a thread or a ZeroMQ context)."""
        self.zygote.start()
        log.info("the zygote (pid %s) forks the sampling workers: %d to start, at most %d, "
                 "the %d shard(s) spread over those running", self.zygote.pid, self.target,
                 self.slots, len(self.parts))

    def endpoint_of(self, seat: int, generation: int | None = None) -> str:
        """The internal endpoint of the worker in ``seat`` (of its current generation)."""
        if generation is None:
            generation = self.generations[seat]
        return f"{self.endpoint}-{seat}-{generation}"

    def free_seats(self) -> list[int]:
        """The seats with no worker."""
        return [seat for seat in range(self.slots) if seat not in self.pids]

    def prepare(self, seat: int) -> str:
        """A new generation for ``seat``: the endpoint its next worker connects to."""
        self.generations[seat] += 1
        self._retire[seat] = 0
        return self.endpoint_of(seat)

    def spawn(self, seat: int) -> int | None:
        """Fork a worker into ``seat`` (after :meth:`prepare`); its pid, or None when the
        zygote cannot (it is gone)."""
        pid = self.zygote.fork(seat, self.generations[seat])
        if pid is None:
            return None
        self.pids[seat] = pid
        self.started += 1
        self.down.discard(seat)
        if seat not in self.active:
            self.active = sorted([*self.active, seat])
        return pid

    def _work(self, seat: int, generation: int, server_alive: Any) -> None:
        """What a worker forked by the zygote runs."""
        _worker_main(self.parts, self.config, seat, self.endpoint_of(seat, generation),
                     self.block, (self._released, self.assignment, self.codec, self.wakeups,
                                  self._batch_size, self._retire), self._stop, server_alive,
                     self.meters[seat], self.shm)

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

    @property
    def batch_size(self) -> int:
        """The batch size the messages are filled for (:meth:`gather`; 0: none)."""
        return int(self._batch_size.value)

    def release(self, epoch: int) -> None:
        """Let the workers start ``epoch``."""
        self._released.value = epoch
        self.wakeups.wake_all()

    def place(self, ledger: ShardLedger, start: tuple[int, int] | None = None,
              renew: Collection[int] = ()) -> list[int]:
        """Give every shard an owner among :attr:`active`; returns the shards that moved.

        With ``start`` (a new run) every shard gets a new ticket and starts there;
        otherwise the shards whose owner changes, and those of ``renew`` (a dead
        worker's, now its successor's in the same seat), do, from where the server's
        ``ledger`` says they stand (what was still on its way under their old ticket
        is dropped).
        """
        owners = self.assignment.owners()
        planned = plan_owners(owners, self.active)
        changes = {}
        for index, owner in enumerate(planned):
            if start is not None or owner != owners[index] or index in renew:
                point = start or ledger.resume_point(index)
                changes[index] = (owner, ledger.assign(index, *point), *point)
        if start is not None:
            self._released.value = 0  # nobody runs ahead of the new run's start
        else:
            self.shards_moved += len(changes)
        self.assignment.write(changes)
        self.wakeups.wake_all()
        return sorted(changes)

    @property
    def running(self) -> int:
        """How many sampling processes run shards now (the server's own counts as one)."""
        return len(self.active)

    @property
    def released(self) -> int:
        """The last epoch the shards may draw from (:meth:`release`)."""
        return int(self._released.value)

    def forks_wanted(self) -> int:
        """How many worker processes the target asks for: none at a target of one when
        the server samples in its own process (:attr:`home`), else the target."""
        return 0 if self.target == 1 and self.home is not None else self.target

    def sample_here(self, wanted: bool) -> bool:
        """Put the server's own seat (:attr:`home`) into :attr:`active` or take it out
        (its shards go elsewhere at the next :meth:`place`); whether that changed it.
        Its draws stop at once: nothing of it is on its way (it sends to nobody)."""
        home = self.home
        if home is None or wanted == (home in self.active):
            return False
        others = [seat for seat in self.active if seat != home]
        self.active = [*others, home] if wanted else others
        return True

    def pid_of(self, seat: int) -> int:
        """The pid of the process that runs ``seat`` (-1: none); the server's for
        :attr:`home`."""
        return os.getpid() if seat == self.home else self.pids.get(seat, -1)

    def cpu_of(self, seat: int) -> float | None:
        """The CPU seconds ``seat``'s worker has used (``/proc``: None when unknown); for
        :attr:`home`, those of the server's draws only (:attr:`home_cpu`), not of its
        forwarding, which no worker's figure holds either."""
        return self.home_cpu() if seat == self.home else process_cpu_seconds(
            self.pids.get(seat, -1))

    def resize(self, count: int) -> None:
        """Run ``count`` workers (clamped to the seats): the staffing forks or retires."""
        self.target = max(1, min(count, self.slots))

    def retire(self, seats: Collection[int]) -> None:
        """Take ``seats`` out of :attr:`active` (their shards go elsewhere at the next
        :meth:`place`) and ask their workers to end after their current message."""
        self.active = [seat for seat in self.active if seat not in seats]
        for seat in seats:
            self._retire[seat] = 1
            self.retiring.add(seat)
        self.wakeups.wake_all()

    def ended(self) -> list[int]:
        """Seats whose worker exited since last asked (not those a stop ended)."""
        if self._stop.is_set():
            return []
        by_pid = {pid: seat for seat, pid in self.pids.items()}
        exits: list[tuple[int, int | None]] = list(self.zygote.exits())
        now = time.monotonic()
        if self.zygote.gone and now >= self._orphans_checked + ORPHAN_CHECK:
            # Nobody reaps them now: their pids say (a look at /proc each, so not every turn).
            self._orphans_checked = now
            exits += [(pid, None) for pid in by_pid if not pid_alive(pid)]
        seats = []
        for pid, code in exits:
            seat = by_pid.pop(pid, None)
            if seat is not None:
                self.ended_as[seat] = (pid, code)
                del self.pids[seat]
                seats.append(seat)
        return seats

    def vacate(self, seat: int, down: bool = False) -> None:
        """``seat``'s worker is gone for good: out of :attr:`active` (``down``: it died
        and nobody replaces it)."""
        self.active = [each for each in self.active if each != seat]
        self.retiring.discard(seat)
        if down:
            self.down.add(seat)

    def owned(self, seat: int) -> list[int]:
        """The shards ``seat`` runs."""
        return [index for index, owner in enumerate(self.assignment.owners()) if owner == seat]

    def liveness(self) -> dict[str, int | float | str | None]:
        """``worker.<seat>.alive`` (1 while that seat's worker runs, 0 for a seat whose
        worker died and was not replaced) and ``.pid``, ``workers_sampling_now`` (the
        sampling processes running shards), ``sampling_in_server`` (1 while the server's
        own process runs them: ``auto`` at a count of one), ``workers_started`` and
        ``workers_replaced`` (forked since start, and of them in place of a dead one),
        ``zygote_alive`` and
        ``shards_moved`` (shards given to another worker since the run began)."""
        figures: dict[str, int | float | str | None] = {}
        for seat in sorted({*self.pids, *self.down}):
            figures[f"worker.{seat}.alive"] = int(seat in self.pids)
            if seat in self.pids:
                figures[f"worker.{seat}.pid"] = self.pids[seat]
        figures["workers_sampling_now"] = len(self.active)
        figures["sampling_in_server"] = int(self.home in self.active)
        figures["workers_started"] = self.started
        figures["workers_replaced"] = self.replaced
        figures["zygote_alive"] = int(not self.zygote.gone)
        figures["shards_moved"] = self.shards_moved
        return figures

    def bury(self, slot: int) -> int:
        """Take back the pool's runs of ``slot``, whose worker ended, that nothing refers
        to (the server took no message of them, no trainer holds them:
        :meth:`ShmPool.adopt`); the server drained its socket first. The rest come back
        as they are released; the seat's next worker allocates around them.
        Returns the runs freed (0 without the pool)."""
        return 0 if self.shm is None else self.shm.adopt(slot)

    def reclaim(self) -> None:
        """Stop every worker and take back the runs of the pool they had not handed to a
        trainer (the server fails): only the trainers' views stay."""
        self.stop()
        if self.shm is not None:
            for seat in range(self.slots):
                self.shm.adopt(seat, keep_received=False)

    def failure(self, slot: int) -> str:
        """A description of the exit of ``slot``'s last worker."""
        pid, code = self.ended_as.get(slot, (None, None))
        how = (f"with code {code}" if code is not None else
               "(its exit code is unknown: the zygote that reaped it is gone)")
        return f"sampling worker {slot} (pid {pid}) exited unexpectedly {how}"

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> None:
        """Stop every worker: ask, wait up to ``timeout`` s, then kill; never leaves one running.

        The kill also happens when the wait is cut short (a second SIGINT / SIGTERM
        raises in the server's main thread): a worker stuck in user code never
        looks at the request, and nothing else would stop it.
        """
        self._stop.set()
        self.wakeups.wake_all()
        deadline = time.monotonic() + timeout
        try:
            running = dict(self.pids)
            while running and time.monotonic() < deadline and not self.zygote.gone:
                for pid, _ in self.zygote.exits():
                    running = {seat: each for seat, each in running.items() if each != pid}
                if running:
                    self.zygote.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            if self.zygote.gone:
                while running and time.monotonic() < deadline:
                    running = {seat: pid for seat, pid in running.items() if pid_alive(pid)}
                    if running:
                        time.sleep(0.02)  # no parent of theirs reports: their pids say
            self.pids = running
        finally:
            self._kill()

    def _kill(self) -> None:
        # Every kill goes out, whatever signal arrives meanwhile; only then the waits.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            lost = self.zygote.gone
            # Closing the pair makes the zygote SIGKILL the workers still running and exit.
            self.zygote.stop()
            for seat, pid in self.pids.items():
                log.warning("worker %d (pid %s) did not stop in time; killed it", seat, pid)
                if lost and pid_alive(pid):  # orphaned: the zygote cannot kill it
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            self.pids = {}
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def process_cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of process ``pid`` (None when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


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
    shared: tuple[Any, Assignment, SharedCodec, Wakeups, Any, Any],
    stop_event: Any,
    server_alive: Callable[[], bool],
    meter: SamplerMeter,
    shm: ShmPool | None,
) -> None:
    released, assignment, codec, wakeups, batch_size, retire = shared
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us
    terminated: list[bool] = []
    signal.signal(signal.SIGTERM, _on_sigterm(terminated))

    def stopping() -> bool:
        return (bool(terminated) or stop_event.is_set() or bool(retire[index])
                or not server_alive())

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
    policy = BatchPolicy.of(config)
    drawn = Draw(DrawnItems(shm) if policy.copy_arrays else None, errors.hook(), shm,
                  errors, meter)
    seat = SeatRunners(parts, config, index, block, drawn)
    try:
        while not stopping():
            seat.follow(assignment)  # shards came or went
            runner = seat.next(released.value)
            if runner is None:  # nothing to draw until a release or an assignment
                wakeups.rest(index)  # woken by a release, an assignment or a stop
                continue
            runner.step(send, meter, batch_size.value)
    except Exception as error:
        send(encode(error_message(error, config.server_id)))
    # Stay until the server says stop, so nothing queued here is dropped by an early close.
    while not stopping():
        time.sleep(0.01)
    push.close(linger=0)
    context.term()
    flush_logs()  # the process ends with os._exit: no exit handler writes what is held
