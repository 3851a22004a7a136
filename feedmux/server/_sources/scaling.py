"""The live worker count: measured windows in, shards moved out.

:class:`WorkerScaling` runs in the forwarding loop. Once per window it measures
what :class:`~feedmux.server._sources.autoscale.Autoscaler` needs (the running
workers' busy fraction from their meters, their CPU use from ``/proc``, how long
the data path waited for trainers, the samples it sent, and the trainers' own
wait as their heartbeats reported it), asks it for a change
(with ``--workers auto``), and applies a change, or a count asked for over control
(``feedmux scale``), at once: it sets the pool's target, and the staffing
(:mod:`feedmux.server._sources.staffing`) forks or retires workers to it in the same
turn of the loop, mid-epoch, the shards that change hands resuming where the server
stands. Every change is logged with its reason and counted. It never samples, never
forks and never reads a socket.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection

from feedmux.server._sources.assignment import ShardLedger
from feedmux.server._sources.autoscale import Autoscaler, Change, Signals
from feedmux.server._sources.workers import WorkerPool
from feedmux.server.config import WorkerRange

__all__ = ["SCALE_WINDOW", "WorkerScaling", "idle_cpu_seconds"]

log = logging.getLogger("feedmux.server")

#: Seconds per measured window of ``--workers auto``.
SCALE_WINDOW = 1.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def idle_cpu_seconds(cpus: Collection[int], stat: str = "/proc/stat") -> float | None:
    """Seconds the CPUs ``cpus`` have been idle since boot, summed (``/proc/stat``:
    idle and iowait); None when it cannot be read.

    What the workers may still use is what nobody uses: the server's own threads,
    trainers on this host and other jobs all leave less idle.
    """
    try:
        with open(stat, "rb") as lines:
            total = 0
            for line in lines:
                name, _, rest = line.partition(b" ")
                if name[:3] == b"cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
                    fields = rest.split()
                    total += int(fields[3]) + int(fields[4])
        return total / _TICKS
    except (OSError, IndexError, ValueError):
        return None


def _affinity() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no /proc/stat either
        return set()


class WorkerScaling:
    """Changes the pool's running workers: ``--workers auto``, and ``feedmux scale`` requests."""

    def __init__(self, pool: WorkerPool, workers: WorkerRange, window: float = SCALE_WINDOW,
                 trainer_wait: Callable[[float], float | None] = lambda now: None) -> None:
        self.pool = pool
        self.range = workers
        #: ``trainer_wait(now)``: the trainers' reported wait fraction (None: none reports),
        #: asked once a window.
        self.trainer_wait = trainer_wait
        top = min(workers.maximum, pool.slots)
        self.autoscaler = Autoscaler(min(workers.minimum, top), top, window=window) if (
            workers.auto) else None
        self.window = window
        #: A count asked for over control (None: auto, or the fixed count).
        self.forced: int | None = None
        #: Changes made, and the last one's reason.
        self.changes = 0
        self.last_reason = ""
        #: The window's start: (time, busy seconds, blocked seconds, samples sent, the
        #: workers' CPU seconds and the usable CPUs' idle seconds, each None if unknown).
        self._mark: tuple[float, float, float, int, float | None, float | None] | None = None
        #: The worker pids the window measures (a new set starts a new window: a new
        #: process's CPU seconds start from 0).
        self._measured: tuple[int, ...] = ()
        self._cpus = _affinity()

    def stats(self) -> dict[str, int | float | str | None]:
        """``workers``, ``worker_changes`` and ``worker_change_reason`` for the statistics."""
        return {"workers": self.pool.running, "worker_changes": self.changes,
                "worker_change_reason": self.last_reason,
                "workers_auto": int(self.autoscaler is not None and self.forced is None)}

    def request(self, count: int) -> None:
        """A count asked for over control: run ``count`` workers (0: back to auto)."""
        if count == 0:
            self.forced = None
            log.info("workers: back to %s", "auto" if self.autoscaler else "the fixed count")
            return
        self.forced = count
        self.apply(Change(count, "asked for over control (feedmux scale)"), forced=True)

    def apply(self, change: Change, forced: bool = False) -> None:
        """Run ``change.target`` workers from now (the staffing forks or retires them at
        once); logged with its reason. A count asked for (``forced``) that is already
        the count is logged and shown too: it fixes the count (auto no longer changes it)."""
        before = self.pool.target
        self.pool.resize(change.target)
        after = self.pool.target
        if after == before:
            if forced:
                self.last_reason = change.reason
                log.info("workers %d, kept: %s", after, change.reason)
            return
        self.changes += 1
        self.last_reason = change.reason
        log.info("workers %d -> %d: %s", before, after, change.reason)
        self._mark = None  # the next window starts with the new count

    def tick(self, now: float, blocked_seconds: float, samples_sent: int,
             ledger: ShardLedger) -> None:
        """Measure the window ending at ``now``; with auto, change the count if it says so."""
        if self.autoscaler is None or self.forced is not None:
            return
        if ledger.settling:  # moved shards still replaying: their rate is no measure yet
            self._mark = None
            return
        if self._mark is not None and now - self._mark[0] < self.window:
            return  # called on every turn of the loop: the figures are read once a window
        active = self.pool.active
        # At a count of one with ``auto``, the server's own process: the CPU of its draws.
        pids = tuple(self.pool.pid_of(seat) for seat in active)
        if pids != self._measured:
            self._measured, self._mark = pids, None
        busy = sum(self.pool.meters[seat].busy_seconds for seat in active)
        each = [self.pool.cpu_of(seat) for seat in active]
        cpu = None if None in each else sum(seconds or 0.0 for seconds in each)
        mark = (now, busy, blocked_seconds, samples_sent, cpu, idle_cpu_seconds(self._cpus))
        if self._mark is None:
            self._mark = mark
            return
        elapsed = now - self._mark[0]
        self._mark, (_, busy0, blocked0, sent0, cpu0, idle0) = mark, self._mark
        idle = mark[5]
        running = self.pool.running
        signals = Signals(
            workers=running, busy=min(1.0, (busy - busy0) / (elapsed * running)),
            blocked=min(1.0, (blocked_seconds - blocked0) / elapsed),
            rate=(samples_sent - sent0) / elapsed, trainer_wait=self.trainer_wait(now),
            cpu=None if cpu is None or cpu0 is None else (cpu - cpu0) / elapsed,
            idle=None if idle is None or idle0 is None else (idle - idle0) / elapsed)
        change = self.autoscaler.observe(now, signals)
        if change is not None:
            self.apply(change)

