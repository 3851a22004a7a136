"""Where a RemoteLoader was made, and how a copy of it starts over in another process.

This module owns a loader's lineage: the arguments it was made with (what a
pickled copy is rebuilt from), the process it belongs to (a forked copy, from
``os.fork`` or a torch DataLoader worker, notices that it runs in another one),
and the state it restored (which the copy restores again). A copy in another
process starts over from the arguments: a fresh client id unless one was given,
and a context and sockets of its own; the parent's are never touched, since a
ZeroMQ context must never cross a fork. It also owns the one bridge to torch
that needs no torch: when torch is already loaded, a RemoteLoader is registered
as a virtual ``IterableDataset``, so that torch's DataLoader iterates it instead
of indexing it. It never imports torch or zmq and never opens a socket.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from feedmux.errors import ConfigurationError

__all__ = ["Origin", "not_a_map", "register_with_torch"]

#: Forks on the way to this process (one more in each child of ``os.fork``, also the
#: forks of multiprocessing and of torch's DataLoader workers). A loader asks whether it
#: moved before every receive: comparing this count is a read, where ``os.getpid()``
#: is a system call per data message.
_forks = [0]


def _forked() -> None:
    _forks[0] += 1


os.register_at_fork(after_in_child=_forked)


class Origin:
    """The arguments of a loader, its process, and the state it restored.

    Examples
    --------
    >>> origin = Origin({"address": "tcp://127.0.0.1:5555", "timeout": 1.0})
    >>> origin.moved()
    False
    >>> origin.fresh(rank=None)
    ('tcp://127.0.0.1:5555', {'timeout': 1.0})
    """

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments
        self.pid = os.getpid()
        self._fork = _forks[0]
        #: What ``load_state_dict`` restored, for a copy to restore again.
        self.loaded: dict[str, Any] | None = None

    def moved(self) -> bool:
        """Whether this runs in another process than the loader was made in (a fork of
        the interpreter's: ``os.fork``, and what is built on it)."""
        return self._fork != _forks[0]

    def fresh(self, rank: int | None) -> tuple[str, dict[str, Any]]:
        """The address and keyword arguments to make the loader again in this process.

        A ranked loader iterated by several workers of one torch DataLoader is
        refused: they would all claim the same rank.
        """
        workers = torch_workers()
        if rank is not None and workers > 1:
            raise ConfigurationError(
                f"expected one process per rank, got a ranked RemoteLoader (rank {rank}) "
                f"iterated by {workers} DataLoader workers: they cannot all hold the rank. "
                "Use feedmux.torch.RemoteDataset(address, rank=..., world_size=...), which "
                "gives each worker its share of the rank")
        arguments = dict(self.arguments)
        return arguments.pop("address"), arguments

    def follow(self, loader: Any) -> None:
        """If this runs in another process than ``loader`` was made in (a forked copy, at
        its first use in the child), make it again from its arguments and restore the
        state it had restored."""
        if not self.moved():
            return
        address, arguments = self.fresh(loader.rank)
        type(loader).__init__(loader, address, **arguments)
        if self.loaded is not None:
            loader.load_state_dict(self.loaded)


def torch_workers() -> int:
    """The workers of the torch DataLoader this process is a worker of (0: none)."""
    data = sys.modules.get("torch.utils.data")
    info = None if data is None else data.get_worker_info()
    return 0 if info is None else int(info.num_workers)


def register_with_torch(cls: type) -> None:
    """If torch is loaded, make ``cls`` a virtual ``torch.utils.data.IterableDataset``.

    ``IterableDataset`` is an ABC, so a registration is all it takes: torch's
    DataLoader then iterates the loader (each worker a forked copy, a trainer of
    its own) instead of taking it for a map-style dataset. A process without
    torch loaded skips it; feedmux never imports torch for this.
    """
    data = sys.modules.get("torch.utils.data")
    if data is not None and not issubclass(cls, data.IterableDataset):
        data.IterableDataset.register(cls)


def not_a_map(index: object) -> str:
    """The error of indexing a loader (a DataLoader that took it for a map-style dataset)."""
    return ("RemoteLoader is a stream, not a map-style dataset: it cannot be indexed "
            f"(got [{index!r}]). Under torch's DataLoader use "
            "feedmux.torch.RemoteDataset(address, ...) with batch_size=None")
