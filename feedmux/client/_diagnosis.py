"""Is the trainer waiting for data, and why? The pure logic behind ``RemoteLoader.stats()``.

This module owns the trainer's input-bound diagnosis: the time the training
loop spent waiting inside ``next()`` against the time between calls, over a
window (and over the span between two heartbeats: :class:`WaitShare`, the
fraction each heartbeat tells the servers); the servers' busy (sampling) and
blocked (waiting for trainers) fractions, from the difference of two statistics
answers; and the verdict, a log line with the likely cause and the fix when the
trainer waited for more than a threshold of the window (the first window is
:data:`FIRST_WINDOW` seconds at most, so that a trainer starved from the start
hears why within seconds, not after a whole window). The loader calls it once per data message
(never once per sample) with the time passed in. It never reads a clock,
never touches a socket and never imports zmq: it only says when the servers
should be asked for their statistics, and the loader asks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from feedmux.protocol import Message, Stats

__all__ = [
    "BLOCKED_LIMIT",
    "BUSY_LIMIT",
    "FIRST_WINDOW",
    "MIN_SHARE_SPAN",
    "InputDiagnosis",
    "ServerLoad",
    "WaitShare",
    "explain",
]

log = logging.getLogger("feedmux.client")

#: A server sampling this fraction of the time (per sampling process) is the limit.
BUSY_LIMIT = 0.8
#: A server waiting to send this fraction of the time is held back by the way out.
BLOCKED_LIMIT = 0.5
#: Seconds into the first window after which :meth:`InputDiagnosis.stats` reports the
#: figures so far (and the servers are asked once more, for their load).
EARLY_FIGURES = 1.0
#: Seconds the first window lasts at most: its verdict (``add --workers``...) comes this
#: soon after the first data, the later windows last the loader's ``diagnose_window``.
FIRST_WINDOW = 10.0
#: Seconds of server uptime two statistics answers must lie apart for the load between
#: them to count (shorter: a server that sampled in whole draws of 0.1 s looks idle).
MIN_FIGURES_SPAN = 0.25
#: Seconds a :class:`WaitShare` report must span at least (a heartbeat hurried by an epoch
#: end right after the last one would say little): shorter, the span goes on.
MIN_SHARE_SPAN = 0.25


@dataclass(frozen=True)
class ServerLoad:
    """Where one server's time went between two statistics answers (fractions 0-1)."""

    busy: float
    blocked: float


def explain(wait_fraction: float, window: float, loads: list[ServerLoad]) -> str:
    """The verdict for a trainer that waited ``wait_fraction`` of ``window`` seconds.

    Examples
    --------
    >>> explain(0.38, 60, [ServerLoad(busy=0.98, blocked=0.0)])[:91]
    'waited for data 38% of the last 60 s; the server is sampling 98% of the time: add --workers'
    >>> explain(0.5, 60, [ServerLoad(busy=0.2, blocked=0.7)])[38:129]
    'the server is blocked on sending 70% of the time: the network or the transport is the limit'
    """
    head = f"waited for data {wait_fraction:.0%} of the last {window:g} s; "
    if not loads:
        return head + ("no statistics from the server yet (is the control endpoint right?): "
                       "see `feedmux top` on the server's control address")
    busy = max(load.busy for load in loads)
    blocked = max(load.blocked for load in loads)
    if busy >= BUSY_LIMIT:
        return head + (f"the server is sampling {busy:.0%} of the time: add --workers "
                       "(or more servers, or a faster sampler)")
    if blocked >= BLOCKED_LIMIT:
        return head + (f"the server is blocked on sending {blocked:.0%} of the time: the network "
                       "or the transport is the limit (fewer bytes per sample, more samples per "
                       "message, or a server closer to the trainer)")
    return head + (f"the server is neither sampling ({busy:.0%}) nor blocked ({blocked:.0%}) "
                   "most of the time: it is waiting on its workers' forwarding or on other "
                   "trainers; compare the trainers' rates in `feedmux top`")


