"""What a server reports: the control core's statistics map and its progress line.

This module owns the shape of the figures ``feedmux stats``, ``feedmux top``
and the Prometheus endpoint read (one flat map: ``trainer.<id>.<name>`` keys
for per-trainer figures), its pages (a reply over control must fit in one
control frame, whatever the number of trainers or groups: :func:`stats_page`)
and the epoch progress of the throughput log line. It
only reads the core's counters and copies of its containers, because the
metrics thread calls it while the server's thread runs: it must never change
state, log or decide anything.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import Protocol

from feedmux.protocol import PROTOCOL_VERSION, STATS_NEXT_PAGE, StatValue, stats_order
from feedmux.server._control.ranks import RankTable, RankTables
from feedmux.server._control.rates import RateWindow, eta_seconds
from feedmux.server._control.waitshare import fresh_waits, mean_wait
from feedmux.server._delivery.batches import BatchRequest
from feedmux.server._delivery.ledger import Ledger
from feedmux.server.config import ServerConfig

__all__ = ["STATS_PAGE_BYTES", "Reporting", "Stat", "core_stats", "progress_line",
           "stats_page"]

#: One statistics value (what a :class:`~feedmux.protocol.Stats` map holds).
Stat = StatValue
#: Most bytes of figures in one statistics reply: well inside the 64 KiB control frame
#: (``CONTROL_FRAME_BYTES``) with the header around them.
STATS_PAGE_BYTES = 48 * 1024


class _TrainerFigures(Protocol):
    client_id: str
    last_seen: float
    received_messages: int
    rank: int
    wait: tuple[float, float] | None
    rates: RateWindow


class Reporting(Protocol):
    """What the statistics read of a control core (structural: no import of the core)."""

    config: ServerConfig
    pid: int
    started: float
    samples_sent: int
    messages_sent: int
    epoch: int
    epochs_completed: int
    epoch_size: int | None
    epoch_position: int
    reconnects: int
    unreachable_sends: int
    rate: float | None
    count_rate: float | None
    finished: bool
    extra_stats: Callable[[], dict[str, Stat]] | None
    ranks: RankTable
    retention: Ledger
    tables: RankTables

    @property
    def trainers(self) -> Mapping[bytes, _TrainerFigures]: ...

    def connected_trainers(self, now: float) -> int: ...


def core_stats(core: Reporting, now: float, trainer_timeout: float) -> dict[str, Stat]:
    """The statistics of ``core`` at ``now`` (its extra figures, ranks and trainers included)."""
    uptime = now - core.started
    return {
        "server_id": core.config.server_id,
        "protocol_version": PROTOCOL_VERSION,
        "pid": core.pid,
        "samples_sent": core.samples_sent,
        "messages_sent": core.messages_sent,
        "epoch": core.epoch,
        "epochs_completed": core.epochs_completed,
        "epoch_size": core.epoch_size,
        "epoch_position": core.epoch_position,
        "reconnects": core.reconnects,
        "unreachable_sends": core.unreachable_sends,
        # Over the last seconds (rates.WINDOW), None before there is a rate: a mean since
        # the start counts the wait for trainers and says a wrong ETA.
        "samples_per_second": None if core.rate is None else round(core.rate, 1),
        "eta_s": _rounded(eta_seconds(core.epoch_position, core.epoch_size, core.rate)),
        **_count_stats(core),
        "connected_trainers": core.connected_trainers(now),
        "workers": core.config.worker_range.maximum,
        "uptime_s": round(uptime, 3),
        "finished": int(core.finished),
        **(core.extra_stats() if core.extra_stats is not None else {}),
        **_rank_stats(core),
        **_batch_stats(core.tables.batches),
        **_trainer_stats(core, now, trainer_timeout),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _count_stats(core: Reporting) -> dict[str, Stat]:
    """The rate in the count field's unit (``--count-field``; its sum is ``counted``)."""
    if not core.config.count_field:
        return {}
    return {"count_field": core.config.count_field,
            "counted_per_second": _rounded(core.count_rate)}


def _wait_stats(waits: Mapping[str, float]) -> dict[str, Stat]:
    """The trainers' reported wait for data: the mean of the fresh reports (what ``--workers
    auto`` decides on), how many trainers it covers, and the most any of them waited."""
    mean = mean_wait(waits)
    if mean is None:
        return {"trainers_wait_fraction": None, "trainers_reporting_wait": 0,
                "trainers_wait_fraction_max": None}
    return {"trainers_wait_fraction": round(mean, 4), "trainers_reporting_wait": len(waits),
            "trainers_wait_fraction_max": round(max(waits.values()), 4)}


