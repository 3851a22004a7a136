"""What a server reports: the control core's statistics map and its progress line.

This module owns the shape of the figures ``feedmux stats``, ``feedmux top``
and the Prometheus endpoint read (one flat map: ``trainer.<id>.<name>`` keys
for per-trainer figures) and the epoch progress of the throughput log line. It
only reads the core's counters and copies of its containers, because the
metrics thread calls it while the server's thread runs: it must never change
state, log or decide anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from feedmux.protocol import PROTOCOL_VERSION
from feedmux.server._batches import BatchRequest
from feedmux.server._ranks import RankTable, RankTables
from feedmux.server._retention import RankRetention
from feedmux.server.config import ServerConfig

__all__ = ["Reporting", "Stat", "core_stats", "progress_line"]

#: One statistics value.
Stat = int | float | str | None


class _TrainerFigures(Protocol):
    client_id: str
    last_seen: float
    received_messages: int
    rank: int


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
    rate: float
    finished: bool
    extra_stats: Callable[[], dict[str, Stat]] | None
    ranks: RankTable
    retention: RankRetention
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
        "samples_per_second": round(core.rate or core.samples_sent / max(uptime, 1e-9), 1),
        "connected_trainers": core.connected_trainers(now),
        "workers": core.config.workers,
        "uptime_s": round(uptime, 3),
        "finished": int(core.finished),
        **(core.extra_stats() if core.extra_stats is not None else {}),
        **_rank_stats(core),
        **_batch_stats(core.tables.batches),
        **_trainer_stats(core, now, trainer_timeout),
    }


def _batch_stats(batches: BatchRequest) -> dict[str, Stat]:
    """Batches built for the trainers (none when they asked for single samples)."""
    if not batches.batch_size:
        return {}
    return {"batch_size": batches.batch_size, "drop_last": int(batches.drop_last),
            "batch_samples_dropped": batches.dropped}


def _rank_stats(core: Reporting) -> dict[str, Stat]:
    """Ranked trainers' figures (none for free trainers): messages kept for a restart."""
    if not core.ranks.ranked:
        return {}
    return {
        "world_size": core.ranks.world_size or 0,
        "rank_messages_kept": core.retention.held(),
        "rank_messages_resent": core.retention.replayed_messages,
    }


def _trainer_stats(core: Reporting, now: float, timeout: float) -> dict[str, Stat]:
    """Each connected trainer's figures as ``trainer.<client id>.<name>`` (stats are flat)."""
    stats: dict[str, Stat] = {}
    # A copy (one C call under the GIL): the metrics thread reads the stats while
    # the server's thread may add or forget trainers.
    for trainer in list(core.trainers.values()):
        if now - trainer.last_seen <= timeout:
            stats[f"trainer.{trainer.client_id}.received_messages"] = trainer.received_messages
            if trainer.rank >= 0:
                stats[f"trainer.{trainer.client_id}.rank"] = trainer.rank
    return stats


def progress_line(epoch: int, position: int, size: int | None, rate: float) -> str:
    """The current epoch's progress and time to its end, once the epoch size is known.

    Examples
    --------
    >>> progress_line(2, 250, 1000, 50.0)
    '; epoch 2 25% (250/1000), ETA 15 s'
    >>> progress_line(1, 10, None, 50.0)
    ''
    """
    if not size:
        return ""
    done = min(position, size)
    eta = f"{(size - done) / rate:.0f} s" if rate > 0 else "unknown"
    return f"; epoch {epoch} {100 * done / size:.0f}% ({done}/{size}), ETA {eta}"
