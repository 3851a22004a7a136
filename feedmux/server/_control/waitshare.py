"""The trainers' own wait for data, as their heartbeats report it: each one's, and the mean.

Each trainer's periodic heartbeat carries the share of the time since its last
one that its loop waited for data (``Heartbeat.wait_fraction``); the control
core keeps the latest with the time it came (``_Trainer.wait``). This module
reads those reports: which still count (:data:`REPORT_AGE`) and the figure
``--workers auto`` decides on (:func:`trainers_wait`), the mean over the
trainers heard lately (:func:`mean_wait` says why the mean). It is pure
(``now`` is passed in), reads only what it is given (the metrics thread calls
it too) and must never change a trainer's record or decide a worker count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from feedmux._plumbing.sockets import HEARTBEAT_INTERVAL

__all__ = ["REPORT_AGE", "Reporter", "fresh_waits", "mean_wait", "trainers_wait"]

#: A report older than this no longer counts: its trainer is gone, or silent (in a long
#: step, not reading, or an old trainer whose heartbeats carry no wait). Three heartbeat
#: intervals, as for a trainer to count as connected: one late or lost beat drops no one.
REPORT_AGE = 3 * HEARTBEAT_INTERVAL


class Reporter(Protocol):
    """What is read of a trainer's record (structural: no import of the core)."""

    client_id: str
    #: Its latest reported wait fraction and when it came; None: it never reported one.
    wait: tuple[float, float] | None


def fresh_waits(trainers: Iterable[Reporter], now: float) -> dict[str, float]:
    """Each trainer's latest wait fraction at ``now``, by client id, if it still counts.

    Examples
    --------
    >>> from types import SimpleNamespace as T
    >>> fresh_waits([T(client_id="a", wait=(0.4, 9.0)), T(client_id="b", wait=(0.9, 5.0)),
    ...              T(client_id="old", wait=None)], now=10.0)
    {'a': 0.4}
    """
    waits: dict[str, float] = {}
    for trainer in list(trainers):  # a copy: the metrics thread reads it too
        report = trainer.wait
        if report is not None and now - report[1] <= REPORT_AGE:
            waits[trainer.client_id] = report[0]
    return waits


def trainers_wait(trainers: Iterable[Reporter], now: float) -> float | None:
    """The trainers' wait at ``now`` for the autoscaler: :func:`mean_wait` of the fresh
    reports.

    Examples
    --------
    >>> from types import SimpleNamespace as T
    >>> trainers_wait([T(client_id="a", wait=(0.4, 9.5)), T(client_id="b", wait=(0.1, 9.8))],
    ...               now=10.0)
    0.25
    >>> trainers_wait([T(client_id="gone", wait=(0.8, 1.0))], now=10.0) is None
    True
    """
    return mean_wait(fresh_waits(trainers, now))


def mean_wait(waits: Mapping[str, float]) -> float | None:
    """The trainers' wait as one figure: the unweighted mean of their reports.

    The mean over trainers (not weighted by their samples) is the share of the
    trainers' combined time lost to waiting for data: every report covers about
    the same span (a heartbeat interval), so each trainer's time counts alike,
    and a fast trainer does not outweigh a slow one that waits. None when no
    trainer's report counts (older trainers that send none, or all silent):
    the decision then reads the server's own waiting for trainers instead.

    Examples
    --------
    >>> mean_wait({"a": 0.5, "b": 0.0}), mean_wait({}) is None
    (0.25, True)
    """
    return sum(waits.values()) / len(waits) if waits else None