def _batch_stats(batches: BatchRequest) -> dict[str, Stat]:
    """Batches built for the trainers (none when they asked for single samples)."""
    if not batches.batch_size:
        return {}
    return {"batch_size": batches.batch_size, "drop_last": int(batches.drop_last),
            "batch_samples_dropped": batches.dropped, **batches.bucket_stats()}


def _rank_stats(core: Reporting) -> dict[str, Stat]:
    """Ranked trainers' figures (none for free trainers): messages kept for a restart."""
    if not core.ranks.ranked:
        return {}
    return {
        "world_size": core.ranks.world_size or 0,
        "rank_messages_kept": core.retention.held(),
        "rank_messages_resent": core.retention.resent_messages,
    }


def _trainer_stats(core: Reporting, now: float, timeout: float) -> dict[str, Stat]:
    """Each connected trainer's figures as ``trainer.<client id>.<name>`` (stats are flat)."""
    # A copy (one C call under the GIL): the metrics thread reads the stats while
    # the server's thread may add or forget trainers.
    trainers = list(core.trainers.values())
    waits = fresh_waits(trainers, now)
    stats = _wait_stats(waits)
    # A trainer counts messages; a message holds this many samples on average.
    per_message = core.samples_sent / core.messages_sent if core.messages_sent else 0.0
    for trainer in trainers:
        if now - trainer.last_seen <= timeout:
            stats[f"trainer.{trainer.client_id}.received_messages"] = trainer.received_messages
            rate = trainer.rates.rate()
            stats[f"trainer.{trainer.client_id}.samples_per_second"] = (
                None if rate is None else round(rate * per_message, 1))
            if trainer.rank >= 0:
                stats[f"trainer.{trainer.client_id}.rank"] = trainer.rank
            if trainer.client_id in waits:
                stats[f"trainer.{trainer.client_id}.wait_fraction"] = round(
                    waits[trainer.client_id], 4)
    return stats


def _packed_bytes(key: str, value: Stat) -> int:
    """What an entry takes in the reply's msgpack map (at most: str headers of 5 bytes)."""
    size = len(key.encode()) + 5
    if isinstance(value, str):
        return size + len(value.encode()) + 5
    return size + (1 if value is None or isinstance(value, bool) else 9)


def stats_page(stats: Mapping[str, Stat], after: str = "",
               most_bytes: int = STATS_PAGE_BYTES) -> dict[str, Stat]:
    """The entries of ``stats`` that come after key ``after`` and fit in ``most_bytes``.

    The server-wide figures come first, then the per-trainer, per-worker and
    per-group ones by key, so a page boundary is a key and a trainer that
    comes or goes between two requests moves no other entry to another page.
    :data:`~feedmux.protocol.STATS_NEXT_PAGE` names the last key of a page that is not the last (the
    ``after`` of the next request); ``None`` on the last page. Every page
    holds at least one entry, so paging always ends.

    Examples
    --------
    >>> stats = {"pid": 7, "trainer.a.rank": 0, "trainer.b.rank": 1, "epoch": 2}
    >>> first = stats_page(stats, most_bytes=60)
    >>> first
    {'epoch': 2, 'pid': 7, 'stats_next_after': 'pid'}
    >>> stats_page(stats, after="pid", most_bytes=60)
    {'trainer.a.rank': 0, 'trainer.b.rank': 1, 'stats_next_after': None}
    """
    ordered = sorted(stats, key=stats_order)
    start = bisect.bisect_right(ordered, stats_order(after), key=stats_order) if after else 0
    page: dict[str, Stat] = {}
    used = 0
    for key in ordered[start:]:
        size = _packed_bytes(key, stats[key])
        if page and used + size > most_bytes:
            page[STATS_NEXT_PAGE] = next(reversed(page))
            return page
        page[key] = stats[key]
        used += size
    page[STATS_NEXT_PAGE] = None
    return page


def progress_line(epoch: int, position: int, size: int | None, rate: float | None) -> str:
    """The current epoch's progress and time to its end, once the epoch size is known
    (an ETA only once there is a recent rate).

    Examples
    --------
    >>> progress_line(2, 250, 1000, 50.0)
    '; epoch 2 25% (250/1000), ETA 15 s'
    >>> progress_line(2, 250, 1000, None)
    '; epoch 2 25% (250/1000)'
    >>> progress_line(1, 10, None, 50.0)
    ''
    """
    if not size:
        return ""
    done = min(position, size)
    eta = eta_seconds(done, size, rate)
    shown = "" if eta is None else f", ETA {eta:.0f} s"
    return f"; epoch {epoch} {100 * done / size:.0f}% ({done}/{size}){shown}"
