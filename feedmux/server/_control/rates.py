"""Rates over a recent window: how fast a count grew lately, or no rate at all yet.

This module owns the arithmetic behind every "per second" and ETA the server
reports (its log line, its statistics, so ``feedmux top`` and the Prometheus
endpoint): a :class:`RateWindow` keeps a few ``(time, count)`` points of the last
:data:`WINDOW` seconds and gives the growth per second between the oldest useful
point and the newest. A rate averaged since the server started, or over a log
period that began while it waited for trainers, says "33 s to go" for an epoch that
ends in 3: the window forgets what is older, and leaves out a quiet stretch before
the count first moved in it (the wait for trainers, a pause before a burst). Before
the count has moved for :data:`LEAST` seconds there is no rate (None), and nobody
is shown one. It is pure (the time is passed in) and must never read a clock, log
or decide anything.
"""

from __future__ import annotations

from collections import deque

__all__ = ["LEAST", "STEP", "WINDOW", "RateWindow", "eta_seconds"]

#: Seconds of history a rate is taken over.
WINDOW = 10.0
#: Seconds the count must have been seen moving before a rate is given.
LEAST = 1.0
#: Points closer together than this replace the newest one (the window holds ~40 points).
STEP = 0.25


class RateWindow:
    """The growth per second of a count over the last ``window`` seconds.

    Examples
    --------
    >>> rates = RateWindow()
    >>> rates.add(0.0, 0); rates.add(5.0, 0)     # waiting: nothing moved, no rate
    >>> rates.rate() is None
    True
    >>> rates.add(5.5, 50); rates.rate() is None   # moving, but for less than a second
    True
    >>> rates.add(7.0, 200); rates.rate()           # 200 since 5.0: the wait is left out
    100.0
    >>> for second in range(8, 30):
    ...     rates.add(float(second), 200)          # stopped: the rate falls to 0
    >>> rates.rate()
    0.0
    """

    __slots__ = ("_points", "least", "moved", "window")

    def __init__(self, window: float = WINDOW, least: float = LEAST) -> None:
        self.window = window
        self.least = least
        self._points: deque[tuple[float, float]] = deque()
        #: Whether the count ever grew (before that, no rate at all).
        self.moved = False

    def add(self, now: float, count: float) -> None:
        """The count is ``count`` at ``now`` (times never go back)."""
        points = self._points
        if points and count > points[-1][1]:
            self.moved = True
        if len(points) >= 2 and now - points[-2][0] < STEP:
            points[-1] = (now, count)  # bounded: at most window / STEP points
        else:
            points.append((now, count))
        # Keep one point at or before the window's start: the base of the rate.
        while len(points) > 2 and points[1][0] <= now - self.window:
            points.popleft()

    def rate(self) -> float | None:
        """Growth per second over the window; None before the count moved for ``least`` s.

        A stretch at the window's start in which the count did not move (the wait
        for trainers, a pause) is left out: the base is the last point before it
        moved. A count that stopped for the whole window has rate 0.
        """
        points = list(self._points)
        if not self.moved or len(points) < 2:
            return None
        base = 0
        while base + 1 < len(points) and points[base + 1][1] <= points[0][1]:
            base += 1
        if base == len(points) - 1:  # not moved within the window
            return 0.0 if points[-1][0] - points[0][0] >= self.least else None
        (start, first), (end, last) = points[base], points[-1]
        if end - start < self.least:
            return None
        return (last - first) / (end - start)


def eta_seconds(done: int, size: int | None, rate: float | None) -> float | None:
    """Seconds to the end of an epoch of ``size`` at ``rate``; None when unknown.

    Examples
    --------
    >>> eta_seconds(250, 1000, 50.0), eta_seconds(250, 1000, None), eta_seconds(5, None, 9.0)
    (15.0, None, None)
    """
    if not size or not rate or rate <= 0:
        return None
    return max(0, size - min(done, size)) / rate
