"""feedmux under torch: :class:`RemoteDataset`, an ``IterableDataset`` over a feedmux server.

This module is the only part of feedmux that imports torch (``pip install
feedmux[torch]``); nothing else imports it, so feedmux itself never needs torch.
It owns the glue between a torch ``DataLoader`` and a
:class:`~feedmux.client.remote.RemoteLoader`: the loader is built lazily in the
process that iterates the dataset (the main process, or each DataLoader worker),
each worker becomes a trainer of its own (its own client id, and with a rank a
share of it, see :func:`worker_share`), and arrays become tensors with no copy
(so the tensors a served ``Dataset`` returned, which travel as arrays, arrive as
tensors again).
It never decides anything about delivery, resume or the wire: the loader and the
server do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from feedmux.client.remote import RemoteLoader, SampleMeta, deprecated_loader_reliable
from feedmux.errors import ConfigurationError, StreamValueError

__all__ = ["Position", "RemoteDataset", "Share", "Tracked", "to_tensors", "worker_share"]


class Share(NamedTuple):
    """What one process takes of the stream: ``rank`` (None: a free trainer) of
    ``world_size`` trainers, and a suffix that makes a given client id its own."""

    rank: int | None
    world_size: int
    suffix: str


def worker_share(rank: int | None, world_size: int, worker: int, workers: int) -> Share:
    """The share of DataLoader worker ``worker`` (of ``workers``) of a trainer.

    A free trainer's workers are free trainers too. A rank ``r`` of
    ``world_size`` ``W`` served through ``N`` workers becomes the ranks
    ``w * W + r`` (worker ``w``) of a job of ``W * N``: the server deals
    position ``p`` to rank ``p % (W * N)``, so worker ``w`` gets the positions
    ``r + w*W + k*W*N`` and the DataLoader's in-order round robin over its
    workers (worker 0's first sample, worker 1's first, ..., worker 0's second)
    yields ``r, r + W, r + 2W, ...``: the positions, in the order, that rank
    ``r`` alone would get. Every rank gets ``N`` times the steps of one of its
    workers, the same on every rank, so DDP's steps stay equal.

    Examples
    --------
    >>> [worker_share(1, 2, w, 3).rank for w in range(3)]
    [1, 3, 5]
    >>> worker_share(None, 2, 1, 3)
    Share(rank=None, world_size=6, suffix='-w1')
    >>> worker_share(0, 1, 0, 0)  # the main process (num_workers=0)
    Share(rank=0, world_size=1, suffix='')
    """
    if workers <= 1:
        return Share(rank, world_size, "")
    return Share(None if rank is None else worker * world_size + rank,
                 world_size * workers, f"-w{worker}")


def to_tensors(value: Any) -> Any:
    """Numeric numpy arrays (and numpy scalars) of a sample as tensors, sharing memory.

    ``torch.from_numpy`` makes no copy: the tensor is a view of the received
    array. Dicts, lists and tuples (named ones too) keep their shape; strings,
    bytes, Python numbers and non-numeric arrays stay as they are. A read-only
    array (rare: feedmux decodes into writable buffers) is copied, since torch
    tensors are writable.

    Examples
    --------
    >>> sample = to_tensors({"x": np.arange(3, dtype=np.float32), "id": np.int64(7), "k": "a"})
    >>> sample["x"], sample["id"], sample["k"]
    (tensor([0., 1., 2.]), tensor(7), 'a')
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            return value
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    if isinstance(value, np.generic):
        return to_tensors(np.asarray(value)) if value.dtype.kind in "biufc" else value
    if isinstance(value, dict):
        return type(value)({key: to_tensors(item) for key, item in value.items()})
    if isinstance(value, tuple):
        items = [to_tensors(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [to_tensors(item) for item in value]
    return value


class RemoteDataset(IterableDataset[Any]):
    """A torch ``IterableDataset`` of the samples a feedmux server pushes.

    Parameters
    ----------
    address : str or sequence of str
        The server's data endpoint(s), as for :class:`~feedmux.RemoteLoader`.
    rank, world_size : int
        This trainer's rank in a data-parallel job (torch DDP) of ``world_size``
        ranks; None: a free trainer. Under ``num_workers=N`` each worker takes
        its share of the rank (:func:`worker_share`).
    tensors : bool
        Numeric arrays become tensors (:func:`to_tensors`, no copy); False
        yields what the loader yields.
    whole_stream : bool
        False: each pass over the dataset (each ``iter(DataLoader)``, a
        Lightning epoch) is one server epoch (``RemoteLoader.iter_epoch``).
        True: a pass is the whole stream, until the server's last epoch.
    **loader_options
        Any other :class:`~feedmux.RemoteLoader` argument (``timeout``,
        ``hwm``, ``batch_size`` where the server stacks batches, ...). A
        ``client_id`` gets a ``-w<worker>`` suffix in each worker. ``reliable``
        is a deprecated no-op, warned about here once.

    Notes
    -----
    Nothing connects until the dataset is iterated: the loader is built in the
    process that iterates it, once, and kept across passes. Use it with
    ``DataLoader(dataset, batch_size=None, num_workers=N,
    persistent_workers=True)`` (the server makes the batches, or none): with
    persistent workers each worker is one trainer for the whole run; workers
    made again for every pass (torch's default) give back what they had
    received and not handed out, for the next pass's workers. With
    ``pin_memory=True`` the DataLoader pins the tensors where CUDA is there; a
    CPU-only torch warns once and leaves them in pageable memory. See
    docs/torch.md.
    """

    def __init__(self, address: str | Sequence[str], *, rank: int | None = None,
                 world_size: int = 1, tensors: bool = True, whole_stream: bool = False,
                 **loader_options: Any) -> None:
        super().__init__()
        deprecated_loader_reliable(loader_options)
        if "with_meta" in loader_options:
            raise ConfigurationError(
                "expected no with_meta= for a RemoteDataset (it yields samples), got "
                f"with_meta={loader_options['with_meta']!r}: iterate track(dataloader) to "
                "know where the training loop stands")
        # The loader checks the rest when it is built; these two decide the shares.
        RemoteLoader(address, rank=rank, world_size=world_size, **loader_options).close()
        self.address = address
        self.rank = rank
        self.world_size = world_size
        self.tensors = tensors
        self.whole_stream = whole_stream
        self.loader_options = loader_options
        self._loader: RemoteLoader | None = None
        self._restored: dict[str, Any] | None = None
        self._tagged = False  # track(): yield (meta, sample) pairs
        self._position = Position(rank, world_size)

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        loader = self.loader()
        samples: Iterable[Any] = loader if self.whole_stream else loader.iter_epoch()
        convert = to_tensors if self.tensors else _same
        if self._tagged:
            for sample in samples:
                yield loader.last_meta, convert(sample)
        else:
            for sample in samples:
                yield convert(sample)

    def loader(self) -> RemoteLoader:
        """This process's loader (built at the first call here, in a worker its share)."""
        if self._loader is None:
            info = get_worker_info()
            share = worker_share(self.rank, self.world_size, 0 if info is None else info.id,
                                 0 if info is None else info.num_workers)
            options = dict(self.loader_options)
            if options.get("client_id") is not None:
                options["client_id"] = f"{options['client_id']}{share.suffix}"
            self._loader = RemoteLoader(self.address, rank=share.rank,
                                        world_size=share.world_size, with_meta=False,
                                        **options)
            if self._restored is not None:
                self._loader.load_state_dict(self._restored)
        return self._loader

    def track(self, dataloader: Iterable[Any]) -> Tracked:
        """``dataloader`` (over this dataset, ``batch_size=None``) noting where the training
        loop stands, for :meth:`state_dict` in this process, with workers or without.

        Iterate what this returns (each ``iter`` one pass, as the DataLoader) from
        the DataLoader's first pass on: its workers, started at that first pass,
        then tag each sample with where it came from, and this strips the tag.
        """
        self._tagged = True
        return Tracked(dataloader, self._position)

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the training loop stands, as :meth:`RemoteLoader.state_dict` saves it.

        From the loader when it lives in this process and the samples were not
        tracked (``num_workers=0``); else from what :meth:`track` saw (a ranked
        job's position is the job's: any rank's state will do).
        """
        if self._loader is not None and not self._tagged:
            return self._loader.state_dict()
        addresses = [self.address] if isinstance(self.address, str) else list(self.address)
        return self._position.state(addresses)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state: every loader built after this (in this process, or in
        the DataLoader workers started after this) restores it before its first sample."""
        if self._loader is not None:
            raise StreamValueError(
                "expected load_state_dict before the dataset is first iterated (the "
                "servers are told where to resume in the first hello), got it after")
        self._restored = state


def _same(value: Any) -> Any:
    return value


class Tracked:
    """A DataLoader over a tagging :class:`RemoteDataset`: yields the samples, notes the tags.

    Re-iterable like the DataLoader (each ``iter`` is one pass), so a training
    framework that iterates it once per epoch (Lightning) can take it as is.
    """

    def __init__(self, dataloader: Iterable[Any], position: Position) -> None:
        self.dataloader = dataloader
        self.position = position

    def __iter__(self) -> Iterator[Any]:
        for meta, sample in self.dataloader:
            self.position.advance(meta)
            yield sample
        self.position.pass_ended()


class Position:
    """Where the main process stands in the stream, from the tagged samples it handed out.

    A rank's position is the job's next round (docs/resume.md): after a sample
    at position ``p`` of rank ``r`` of ``W``, the job needs the round at
    ``p - r + W``. Under :func:`worker_share` the DataLoader yields a rank's
    positions in its own order, so the same rule holds for the samples the
    main process hands out, however many workers received them.

    Examples
    --------
    >>> position = Position(rank=1, world_size=2)
    >>> position.advance(SampleMeta(3, 7, "s"))
    >>> position.state(["tcp://127.0.0.1:5555"])["resume"]
    [[3, 8, 2]]
    """

    def __init__(self, rank: int | None, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.last: SampleMeta | None = None
        self.between_epochs = True

    def advance(self, meta: SampleMeta) -> None:
        """The main process handed out the sample ``meta`` tags."""
        self.last, self.between_epochs = meta, False

    def pass_ended(self) -> None:
        self.between_epochs = True

    def state(self, addresses: list[str]) -> dict[str, Any]:
        last = self.last
        state: dict[str, Any] = {
            "addresses": addresses,
            "server_ids": [last.server_id] if last is not None else [""] * len(addresses),
            "last_epoch": None if last is None else last.epoch,
            "last_position": None if last is None else last.position,
            "last_server_id": None if last is None else last.server_id,
            "received_messages": {},
        }
        if self.rank is None:
            state["between_epochs"] = self.between_epochs
            return state
        if len(addresses) != 1:
            raise StreamValueError(
                f"expected one server for a tracked ranked state, got {len(addresses)}: "
                "with several, use num_workers=0 (the loader's own state_dict)")
        where = None if last is None else [
            last.epoch, last.position - self.rank + self.world_size, self.world_size]
        state.update(resume=[where], rank=self.rank, world_size=self.world_size)
        return state

