"""How many sampling workers to run: the ``--workers auto`` decision, as a pure object.

:class:`Autoscaler` takes one :class:`Signals` per window (what the server
measured over it: the workers' busy fraction, how long the data path waited for
trainers, the samples it sent, the trainers' own wait fraction when they report
it) and the time, and returns a :class:`Change` (a target count and its reason) or
None. It grows while the sampling is the bottleneck (the workers are busy and the
trainers wait for data: as they report it, or, when none reports it, as the data
path never waits for them), by as many workers as the trainers' wait asks for and
the host's idle CPUs hold (:meth:`Autoscaler.grown`), and keeps a
growth only if it raised the rate by :data:`MIN_GAIN` (else steps back and holds
that ceiling for :data:`CEILING_SECONDS`, so a CPU-bound sampler never runs more
workers than help it), and never runs more CPU-bound workers (each using
:data:`CPU_BOUND_WORKER` of a CPU or more) than the CPUs it may use, going back to
that many when they turn CPU-bound; it shrinks when the trainers are the bottleneck (they
hardly wait, or, when none reports it, the data path waits for them) and one
worker fewer would still keep up. Hysteresis: a condition must hold
for ``patience`` windows in a row, and changes are ``min_interval`` seconds apart.
It never goes below ``minimum`` nor above ``maximum``. It reads no clock, no
socket and no process: the server feeds it (:mod:`feedmux.server._sources.scaling`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = ["CEILING_SECONDS", "CPU_BOUND_WORKER", "GROWTH_FACTOR", "LIGHT_WORKER", "MIN_GAIN",
           "WAY_OUT_BLOCKED", "Autoscaler", "Change", "Signals", "usable_cpus"]

#: Least relative rise of the rate one more worker must bring to be kept.
MIN_GAIN = 0.08
#: How long a count that did not pay stays the ceiling before it is tried again.
CEILING_SECONDS = 30.0
#: The most one growth multiplies the count by: the trainers' wait and the workers' CPU
#: are estimates from one count, and a sampler's rate need not grow in proportion.
GROWTH_FACTOR = 4
#: CPU per worker below which a growth tries one more worker even with no CPU idle.
LIGHT_WORKER = 0.25
#: CPU per worker from which the workers are CPU-bound: auto never runs more of them than
#: the CPUs it may use (``os.sched_getaffinity``).
CPU_BOUND_WORKER = 0.5
#: The share of a window the data path may wait for trainers that also report waiting,
#: and still have them count as starved by the sampling (more: the way out holds them).
WAY_OUT_BLOCKED = 0.25


def usable_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Signals:
    """What the server measured over one window.

    ``busy``: the running workers' mean fraction of the window spent sampling;
    ``blocked``: the fraction the data path waited because no trainer could take
    more; ``rate``: samples sent per second; ``trainer_wait``: the fraction the
    trainers waited for data (the mean of their latest heartbeats' reports:
    :func:`~feedmux.server._control.waitshare.trainers_wait`), None when none
    reports it (older trainers: ``blocked`` stands in); ``cpu``: the CPUs the
    workers used (CPU seconds per second), None when unknown; ``idle``: how many of
    the CPUs this process may run on were idle, whatever else runs on the host (the
    server's own threads, trainers on the same host, other jobs), None when unknown
    (then the usable CPUs less the workers' stand in).
    """

    workers: int
    busy: float
    blocked: float
    rate: float
    trainer_wait: float | None = None
    cpu: float | None = None
    idle: float | None = None


@dataclass(frozen=True)
class Change:
    """A new worker count and why."""

    target: int
    reason: str


class Autoscaler:
    """Signals in, a target count out; time passed in.

    Examples
    --------
    >>> scaler = Autoscaler(1, 8, cpus=8, min_interval=2.0, patience=2)
    >>> busy = Signals(workers=1, busy=0.97, blocked=0.0, rate=100.0, trainer_wait=0.4)
    >>> scaler.observe(0.0, busy) is None  # one window is not yet a trend
    True
    >>> scaler.observe(1.0, busy).target
    2
    >>> faster = Signals(workers=2, busy=0.96, blocked=0.0, rate=195.0, trainer_wait=0.3)
    >>> scaler.observe(2.0, faster), scaler.observe(3.0, faster).target
    (None, 3)
    >>> flat = Signals(workers=3, busy=0.95, blocked=0.0, rate=198.0, trainer_wait=0.3)
    >>> scaler.observe(4.0, flat), scaler.observe(5.0, flat)
    (None, Change(target=2, reason='3 workers gave 198/s, 2 gave 195/s: back to 2'))
    >>> scaler.observe(6.0, faster), scaler.observe(7.0, faster)  # 3 is the ceiling now
    (None, None)
    """

    def __init__(self, minimum: int, maximum: int, cpus: int | None = None,
                 min_interval: float = 2.0, patience: int = 2, window: float = 1.0,
                 grow_busy: float = 0.6, grow_wait: float = 0.05,
                 shrink_blocked: float = 0.3, shrink_headroom: float = 0.8,
                 shrink_wait: float = 0.02) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"expected 1 <= minimum <= maximum, got {minimum} and {maximum}")
        self.minimum, self.maximum = minimum, maximum
        #: CPUs this run may use (when the host's idle CPUs are not measured, what the
        #: workers leave of them stands in).
        self.cpus = usable_cpus() if cpus is None else cpus
        self.min_interval, self.patience, self.window = min_interval, patience, window
        self.grow_busy, self.grow_wait = grow_busy, grow_wait
        self.shrink_blocked, self.shrink_headroom = shrink_blocked, shrink_headroom
        #: Trainers that report waiting less than this are fed (a worker fewer may do).
        self.shrink_wait = shrink_wait
        #: The best rate since the last change, and (count, best rate) before the last
        #: growth: the growth stays only if it beat that rate by MIN_GAIN.
        self.best = 0.0
        self._recent: list[float] = []  # the rates of the last `patience` windows
        self._before: tuple[int, float] | None = None
        self._last_change = -float("inf")
        self._streak: tuple[str, int] = ("", 0)
        self._ceiling: tuple[int, float] | None = None  # (count, until)

    def observe(self, now: float, signals: Signals) -> Change | None:
        """The change to make after a window ending at ``now``, or None."""
        count = signals.workers
        self.best = max(self.best, signals.rate)
        self._recent = [*self._recent[1 - self.patience:], signals.rate]
        if self._ceiling is not None and now >= self._ceiling[1]:
            self._ceiling = None  # the cost may have changed: try more again
        wish, reason = self._wish(signals)
        streak = self._streak[1] + 1 if wish == self._streak[0] else 1
        self._streak = (wish, streak)
        if not wish or streak < self.patience or now - self._last_change < self.min_interval:
            return None
        # A growth that did not pay goes back whole; a shrink is by one.
        step = {"grow": self.grown(signals) - count, "shrink": -1,
                "back": (self._before[0] if self._before else count - 1) - count,
                "cpus": (self.cpu_cap(signals) or count) - count}[wish]
        target = max(self.minimum, min(self.maximum, count + step))
        if wish == "grow" and self._ceiling is not None:
            target = min(target, self._ceiling[0])  # a jump stops at a count that did not pay
        if target == count:
            return None
        if wish == "back":
            self._ceiling = (target, now + CEILING_SECONDS)
        recent = sum(self._recent) / len(self._recent)
        self._before = (count, recent) if wish == "grow" else None
        self.best, self._recent = 0.0, []
        self._last_change = now
        self._streak = ("", 0)
        return Change(target, reason)

    def grown(self, signals: Signals) -> int:
        """The count a growth goes to: what the trainers ask for, as far as idle CPUs hold.

        The trainers took the window's samples in the ``1 - wait`` share of their time
        they did not wait, so to stop waiting they need about ``1 / (1 - wait)`` times
        the rate: as many times the workers, if the rate grows with them (an I/O-bound
        sampler's does). At most :data:`GROWTH_FACTOR` times the count, and no more
        workers than the idle CPUs hold at the CPU each worker uses now, rounded: one
        more wherever a quarter of a worker's share is idle (a CPU-bound sampler's
        worker uses a whole CPU, so on two CPUs it goes to 2 and stops there; trainers
        or other jobs on the host leave fewer CPUs idle, and so fewer workers). The count itself
        when none fits: then there is no growth, unless each worker uses less than
        :data:`LIGHT_WORKER` of a CPU: then one more (an I/O-bound sampler on a host
        whose CPUs other work keeps busy). Workers that use half a CPU each or more
        are CPU-bound: never more of them than the usable CPUs (:meth:`cpu_cap`,
        whatever the host reads idle). Without the trainers' report it doubles; without
        the workers' CPU it grows by half (1, 2, 3, 4, 6, 9, ...),
        the rate rule its only guard then.

        Examples
        --------
        >>> scaler = Autoscaler(1, 16, cpus=2)
        >>> io = Signals(workers=2, busy=0.97, blocked=0.0, rate=900.0, trainer_wait=0.8,
        ...              cpu=0.1)
        >>> scaler.grown(io)  # 5x the rate asked for, 4x at most, the idle CPU holds 38 more
        8
        >>> scaler.grown(Signals(2, 0.97, 0.0, 900.0, trainer_wait=0.8, cpu=0.8))  # 3 more
        5
        >>> scaler.grown(Signals(2, 0.97, 0.0, 900.0, trainer_wait=0.8, cpu=1.2))  # CPU-bound
        2
        >>> scaler.grown(Signals(2, 0.97, 0.0, 900.0, trainer_wait=0.8, cpu=1.2, idle=0.1))
        2
        >>> scaler.grown(Signals(2, 0.97, 0.0, 900.0, trainer_wait=0.8, cpu=None))
        3
        >>> scaler.grown(Signals(2, 0.97, 0.0, 900.0, trainer_wait=0.8, cpu=0.1, idle=0.0))
        3
        """
        count = signals.workers
        if signals.cpu is None:
            return count + max(1, count // 2)
        if signals.trainer_wait is None:
            wanted = 2 * count
        else:
            wanted = math.ceil(count / max(1.0 - signals.trainer_wait, 1 / GROWTH_FACTOR))
        wanted = min(wanted, GROWTH_FACTOR * count)
        if signals.cpu > 0:
            # As many more as the idle CPUs hold at the CPU each worker uses now, rounded
            # up from a quarter: one more wherever a quarter of a worker's share is idle
            # (a worker more still gets its share from the scheduler, partly at the cost
            # of threads that were waiting: the rate rule judges it).
            idle = self.cpus - signals.cpu if signals.idle is None else signals.idle
            room = max(0, math.floor(idle * count / signals.cpu + 0.75))
            if not room and signals.cpu < LIGHT_WORKER * count:
                # Workers that mostly wait (I/O) on a host whose CPUs other jobs keep
                # busy: one more costs a few percent of a CPU, so try it and let the rate
                # rule judge (idle CPUs alone never let an I/O-bound sampler grow there).
                room = 1
            wanted = min(wanted, count + room)
        cap = self.cpu_cap(signals)
        if cap is not None:
            wanted = min(wanted, cap)
        return max(count, wanted)

    def cpu_cap(self, signals: Signals) -> int | None:
        """The most workers to run when each uses :data:`CPU_BOUND_WORKER` of a CPU or more
        (CPU-bound): the CPUs this process may use; None for lighter workers (mostly
        waiting on I/O: they may go past it) or when their CPU is not measured.

        >>> scaler = Autoscaler(1, 16, cpus=2)
        >>> scaler.cpu_cap(Signals(3, 0.99, 0.0, 900.0, cpu=2.7)), scaler.cpu_cap(
        ...     Signals(8, 0.99, 0.0, 900.0, cpu=0.8))
        (2, None)
        """
        if signals.cpu is None or signals.cpu < CPU_BOUND_WORKER * signals.workers:
            return None
        return max(1, self.cpus)

    def _wish(self, signals: Signals) -> tuple[str, str]:
        count = signals.workers
        if count > self.maximum:
            return "shrink", f"{count} workers is above the maximum {self.maximum}"
        cap = self.cpu_cap(signals)
        if cap is not None and count > max(cap, self.minimum):
            assert signals.cpu is not None
            return "cpus", (f"{count} workers used {signals.cpu / count:.0%} of a CPU each, "
                            f"{self.cpus} CPU(s) usable: CPU-bound workers are at most one "
                            "per CPU")
        if self._before is not None and self._before[0] < count and (
                self.best < self._before[1] * (1 + MIN_GAIN)):
            fewer, below = self._before
            return "back", (f"{count} workers gave {self.best:.0f}/s, "
                            f"{fewer} gave {below:.0f}/s: back to {fewer}")
        starved, fed, what = self._trainers(signals)
        tail = f" of the last {self.window:g} s, workers busy {signals.busy:.0%}"
        if starved and signals.busy >= self.grow_busy:
            ceiling = self._ceiling[0] if self._ceiling is not None else self.maximum
            cpu_bound = signals.cpu is not None and self.grown(signals) <= count
            if count < min(ceiling, self.maximum) and not cpu_bound:
                return "grow", what + tail
        if count > self.minimum and fed and (
                signals.busy * count / (count - 1) < self.shrink_headroom):
            return "shrink", what + tail
        return "", ""

    def _trainers(self, signals: Signals) -> tuple[bool, bool, str]:
        """Whether the trainers starve, whether they are fed, and what says so.

        Their own reported wait when there is one; else the data path's: it never
        waiting for them stands in for their waiting (it cannot tell a trainer
        that waits from one that just keeps up), its waiting for them for their
        being fed.
        """
        waited = signals.trainer_wait
        if waited is None:
            blocked = signals.blocked
            what = ("the data path never waited for trainers" if blocked < 0.05 else
                    f"the data path waited for trainers {blocked:.0%}")
            return blocked < 0.05, blocked >= self.shrink_blocked, what
        # Trainers that wait while the data path waits for them too are held by the way
        # out (the network, one slow trainer), which more workers do not cure: when it
        # waits a good part of the window (WAY_OUT_BLOCKED). A little is no such sign:
        # the merge hands out bursts that fill a trainer's queue for moments, between
        # which it waits (an I/O-bound sampler at 13 of 16 workers: the data path
        # waited 5-15 % of each second, the trainer 25-63 %).
        starved = waited >= self.grow_wait and signals.blocked < WAY_OUT_BLOCKED
        return starved, waited < self.shrink_wait, f"trainers waited {waited:.0%}"