class WaitShare:
    """The fraction of wall time the training loop waited for data between two reports.

    The loader feeds it every wait that ended in a data message (:meth:`waited`,
    through :meth:`InputDiagnosis.message`); each heartbeat takes a report
    (:meth:`report`), which counts a wait still under way up to its time, so a
    trainer that has waited for the whole span says 1.0 while it still waits.
    The wait for the first data (connecting, a server warming up) is not the
    loop's: the first span starts at the first data.

    Examples
    --------
    >>> share = WaitShare()
    >>> share.report(now=0.5) is None  # no data yet
    True
    >>> share.waited(waited_from=0.0, now=1.0)  # the first data: the span starts
    >>> share.waited(waited_from=1.5, now=1.75)
    >>> share.report(now=2.0)
    0.25
    >>> share.report(now=3.0, waiting_from=2.5)  # waiting since 2.5, still at 3.0
    0.5
    >>> share.waited(waited_from=2.5, now=3.5)  # that wait ends: only 3.0 .. 3.5 is new
    >>> share.report(now=4.0)
    0.5
    """

    def __init__(self) -> None:
        self._since: float | None = None  # the start of the span being measured
        self._waited = 0.0
        self._counted_to = -math.inf  # waits before this were in an earlier report

    def waited(self, waited_from: float, now: float) -> None:
        """The loop waited from ``waited_from`` until a data message came at ``now``."""
        if self._since is None:
            self._since = self._counted_to = now
            return
        self._waited += max(0.0, now - max(waited_from, self._counted_to))

    def report(self, now: float, waiting_from: float | None = None) -> float | None:
        """The fraction since the last report (None before the first data, or a span under
        :data:`MIN_SHARE_SPAN`); ``waiting_from``: the start of a wait still under way."""
        since = self._since
        if since is None or now - since < MIN_SHARE_SPAN:
            return None
        waited = self._waited
        if waiting_from is not None:
            waited += max(0.0, now - max(waiting_from, self._counted_to))
            self._counted_to = now
        self._since, self._waited = now, 0.0
        return min(1.0, waited / (now - since))


class _LinkFigures:
    """The last statistics answer of one server and the load between the last two."""

    def __init__(self) -> None:
        self.previous: tuple[float, float, float] | None = None
        self.load: ServerLoad | None = None

    def take(self, values: Mapping[str, Any]) -> None:
        try:
            uptime = float(values["uptime_s"])
            busy = float(values["sampler_busy_seconds"])
            blocked = float(values["send_blocked_seconds"])
            workers = max(1, int(values.get("workers") or 1))
        except (KeyError, TypeError, ValueError):
            return  # an older server without these figures: nothing to say about it
        if self.previous is not None and uptime - self.previous[0] < MIN_FIGURES_SPAN:
            # Two answers close together (a one-process server answers between two
            # draws: the trainer's first ask and its early one can meet in one batch)
            # say nothing of its load: the first stays the base of the next answer.
            return
        if self.previous is not None:
            elapsed = uptime - self.previous[0]
            self.load = ServerLoad(
                busy=min(1.0, (busy - self.previous[1]) / (elapsed * workers)),
                blocked=min(1.0, (blocked - self.previous[2]) / elapsed),
            )
        self.previous = (uptime, busy, blocked)


