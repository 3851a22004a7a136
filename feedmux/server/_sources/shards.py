"""The shards of a run: how many, their random state, and their merge in one process.

A seeded run's order must not depend on how many processes sample it. So the
source is split once per run into a fixed number of *shards* (chosen from the
source here, logged by the server), each shard a unit of work that one process
runs at a time and that can move to another; the server takes the shards'
samples in the fixed rotation of :class:`~feedmux.server._sources.merge.MergeOrder`
(a block of samples per shard per turn, a rule of the shards' own counts only).
Every shard draws from its own mux (seeded from (seed, shard)) and, for the
process-wide generators user code draws from (``random``, numpy's global state,
torch's), from its own state (:class:`ShardRandom`: reseeded from (seed, shard,
epoch) at each epoch, saved and restored when the process switches to another
shard), so the items of (shard, epoch) are the same whichever process draws them,
and alongside whichever other shards. :class:`MergedShards` runs every shard in
this process in that order: a one-process server gives the sequence of any number
of workers. This module must never touch sockets nor decide who runs a shard.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator, Iterator
from typing import Any, cast

from feedmux._worker_info import WorkerInfo, set_worker_info, worker_info
from feedmux.errors import SamplingError
from feedmux.sampling.datasets import DatasetStreamer, dataset_of
from feedmux.sampling.epochs import shard
from feedmux.sampling.mux import BaseMux, pass_skipper
from feedmux.sampling.streamer import Streamer, StreamErrorHook, activate, close_stream
from feedmux.server._sources.globalstate import GlobalRandomState
from feedmux.server._sources.merge import MergeOrder
from feedmux.server._sources.seeding import reseed_globals

__all__ = ["DEFAULT_SHARDS", "MAX_SHARDS", "MergedShards", "ShardRandom", "choose_shards"]

log = logging.getLogger("feedmux.server")

#: Shards of a mux over more streamers than this, unless told otherwise (``shards=``):
#: more than the cores of most sampling hosts, so that the workers can grow past them
#: for a sampler that waits on storage, and few enough that one process running them
#: all switches random states only once per block.
DEFAULT_SHARDS = 16
#: Most shards a run may have (``shards=``).
MAX_SHARDS = 1024


def _mux_of(streamer: Any) -> Any:
    """The mux that ``streamer`` is (``Streamer(mux)`` is the mux), else ``streamer``."""
    while (type(streamer) is Streamer and isinstance(streamer.source, Streamer)
           and not streamer.args and not streamer.kwargs):
        streamer = streamer.source
    return streamer


def choose_shards(streamer: Any, requested: int | None = None,
                  item_split: int = 1, block: int = 1) -> tuple[list[Any], str]:
    """The shards of a run and why that many, for the log.

    A map-style dataset (:class:`~feedmux.sampling.datasets.DatasetStreamer`)
    is split into stripes of its epoch's permutation, blocks of ``block``
    positions dealt to the shards in turn (the merge's samples per turn), so
    the merged shards give the permutation itself whatever their count: the
    ``shards`` option, else :data:`DEFAULT_SHARDS` or ``item_split`` when that
    is more, at most one per block of the epoch. Otherwise ``requested`` (the
    ``shards`` option) wins. Otherwise a mux over ``K``
    streamers that splits by streamers gets ``min(K // 2, DEFAULT_SHARDS)``, or
    ``min(K, item_split)`` when that is more
    (fewer when a shard would hold only zero-weight streamers); anything else
    splits only by items and gets ``item_split`` shards (the server passes the
    most workers it may run), every one of which draws the whole source and keeps
    every ``item_split``-th item: its order then depends on that count, as with
    ``--workers N`` before shards.

    Examples
    --------
    >>> from feedmux.sampling import ChainMux
    >>> parts, why = choose_shards(ChainMux(["ab", "cd", "ef", "gh"]))
    >>> len(parts), why
    (2, '4 streamers, at least 2 per shard, at most 16 shards')
    >>> len(choose_shards(Streamer("abc"))[0])
    1
    >>> ["".join(part) for part in choose_shards(Streamer("abcd"), 2)[0]]
    ['ac', 'bd']
    >>> from feedmux.sampling.datasets import from_dataset
    >>> parts, why = choose_shards(from_dataset(list("abcdefg"), shuffle=False), block=2)
    >>> ["".join(part) for part in parts], why
    (['ab', 'cd', 'ef', 'g'], 'a dataset of 7 items: at most one shard per block of 2')
    >>> merged = MergedShards(parts, block=2, seed=0)
    >>> "".join(merged)  # the dataset's order, whatever the shards
    'abcdefg'
    """
    dataset = dataset_of(streamer)
    if dataset is not None:
        return _dataset_shards(dataset, requested, item_split, block)
    if requested is not None:
        if not 1 <= requested <= MAX_SHARDS:
            raise SamplingError(f"expected 1 <= shards <= {MAX_SHARDS}, got {requested}")
        return [shard(streamer, index, requested) for index in range(requested)], "asked for"
    mux = _mux_of(streamer)
    if not isinstance(mux, BaseMux) or mux.split(0, 1) is None:
        if item_split == 1:
            return [streamer], "the source splits only by items (shards=N splits it N ways)"
        return ([shard(streamer, index, item_split) for index in range(item_split)],
                "the source splits only by items: one shard per worker it may run, each "
                "drawing the whole source (shards=N fixes the count)")
    # Each shard keeps at least two streamers, so that it still mixes streams as the mux
    # does (n_active clamped in each shard); the shards themselves take turns in blocks.
    # More workers than that get a shard each (as --workers N always split a mux).
    per_shard = 2
    count = max(1, min(len(mux.streamers) // per_shard, DEFAULT_SHARDS))
    why = (f"{len(mux.streamers)} streamers, at least {per_shard} per shard, at most "
           f"{DEFAULT_SHARDS} shards")
    if item_split > count:
        count = min(item_split, len(mux.streamers))
        why = f"{len(mux.streamers)} streamers: one shard per worker it may run"
    while count > 1:
        try:
            return [shard(streamer, index, count) for index in range(count)], why
        except SamplingError:  # a shard of zero-weight streamers only
            count -= 1
            why = "fewer, so that every shard has a streamer of non-zero weight"
    return [streamer], why


def _dataset_shards(dataset: DatasetStreamer[Any], requested: int | None, item_split: int,
                    block: int) -> tuple[list[Any], str]:
    """The stripes of a dataset's epochs, and why that many."""
    if requested is not None:
        if not 1 <= requested <= MAX_SHARDS:
            raise SamplingError(f"expected 1 <= shards <= {MAX_SHARDS}, got {requested}")
        return dataset.stripes(requested, block), "asked for"
    size = len(dataset)
    blocks = -(-size // block)
    count = max(DEFAULT_SHARDS, item_split)
    why = (f"a dataset: {DEFAULT_SHARDS} stripes of its permutation" if count == DEFAULT_SHARDS
           else "a dataset: one stripe of its permutation per worker it may run")
    if count >= blocks:
        count = max(1, blocks)
        why = f"a dataset of {size} items: at most one shard per block of {block}"
    return dataset.stripes(count, block), why


class ShardRandom:
    """The process-wide random state of one shard, saved and restored as a process switches.

    :meth:`start_epoch` (the shard's ``on_epoch_start``) reseeds ``random``,
    numpy's global state and torch's (if imported) from (seed, shard, epoch) and
    publishes :func:`feedmux.worker_info` with ``id`` the shard and
    ``num_workers`` the number of shards; :meth:`enter` makes this shard's
    state current before it draws, saving the state of the shard that drew
    last (only when they differ: a process with one shard pays nothing).

    A switch happens every block of samples, so the states are copied as bytes
    where their layout checked out, a few µs instead of the public
    get/set-state's 80-100 (:class:`~feedmux.server._sources.globalstate.GlobalRandomState`
    says how, and falls back to the public calls otherwise: the draws are the
    same either way). ``fast=False`` takes the public calls always.

    Examples
    --------
    >>> import numpy as np
    >>> first, second = ShardRandom(5, 0, 2), ShardRandom(5, 1, 2)
    >>> first.enter(); first.start_epoch(1); a = np.random.random()
    >>> second.enter(); second.start_epoch(1); b = np.random.random()
    >>> first.enter(); a2 = np.random.random()
    >>> ShardRandom.leave_all(); ShardRandom(5, 0, 2).start_epoch(1)
    >>> [np.random.random(), np.random.random()] == [a, a2], a != b
    (True, True)
    """

    #: The shard whose state the process-wide generators hold now.
    _current: ShardRandom | None = None

    def __init__(self, seed: int, shard_index: int, shards: int, fast: bool = True) -> None:
        self.seed = seed
        self.shard = shard_index
        self.shards = shards
        self.fast = fast
        # Made at the first switch away from this shard (a process with one shard never).
        self._saved: GlobalRandomState | None = None
        self._info: WorkerInfo | None = None

    def start_epoch(self, epoch: int) -> None:
        set_worker_info(WorkerInfo(self.shard, self.shards, self.seed, epoch))
        reseed_globals(self.seed, self.shard, epoch)

    def enter(self) -> None:
        current = ShardRandom._current
        if current is self:
            return
        if current is not None:
            current._save()
        ShardRandom._current = self
        if self._saved is not None:
            self._saved.restore()
            set_worker_info(self._info)

    def _save(self) -> None:
        if self._saved is None:
            self._saved = GlobalRandomState(self.fast)
        self._saved.save()
        self._info = worker_info()

    @staticmethod
    def leave_all() -> None:
        """Forget which shard is current (the next :meth:`enter` saves nothing)."""
        ShardRandom._current = None


class _Blocks(itertools.chain):  # type: ignore[type-arg]
    """The items of a generator of blocks, one by one, and a ``close()`` that closes it.

    ``itertools.chain`` hands the items out in C: a seeded server's merge of
    its shards costs a generator step per block, not one per sample.
    """

    blocks: Generator[list[Any], None, None]

    @classmethod
    def of(cls, blocks: Generator[list[Any], None, None]) -> _Blocks:
        chained = cast(_Blocks, cls.from_iterable(blocks))  # a classmethod: an instance of cls
        chained.blocks = blocks
        return chained

    def close(self) -> None:
        self.blocks.close()


class MergedShards(Streamer[Any]):
    """Every shard run in this process, their items in the fixed merge order.

    Each activation is one epoch (:meth:`start_epoch` says which, before it):
    each shard is activated, reseeded for the epoch, and gives ``block`` items
    per turn in the rotation of :class:`~feedmux.server._sources.merge.MergeOrder`,
    the same order in which a server merges the shards' messages from its worker
    processes, so a server with one process serves the same sequence.

    Examples
    --------
    >>> from feedmux.sampling import ChainMux
    >>> parts, _ = choose_shards(ChainMux(["abc", "de", "f"]), 3)
    >>> merged = MergedShards(parts, block=2, seed=1)
    >>> merged.start_epoch(1); "".join(merged.iterate())
    'abdefc'
    """

    def __init__(self, parts: list[Any], block: int, seed: int) -> None:
        super().__init__(parts[0])
        #: The shards (``restart_passes`` finds their muxes here).
        self.streamers = parts
        self.block = block
        self.randoms = [ShardRandom(seed, index, len(parts)) for index in range(len(parts))]
        self.epoch = 1

    def start_epoch(self, epoch: int) -> None:
        """The epoch the next activation is (an ``on_epoch_start`` hook)."""
        self.epoch = epoch

    def skipper(self) -> Callable[[], None] | None:
        """How to skip one whole epoch without drawing it, when every shard can skip its own.

        A resumed run then skips the epochs before its start as a server with workers
        does (each worker's shards skip theirs), instead of drawing every item of them:
        a served dataset's earlier epochs are not loaded again. Each epoch reseeds the
        process-wide generators from (seed, shard, epoch), so nothing drawn in a skipped
        epoch reaches the next. None when a shard must run to be skipped.
        """
        skippers = [pass_skipper(part) for part in self.streamers]
        if any(skip is None for skip in skippers):
            return None

        def skip_all() -> None:
            for skip in skippers:
                assert skip is not None
                skip()

        return skip_all

    def _start(self, on_stream_error: StreamErrorHook | None) -> Iterator[Any]:
        return _Blocks.of(self._blocks(on_stream_error))

    def _blocks(self, on_stream_error: StreamErrorHook | None) -> Generator[list[Any], None, None]:
        count, block, epoch = len(self.streamers), self.block, self.epoch
        order = MergeOrder(count, block)
        streams: list[Iterator[Any] | None] = [None] * count
        taken = [0] * count
        try:
            for _ in range(count * 2 ** 62):  # ends when every shard has ended
                index = order.next_worker()
                shard_random = self.randoms[index]
                shard_random.enter()
                stream = streams[index]
                if stream is None:
                    shard_random.start_epoch(epoch)
                    stream = streams[index] = activate(self.streamers[index], None,
                                                       on_stream_error)
                want = block - taken[index] % block
                items = list(itertools.islice(stream, want))
                taken[index] += len(items)
                if items:
                    order.took(index, len(items))
                    yield items
                if len(items) < want and order.ended(index):
                    return
        finally:
            ShardRandom.leave_all()
            for stream in streams:
                if stream is not None:
                    close_stream(stream)

    def __repr__(self) -> str:
        return f"MergedShards(<{len(self.streamers)} shards>, block={self.block})"
