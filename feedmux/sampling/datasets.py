"""Map-style datasets as streamers: epochs as seeded permutations of the indices.

This module owns how a map-style dataset (anything with ``__len__`` and
``__getitem__``: a torch ``Dataset``, a list, a numpy array, a Hugging Face
dataset) is served as it is: :class:`DatasetStreamer` is a mux-like streamer
whose every activation is one epoch, the items at a permutation of the indices
drawn from (seed, epoch), and whose shards are *stripes* of that permutation
(blocks of positions dealt to the shards in turn), so each shard only ever
loads its own indices and the shards merged block by block give back the
epoch's permutation itself, whatever the number of shards or processes. It is
pure (no zmq, no server or client imports) and must never import torch: the
dataset is only indexed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from feedmux.errors import SamplingError
from feedmux.sampling._checks import check_shard
from feedmux.sampling._passes import MuxPass
from feedmux.sampling._rng import seed_plan
from feedmux.sampling.mux import BaseMux
from feedmux.sampling.streamer import Streamer, StreamErrorHook, is_integer

__all__ = ["DatasetStreamer", "dataset_of", "from_dataset", "is_map_dataset",
           "stripe_positions"]

T = TypeVar("T")


def is_map_dataset(obj: object) -> bool:
    """Whether ``obj`` is a map-style dataset: an instance with ``__len__`` and ``__getitem__``.

    Not a class (a class is a factory), not a streamer, not a string or bytes
    (a slip, not a dataset of characters) and not a mapping (its keys are not
    the indices ``0 .. len - 1``).

    Examples
    --------
    >>> is_map_dataset([1, 2]), is_map_dataset(np.zeros((3, 2))), is_map_dataset(range(4))
    (True, True, True)
    >>> is_map_dataset({"a": 1}), is_map_dataset("ab"), is_map_dataset(list)
    (False, False, False)
    """
    if isinstance(obj, (type, str, bytes, bytearray, Mapping, Streamer)):
        return False
    kind = type(obj)
    return hasattr(kind, "__len__") and hasattr(kind, "__getitem__")


def is_iterable_dataset(obj: object) -> bool:
    """Whether ``obj`` is a torch ``IterableDataset`` (told without importing torch).

    >>> is_iterable_dataset([1])
    False
    """
    return any(kind.__name__ == "IterableDataset" and kind.__module__.startswith("torch.")
               for kind in type(obj).__mro__)


def stripe_positions(size: int, index: int, count: int, width: int) -> np.ndarray:
    """The positions of an epoch of ``size`` items that shard ``index`` of ``count`` takes.

    Positions are dealt in blocks of ``width``: block ``b`` (positions
    ``b * width .. (b + 1) * width - 1``) goes to shard ``b % count``. Taking
    ``width`` items from each shard in turn (the server's merge) gives the
    positions back in order. Built from the shard's own blocks: O(size / count).

    Examples
    --------
    >>> stripe_positions(10, 0, 2, 2).tolist(), stripe_positions(10, 1, 2, 2).tolist()
    ([0, 1, 4, 5, 8, 9], [2, 3, 6, 7])
    """
    if count == 1:
        return np.arange(size, dtype=np.int64)
    starts = np.arange(index * width, size, count * width, dtype=np.int64)
    positions: np.ndarray = (starts[:, None] + np.arange(width, dtype=np.int64)).ravel()
    if len(positions) and positions[-1] >= size:
        positions = positions[positions < size]
    return positions


class _Orders:
    """The latest epochs' orders of a dataset streamer, shared by its stripes.

    Every stripe needs its epoch's whole permutation to pick its positions; the
    stripes one process runs (all of them, with one worker) draw it once.
    """

    __slots__ = ("_orders",)

    #: Epochs kept: the stripes of a process run about the same epoch (the server
    #: releases an epoch once every stripe has ended the last one).
    KEEP = 2

    def __init__(self) -> None:
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def get(self, pass_number: int, size: int, draw: Any) -> np.ndarray:
        key = (pass_number, size)
        order = self._orders.get(key)
        if order is None:
            order = draw()
            if len(self._orders) >= self.KEEP:
                del self._orders[min(self._orders)]
            self._orders[key] = order
        return order


class DatasetStreamer(BaseMux[T]):
    """A map-style dataset as a streamer: each activation is one epoch over its indices.

    Activation ``p`` (epoch ``p`` of a server) yields ``dataset[i]`` for the
    indices ``i`` of a permutation of ``range(len(dataset))`` drawn from
    (seed, p), a different one each epoch; ``shuffle=False`` keeps the indices
    in order. A shard (:meth:`stripes`, or :func:`~feedmux.sampling.shard`)
    yields only its stripe of that permutation, so it calls ``__getitem__``
    for its own indices only. ``len(dataset)`` is read at every epoch.

    Parameters
    ----------
    dataset : map-style dataset
        Anything with ``__len__`` and ``__getitem__`` taking an int
        (:func:`is_map_dataset`). It is indexed with Python ints.
    shuffle : bool
        Draw a new permutation of the indices each epoch (default), or keep
        their order.
    random_state : None, int, numpy.random.Generator or numpy.random.RandomState
        The seed of the permutations. None: numpy's global random state at
        each epoch here, and the run's seed when a server serves it
        (:meth:`seeded`).

    Raises
    ------
    SamplingError
        When ``dataset`` is not map-style or its ``len()`` is not an int >= 0.

    Examples
    --------
    >>> letters = DatasetStreamer(list("abcdef"), random_state=1)
    >>> first, second = "".join(letters), "".join(letters)
    >>> sorted(first) == sorted(second) == list("abcdef"), first != second
    (True, True)
    >>> "".join(DatasetStreamer(list("abc"), shuffle=False))
    'abc'
    >>> parts = DatasetStreamer(list("abcdef"), shuffle=False).stripes(2, width=2)
    >>> ["".join(part) for part in parts]
    ['abef', 'cd']
    """

    def __init__(self, dataset: Any, shuffle: bool = True, random_state: object = None) -> None:
        if is_iterable_dataset(dataset):
            raise SamplingError(
                f"{type(dataset).__name__} is a torch IterableDataset, which has no indices to "
                "permute: wrap it as a stream instead (feedmux.Streamer(dataset))")
        if not is_map_dataset(dataset):
            raise SamplingError(
                f"expected a map-style dataset (an object with __len__ and __getitem__: a torch "
                f"Dataset, a list, a numpy array), got {type(dataset).__name__} {dataset!r:.80}")
        super().__init__([], random_state)
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self._orders = _Orders()
        _dataset_size(dataset)  # a len() that fails fails here, not in the first epoch
        #: (shard index, shard count, stripe width): the whole epoch by default.
        self.stripe = (0, 1, 1)

    def __len__(self) -> int:
        """The items of one epoch of this streamer (of its stripe, for a shard)."""
        size = _dataset_size(self.dataset)
        index, count, width = self.stripe
        return size if count == 1 else len(stripe_positions(size, index, count, width))

    def seeded(self, seed: int) -> DatasetStreamer[T]:
        """This streamer with ``seed`` as its random state, unless it was given one.

        A server gives its run's seed so that every process draws the same
        permutations (numpy's global state differs from process to process).

        >>> unseeded, seeded = DatasetStreamer([1, 2]), DatasetStreamer([1], random_state=2)
        >>> unseeded.seeded(4).seed, seeded.seeded(4).seed
        (4, 2)
        """
        if self._seed_plan.entropy is not None:
            return self
        return self._copy(random_state=seed)

    def ordered(self) -> DatasetStreamer[T]:
        """This streamer with the indices of every epoch in order (``shuffle=False``).

        >>> "".join(DatasetStreamer(list("abc"), random_state=3).ordered())
        'abc'
        """
        return self if not self.shuffle else self._copy(shuffle=False)

    def stripes(self, count: int, width: int = 1) -> list[DatasetStreamer[T]]:
        """The ``count`` shards of this streamer: stripes of blocks of ``width`` positions.

        Merged ``width`` items per shard in turn, they give this streamer's epochs
        (:func:`stripe_positions`). Each shard must have at least one item.

        Raises
        ------
        SamplingError
            When a shard would get no item (fewer blocks than shards), or the
            streamer shuffles without a seed (:meth:`seeded` first).
        """
        check_shard(0, count)
        if not (is_integer(width) and int(width) >= 1):
            raise SamplingError(f"expected a stripe width >= 1, got {width!r}")
        width = int(width)
        size = _dataset_size(self.dataset)
        blocks = -(-size // width)
        if count > blocks:
            raise SamplingError(
                f"the dataset has {size} items, {blocks} block(s) of {width}: at most {blocks} "
                f"shard(s), got {count}")
        return [self._stripe(index, count, width) for index in range(count)]

    def _stripe(self, index: int, count: int, width: int) -> DatasetStreamer[T]:
        if self.shuffle and self._seed_plan.entropy is None:
            # Each stripe would draw its own permutation from numpy's global state.
            raise SamplingError(
                "cannot split an unseeded, shuffled dataset streamer: its stripes must draw "
                "the same permutation; give it a random_state (a server gives its run's seed)")
        part = self._copy()  # the same permutations as the whole
        part.stripe = (index, count, width)
        return part

    def _shard(self, index: int, count: int) -> Streamer[T]:
        check_shard(index, count)
        return self._stripe(int(index), int(count), 1)

    def _copy(self, *, shuffle: bool | None = None, random_state: object = None
              ) -> DatasetStreamer[T]:
        """A fresh copy (no pass run yet), with another ``shuffle`` or ``random_state``."""
        copy: DatasetStreamer[T] = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._passes = 0
        copy._active = 0
        if shuffle is not None:
            copy.shuffle = bool(shuffle)
        if random_state is not None:  # a Generator is drawn from once, here
            copy._seed_plan = seed_plan(random_state)
            copy._int_seed = int(random_state) if is_integer(random_state) else None
        if shuffle is not None or random_state is not None:
            copy._orders = _Orders()  # other orders; a stripe shares its whole's
        return copy

    def epoch_indices(self, pass_number: int) -> np.ndarray:
        """The indices this streamer loads in pass ``pass_number`` (1-based), in order.

        >>> DatasetStreamer(list("abcd"), shuffle=False).stripes(2)[1].epoch_indices(1).tolist()
        [1, 3]
        """
        size = _dataset_size(self.dataset)
        index, count, width = self.stripe
        if not self.shuffle:
            return stripe_positions(size, index, count, width)
        if self._seed_plan.entropy is None:  # numpy's global state: a new draw every time
            return self._pick(self._pass_rng(pass_number).permutation(size))
        order = self._orders.get(pass_number, size,
                                 lambda: self._pass_rng(pass_number).permutation(size))
        return self._pick(order)

    def _pick(self, order: np.ndarray) -> np.ndarray:
        index, count, width = self.stripe
        if count == 1:
            return order
        picked: np.ndarray = order[stripe_positions(len(order), index, count, width)]
        return picked

    def _start(self, on_stream_error: StreamErrorHook | None) -> Iterator[T]:
        self._passes += 1
        indices = self.epoch_indices(self._passes).tolist()  # Python ints, as datasets expect
        getitem = self.dataset.__getitem__
        if on_stream_error is None:
            return map(getitem, indices)  # no Python step per item
        return _skipping(getitem, indices, on_stream_error)

    def _make_pass(self, pass_number: int,
                   on_stream_error: StreamErrorHook | None) -> MuxPass[T]:
        raise NotImplementedError("a DatasetStreamer runs its passes in _start")

    def __repr__(self) -> str:
        index, count, width = self.stripe
        part = "" if count == 1 else f", stripe {index} of {count} (blocks of {width})"
        return (f"DatasetStreamer(<{type(self.dataset).__name__} of "
                f"{_dataset_size(self.dataset)}>, shuffle={self.shuffle}{part})")


def _skipping(getitem: Any, indices: list[int], on_error: StreamErrorHook) -> Iterator[Any]:
    """The items, an index whose ``__getitem__`` raises handed to ``on_error`` and skipped."""
    for index in indices:
        try:
            item = getitem(index)
        except Exception as error:
            on_error(error)
            continue
        yield item


def _dataset_size(dataset: Any) -> int:
    try:
        size = len(dataset)
    except Exception as error:
        raise SamplingError(
            f"len() of the dataset {type(dataset).__name__} failed: {type(error).__name__}: "
            f"{error}") from error
    if not (is_integer(size) and int(size) >= 0):
        raise SamplingError(
            f"expected len() of the dataset to be an int >= 0, got {size!r}")
    return int(size)


def dataset_of(streamer: Any) -> DatasetStreamer[Any] | None:
    """The dataset streamer ``streamer`` is (``Streamer(dataset_streamer)`` is it), else None.

    >>> dataset_of(Streamer(from_dataset([1]))) is not None, dataset_of(Streamer([1]))
    (True, None)
    """
    while (type(streamer) is Streamer and isinstance(streamer.source, Streamer)
           and not streamer.args and not streamer.kwargs):
        streamer = streamer.source
    return streamer if isinstance(streamer, DatasetStreamer) else None


def from_dataset(dataset: Any, shuffle: bool = True,
                 random_state: object = None) -> DatasetStreamer[Any]:
    """Serve a map-style dataset as it is: a streamer of its items, an epoch per activation.

    What ``feedmux serve MODULE:ATTR`` makes of a dataset (:class:`DatasetStreamer`).

    Parameters
    ----------
    dataset : map-style dataset
        A torch ``Dataset``, a list, a numpy array, a Hugging Face dataset:
        anything with ``__len__`` and ``__getitem__``. Items may be tuples
        (``(image, label)``), dicts, arrays or torch CPU tensors.
    shuffle : bool
        A new permutation of the indices each epoch (default), or in order.
    random_state : None, int, numpy.random.Generator or numpy.random.RandomState
        The seed; a server uses its run's seed when this is None.

    Examples
    --------
    >>> stream = from_dataset([(0, "a"), (1, "b"), (2, "c")], random_state=0)
    >>> sorted(stream) == [(0, "a"), (1, "b"), (2, "c")]
    True
    >>> list(from_dataset(np.arange(3) * 10, shuffle=False))
    [np.int64(0), np.int64(10), np.int64(20)]
    """
    return DatasetStreamer(dataset, shuffle=shuffle, random_state=random_state)

