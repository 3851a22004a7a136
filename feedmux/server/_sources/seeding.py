"""The server's seed and the per-epoch reseeding of every sampling process.

This module owns where a server's seed comes from (``seed=`` / ``--seed``, else
the mux's integer ``random_state``, else fresh entropy drawn once per run) and
what each sampling process does at the start of every epoch: publish its
:class:`~feedmux._worker_info.WorkerInfo` and reseed Python's ``random``,
numpy's global random state and, when user code has already imported it,
torch's, from (seed, worker index, epoch). Seeds are derived with numpy's
``SeedSequence`` spawn keys, so no two (worker, epoch) pairs share a random
state and none is a neighbour of another by integer arithmetic. It must never
import torch itself, and never touch a mux's own generators (a mux derives
those from its own ``random_state``).
"""

from __future__ import annotations

import logging
import random
import sys
from typing import Any

# numpy 2 loads numpy.random at its first use: here, before the workers fork, or each
# would import it again at its first epoch (about 40 ms of CPU a worker).
import numpy as np
import numpy.random

from feedmux._worker_info import WorkerInfo, set_worker_info
from feedmux.sampling.mux import BaseMux
from feedmux.sampling.streamer import Streamer

__all__ = ["FRESH_ENTROPY", "EpochSeeder", "reseed_globals", "resolve_seed"]

#: The origin :func:`resolve_seed` gives a seed drawn for this run only: a run that
#: asked for no repeatable sequence (the server then merges workers in arrival order).
FRESH_ENTROPY = "fresh entropy"

log = logging.getLogger("feedmux.server")


def resolve_seed(seed: int | None, streamer: Any) -> tuple[int, str]:
    """The run's seed and where it came from, for the log.

    An explicit ``seed`` wins; otherwise the integer ``random_state`` of the
    top-level mux (a mux seeded with a Generator has none); otherwise 128
    bits of fresh entropy, so an unseeded run differs from the last one but
    can be repeated by passing the logged seed.

    Examples
    --------
    >>> from feedmux.sampling import StochasticMux
    >>> resolve_seed(5, None)
    (5, 'seed option')
    >>> resolve_seed(None, StochasticMux(["ab"], 1, rate=None, random_state=3))
    (3, "the mux's random_state")
    >>> resolve_seed(None, Streamer("ab"))[1]
    'fresh entropy'
    """
    if seed is not None:
        return int(seed), "seed option"
    mux_seed = _mux_seed(streamer)
    if mux_seed is not None:
        return mux_seed, "the mux's random_state"
    entropy = np.random.SeedSequence().entropy
    assert isinstance(entropy, int)  # drawn from the OS when not given
    return entropy, FRESH_ENTROPY


def _mux_seed(streamer: Any) -> int | None:
    # Streamer(mux) is the mux (as for sharding): look through the wrapper.
    while (type(streamer) is Streamer and isinstance(streamer.source, Streamer)
           and not streamer.args and not streamer.kwargs):
        streamer = streamer.source
    return streamer.seed if isinstance(streamer, BaseMux) else None


def reseed_globals(seed: int, worker: int, epoch: int) -> None:
    """Reseed ``random``, numpy's global state and torch (if imported) for (worker, epoch).

    Examples
    --------
    >>> reseed_globals(1, 0, 1); a = np.random.random(), random.random()
    >>> reseed_globals(1, 0, 1); a == (np.random.random(), random.random())
    True
    >>> reseed_globals(1, 1, 1); a == (np.random.random(), random.random())
    False
    """
    python_seq, numpy_seq, torch_seq = np.random.SeedSequence(
        seed, spawn_key=(worker, epoch)
    ).spawn(3)
    random.seed(int.from_bytes(python_seq.generate_state(4).tobytes(), "little"))
    np.random.seed(numpy_seq.generate_state(4))
    torch = sys.modules.get("torch")
    if torch is not None:  # only when user code uses it: importing torch costs seconds
        torch.manual_seed(int(torch_seq.generate_state(1, np.uint64)[0]))


class EpochSeeder:
    """The epoch-start hook of one sampling process (an ``on_epoch_start`` callback).

    Parameters
    ----------
    seed : int
        The run's seed (:func:`resolve_seed`).
    worker : int
        This process's index.
    num_workers : int
        How many sampling processes the server runs.

    Examples
    --------
    >>> from feedmux._worker_info import worker_info
    >>> seeder = EpochSeeder(seed=7, worker=1, num_workers=2)
    >>> seeder(3); worker_info()
    WorkerInfo(id=1, num_workers=2, seed=7, epoch=3)
    >>> seeder.clear(); worker_info() is None
    True
    """

    def __init__(self, seed: int, worker: int, num_workers: int) -> None:
        self.seed = seed
        self.worker = worker
        self.num_workers = num_workers

    def __call__(self, epoch: int) -> None:
        set_worker_info(WorkerInfo(self.worker, self.num_workers, self.seed, epoch))
        reseed_globals(self.seed, self.worker, epoch)

    @staticmethod
    def clear() -> None:
        """Leave the sampling role: :func:`feedmux.worker_info` returns None again."""
        set_worker_info(None)
