"""Which sampling process this is: the value behind :func:`feedmux.worker_info`.

This module owns one module-level value, the :class:`WorkerInfo` of the current
sampling process, that the serving code sets at the start of every epoch and
that user code (a streamer's generator, an augmentation) reads, like torch's
``get_worker_info``. It must stay a leaf: it imports nothing of feedmux (so user
code reads it without loading zmq), and the pure :mod:`feedmux.sampling` package
must never import it nor be set by it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerInfo", "set_worker_info", "worker_info"]


@dataclass(frozen=True)
class WorkerInfo:
    """What a sampling process knows about itself during an epoch.

    Attributes
    ----------
    id : int
        The worker index, ``0 <= id < num_workers`` (0 in a one-process server).
    num_workers : int
        How many sampling processes the server runs (``--workers``).
    seed : int
        The server's seed (``--seed``, the mux's integer ``random_state``, or
        fresh entropy drawn when the server started): the same in every worker.
    epoch : int
        The epoch being sampled (1-based).

    Examples
    --------
    >>> WorkerInfo(id=1, num_workers=2, seed=7, epoch=3)
    WorkerInfo(id=1, num_workers=2, seed=7, epoch=3)
    """

    id: int
    num_workers: int
    seed: int
    epoch: int


_current: WorkerInfo | None = None


def worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of this sampling process, or None outside one.

    Set by the server in each sampling process (the server itself with one
    worker, each forked worker with ``--workers N``) at the start of every
    epoch, before the streamer's first item of that epoch is drawn.

    Examples
    --------
    >>> worker_info() is None  # not a sampling process
    True
    """
    return _current


def set_worker_info(info: WorkerInfo | None) -> None:
    """Set (or clear, with None) this process's :class:`WorkerInfo`; serving code only."""
    global _current
    _current = info