class InputDiagnosis:
    """Accounts the trainer's waiting per window and says why it waits.

    Parameters
    ----------
    links : int
        How many servers the loader talks to.
    window : float or None
        Seconds over which the wait fraction is measured and judged (the
        first window: :data:`FIRST_WINDOW` at most); None turns the diagnosis
        off (it then asks nothing and reports None).
    threshold : float
        A window in which the trainer waited more than this fraction of the
        time gets a warning with the likely cause.

    Examples
    --------
    >>> diagnosis = InputDiagnosis(links=1, window=10.0, threshold=0.2)
    >>> diagnosis.message(now=0.0, waited_from=0.0, samples=10)  # the window starts: ask
    True
    >>> diagnosis.server_stats(0, {"uptime_s": 5.0, "sampler_busy_seconds": 0.0,
    ...                            "send_blocked_seconds": 0.0}, now=0.1)
    >>> diagnosis.message(now=10.0, waited_from=4.0, samples=10)  # window over: ask again
    True
    >>> diagnosis.server_stats(0, {"uptime_s": 15.0, "sampler_busy_seconds": 9.9,
    ...                            "send_blocked_seconds": 0.0}, now=10.1)[:60]
    'waited for data 60% of the last 10 s; the server is sampling'
    >>> diagnosis.stats()["wait_fraction"], diagnosis.stats()["samples_per_second"]
    (0.6, 2.0)
    """

    def __init__(self, links: int, window: float | None = 60.0,
                 threshold: float = 0.25) -> None:
        self.window = window
        self.threshold = threshold
        self._links = [_LinkFigures() for _ in range(links)]
        self._started: float | None = None
        self._waited = 0.0
        self._samples = 0
        # The last complete window: (wait fraction, samples/s, its length in seconds).
        self._last: tuple[float, float, float] | None = None
        self._pending: tuple[float, float] | None = None  # a verdict awaiting server figures
        self._asked_early = False
        #: The share of the time between two heartbeats the loop waited (they carry it,
        #: also with the diagnosis off: ``--workers auto`` servers grow on it).
        self.share = WaitShare()

    def message(self, now: float, waited_from: float, samples: int) -> bool:
        """A data message of ``samples`` samples arrived at ``now``; ``next()`` waited
        for it from ``waited_from``.

        Returns True when the servers should be asked for their statistics now.
        """
        self.share.waited(waited_from, now)
        if self.window is None:
            return False
        waited = now - waited_from
        if self._started is None:
            # The wait for the very first message (connecting, a server warming up) is
            # not the training loop's: windows start at the first data.
            self._started = now
            self._samples = samples
            return True
        self._waited += waited
        self._samples += samples
        elapsed = now - self._started
        if elapsed < (self.window if self._last is not None else
                      min(self.window, FIRST_WINDOW)):
            # Early in the first window: a second answer gives the servers' load so far.
            early = self._last is None and not self._asked_early and elapsed >= EARLY_FIGURES
            self._asked_early = self._asked_early or early
            return early
        fraction = min(1.0, self._waited / elapsed)
        self._last = (fraction, self._samples / elapsed, elapsed)
        if self._pending is not None and not self._answered():
            self._say(*self._pending, loads=[])  # no server ever answered: say it without
        # A verdict still waiting for a load (the answers so far came too close together)
        # gives way to this window's: the next answer far enough apart completes it.
        self._pending = (fraction, elapsed) if fraction > self.threshold else None
        self._started, self._waited, self._samples = now, 0.0, 0
        return True

    def answer(self, link: int, message: Message, now: float) -> bool:
        """Take ``message`` from the control endpoint of ``link`` if it is a statistics
        answer (True), else leave it to the link state (False)."""
        if not isinstance(message, Stats):
            return False
        self.server_stats(link, message.values, now)
        return True

    def server_stats(self, link: int, values: Mapping[str, Any], now: float) -> str | None:
        """A statistics answer from the server of ``link``; returns the verdict it completed."""
        self._links[link].take(values)
        if self._pending is None:
            return None
        loads = self._loads()
        if len(loads) < len(self._links):
            return None  # wait for every server's figures (or the next window)
        pending, self._pending = self._pending, None
        return self._say(*pending, loads=loads)

    def _answered(self) -> bool:
        """Whether any server has answered a statistics ask (its figures are a base)."""
        return any(figures.previous is not None for figures in self._links)

    def _loads(self) -> list[ServerLoad]:
        return [figures.load for figures in self._links if figures.load is not None]

    def _say(self, fraction: float, window: float, loads: list[ServerLoad]) -> str:
        text = explain(fraction, round(window), loads)
        log.warning("%s", text)
        return text

    def stats(self, now: float | None = None) -> dict[str, float | None]:
        """The last complete window's figures and the servers' latest load (None: not yet).

        Before the first window is complete, the figures so far at ``now`` (from
        :data:`EARLY_FIGURES` seconds after the first data on).
        """
        loads = self._loads()
        fraction, rate, window = self._last if self._last is not None else (None, None, None)
        started = self._started
        if self._last is None and started is not None and now is not None and (
                now - started >= EARLY_FIGURES):
            window = now - started
            fraction, rate = min(1.0, self._waited / window), self._samples / window
        return {
            "samples_per_second": None if rate is None else round(rate, 3),
            "wait_fraction": None if fraction is None else round(fraction, 4),
            "window_s": window,
            "server_busy_fraction": (round(max(load.busy for load in loads), 4)
                                     if loads else None),
            "server_blocked_fraction": (round(max(load.blocked for load in loads), 4)
                                        if loads else None),
        }
