"""Epochs and shards: how the server runs a streamer and splits it over workers.

This module owns the server's view of a streamer: :class:`EpochIterator`
runs it in cycle mode, one activation per epoch, and hands its items out in
chunks tagged with their epoch and position; :func:`shard` gives each of
several sampling processes its part so that, in exhaustive mode, the parts
together yield every item of an epoch exactly once. It is pure (no sockets,
no processes, no hooks but those passed in) and must keep the per-item cost
of the epoch loop to C-level slicing: no Python step per item.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

from feedmux.errors import SamplingError
from feedmux.sampling._checks import check_shard
from feedmux.sampling.mux import BaseMux, pass_skipper
from feedmux.sampling.streamer import (
    Streamer,
    StreamErrorHook,
    activate,
    close_stream,
    is_integer,
)

__all__ = ["Chunk", "EpochIterator", "is_streamer", "shard"]

T = TypeVar("T")


def is_streamer(obj: object) -> bool:
    """Whether ``obj`` is a :class:`~feedmux.sampling.Streamer` or a mux.

    Examples
    --------
    >>> is_streamer(Streamer([1, 2])), is_streamer([1, 2])
    (True, False)
    """
    return isinstance(obj, Streamer)


class EpochIterator(Generic[T]):
    """Run a streamer in cycle mode, one activation per epoch, in chunks of items.

    Each activation of the streamer is one epoch: for a mux in exhaustive
    mode with ``rate=None``, every item exactly once. :meth:`take` hands out
    the items of the current epoch in chunks that carry the epoch and the
    position of their first item.

    Parameters
    ----------
    streamer : Streamer or mux
        What to run; any other re-iterable is wrapped in a Streamer.
    max_epochs : int >= 0 or None
        Stop after this many epochs (interrupted ones included); None runs
        forever.
    on_epoch_start : callable(epoch), optional
        Called with the epoch's number just before the streamer is activated
        for it, so what it sets (a process's random state) reaches the whole
        epoch, its first item included.
    on_epoch_end : callable(epoch, count), optional
        Called after each complete epoch with its number and its item count,
        before the first item of the next epoch is drawn.
    on_stream_error : callable(exception), optional
        Handed to every mux the streamer runs: when one of a mux's streams
        raises, it is called with the exception and that stream counts as
        ended, the mux going on with the others. None (the default): the
        exception propagates. Read when each epoch starts; :meth:`take` may
        give another for the epochs it starts.

    Attributes
    ----------
    epoch : int
        The current epoch (1-based), the one the latest chunk belongs to; 0
        before the first chunk.
    epoch_size : int or None
        The item count of the latest complete epoch; None until one is done.
    epochs_completed : int
        How many epochs have run to their end.

    Raises
    ------
    SamplingError
        At construction on a bad ``max_epochs``.

    Examples
    --------
    >>> epochs = EpochIterator(Streamer("ab"), max_epochs=2)
    >>> [tuple(epochs.take(5)) for _ in range(2)]
    [(1, 0, ['a', 'b'], True), (2, 0, ['a', 'b'], True)]
    >>> epochs.epoch_size, epochs.epochs_completed
    (2, 2)
    """

    def __init__(
        self,
        streamer: Streamer[T] | Any,
        *,
        max_epochs: int | None = None,
        on_epoch_start: Callable[[int], None] | None = None,
        on_epoch_end: Callable[[int, int], None] | None = None,
        on_stream_error: StreamErrorHook | None = None,
    ) -> None:
        if max_epochs is not None and not (is_integer(max_epochs) and int(max_epochs) >= 0):
            raise SamplingError(
                f"max_epochs must be None or an int >= 0, got max_epochs={max_epochs!r}"
            )
        self.streamer: Streamer[T] = streamer if is_streamer(streamer) else Streamer(streamer)
        self.max_epochs = None if max_epochs is None else int(max_epochs)
        self.on_epoch_start = on_epoch_start
        self.on_epoch_end = on_epoch_end
        self.on_stream_error = on_stream_error
        self.epoch = 0
        self.epoch_size: int | None = None
        self.epochs_completed = 0
        # The open activation, the position in it, a deferred error.
        self._chunks: Iterator[T] | None = None
        self._position = 0
        self._pending_error: Exception | None = None
        self._exhausted_empty = False
        #: (epoch, position, keep) to fast-forward to, until it is reached.
        self._resume: tuple[int, int, int] | None = None
        #: The first items of the resumed epoch that :meth:`resume_at` was asked to keep.
        self.resumed_head: list[T] = []

    def close(self) -> None:
        """Close the current activation of the streamer (and its sources)."""
        if self._chunks is not None:
            close_stream(self._chunks)

    def take(self, limit: int, *, prepare: Callable[[T], T] | None = None,
             on_stream_error: StreamErrorHook | None = None) -> Chunk:
        """The next up-to-``limit`` items of the current epoch, in one call.

        ``prepare`` is applied to each item as it is drawn, before the next is
        (a server copies the arrays of a streamer that may reuse them here).
        ``on_stream_error`` replaces the constructor's hook for an epoch this
        call starts.

        The items are pulled by C code (``islice``), not one generator step
        and tuple each, for a caller that ships items in groups (the server).
        A chunk never spans two epochs; ``chunk.last`` says that the epoch
        ended with it (then ``items`` may be empty, when the previous chunk
        happened to end exactly at the end).
        When the streamer raises, the items drawn before are returned first
        and the exception is raised by the next call, which abandons that
        epoch (not counted as complete, no ``on_epoch_end``); the call after
        starts the next epoch, so a server can log the error and go on.
        Raises StopIteration after ``max_epochs`` epochs, and SamplingError
        when an epoch yields no item (an empty source would otherwise spin
        forever; every later call raises it again).

        Examples
        --------
        >>> epochs = EpochIterator(Streamer("abc"), max_epochs=2)
        >>> for _ in range(4):
        ...     print(tuple(epochs.take(2)))
        (1, 0, ['a', 'b'], False)
        (1, 2, ['c'], True)
        (2, 0, ['a', 'b'], False)
        (2, 2, ['c'], True)
        """
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        while self._chunks is None:
            if self.max_epochs is not None and self.epoch >= self.max_epochs:
                raise StopIteration
            if self._exhausted_empty:
                raise SamplingError(self._empty_message())
            self.epoch += 1
            self._position = 0
            if self.on_epoch_start is not None:
                self.on_epoch_start(self.epoch)
            if self._skip_whole_epoch():
                continue
            self._chunks = activate(self.streamer, None,
                                    on_stream_error or self.on_stream_error)
            if self._resume is not None:
                self._skip_to_resume()
        items: list[T] = []
        start = self._position
        drawn = self._chunks if prepare is None else map(prepare, self._chunks)
        try:
            items.extend(itertools.islice(drawn, limit))
        except Exception as error:
            # list.extend keeps what it appended before the error: ship those first.
            self._chunks = None
            if not items:
                raise
            self._pending_error = error
            self._position += len(items)
            return Chunk(self.epoch, start, items, False)
        self._position += len(items)
        if len(items) == limit:
            return Chunk(self.epoch, start, items, False)
        self._chunks = None
        count = self._position
        if count == 0:
            self._exhausted_empty = True
            raise SamplingError(self._empty_message())
        self.epoch_size = count
        self.epochs_completed += 1
        if self.on_epoch_end is not None:
            self.on_epoch_end(self.epoch, count)
        return Chunk(self.epoch, start, items, True)

    def resume_at(self, epoch: int, position: int, keep: int = 0) -> None:
        """Start at ``position`` of ``epoch`` instead of at the first item of epoch 1.

        The epochs before ``epoch`` and the first ``position`` items of it are
        drawn and discarded when :meth:`take` first needs an item, at C speed
        (no per-item Python step), with the same hooks as a normal run: a
        seeded source gives the same items again, so the items after are those
        an uninterrupted run gives. A whole earlier epoch of a mux over plain
        streamers is not even drawn: counting its pass is all running it would
        change (:func:`~feedmux.sampling.mux.pass_skipper`); its size then
        stays unknown (:attr:`epoch_size`) until an epoch runs to its end.
        The first ``keep`` discarded items of ``epoch`` are kept in
        :attr:`resumed_head` (a ranked dealer pads with
        them). A ``position`` at or past the end of ``epoch`` resumes at the
        next epoch. Call it before the first :meth:`take`.

        Raises
        ------
        SamplingError
            On an epoch < 1, a position < 0, or a call after the first take.

        Examples
        --------
        >>> epochs = EpochIterator(Streamer("abc"), max_epochs=3)
        >>> epochs.resume_at(2, 1, keep=1)
        >>> tuple(epochs.take(5)), epochs.resumed_head, epochs.epochs_completed
        ((2, 1, ['b', 'c'], True), ['a'], 2)
        """
        if self.epoch or self._chunks is not None:
            raise SamplingError("resume_at must be called before the first take()")
        if not (is_integer(epoch) and int(epoch) >= 1 and is_integer(position)
                and int(position) >= 0):
            raise SamplingError(
                f"expected an epoch >= 1 and a position >= 0 to resume at, got epoch "
                f"{epoch!r}, position {position!r}"
            )
        self._resume = (int(epoch), int(position), int(keep))

    def _skip_whole_epoch(self) -> bool:
        """Skip the epoch just begun without running it, if the resume point is past it and
        the streamer allows (:func:`~feedmux.sampling.mux.pass_skipper`)."""
        if self._resume is None or self.epoch >= self._resume[0]:
            return False
        skip = pass_skipper(self.streamer)
        if skip is None:
            return False
        skip()
        self.epochs_completed += 1
        return True

    def _skip_to_resume(self) -> None:
        """Discard what comes before the resume point in the epoch just activated."""
        assert self._resume is not None and self._chunks is not None
        epoch, position, keep = self._resume
        if self.epoch > epoch:
            self._resume = None
            return
        whole = self.epoch < epoch
        head: list[T] = [] if whole else list(itertools.islice(self._chunks, min(keep, position)))
        counter = itertools.count(len(head))
        limit = None if whole else position - len(head)
        # zip drives the count from C: deque(maxlen=0) discards without a Python step per item.
        collections.deque(zip(itertools.islice(self._chunks, limit), counter, strict=False),
                          maxlen=0)
        skipped = next(counter)
        if not whole:
            self.resumed_head = head
            self._resume = None
            self._position = skipped
            if skipped == position:
                return
        # The epoch ended before the resume point: it counts as complete, and is not sent.
        close_stream(self._chunks)
        self._chunks = None
        if skipped == 0:
            self._exhausted_empty = True
            raise SamplingError(self._empty_message())
        self.epoch_size = skipped
        self.epochs_completed += 1

    def _empty_message(self) -> str:
        return (
            f"epoch {self.epoch} of {self.streamer!r} yielded no items; an empty source "
            "would never yield anything"
        )


class Chunk(NamedTuple):
    """Items of one epoch from :meth:`EpochIterator.take`: the epoch, the position
    of the first item, the items, and whether the epoch ended with them."""

    epoch: int
    start: int
    items: list[Any]
    last: bool


class _EveryNth(Streamer[T]):
    """The items at positions ``index, index + count, ...`` of each activation of a streamer."""

    def __init__(self, streamer: Streamer[T], index: int, count: int) -> None:
        super().__init__(streamer)
        self.index = index
        self.count = count

    def _start(self, on_stream_error: StreamErrorHook | None) -> Iterator[T]:
        # The hook reaches the muxes of the whole source, which every shard runs.
        items = activate(self.source, None, on_stream_error)
        return itertools.islice(items, self.index, None, self.count)

    def __repr__(self) -> str:
        return f"shard({self.source!r}, {self.index}, {self.count})"


def shard(streamer: Streamer[T], index: int, count: int) -> Streamer[T]:
    """The part of ``streamer`` that worker ``index`` of ``count`` runs.

    A mux over a list of streamers is split by streamers: shard ``index`` is
    the same kind of mux, with the same arguments, over
    ``streamers[index::count]`` (weights sliced alike, ``n_active`` clamped
    at each pass, the seed derived from (seed, index) so that shards differ
    but stay reproducible). Anything else (a plain Streamer, a ChainMux over a
    generator function) is split by items: shard ``index`` keeps the items
    at positions ``index, index + count, ...`` of each pass, so it runs the
    whole source and needs it to give the same items in the same order in
    every worker. Either way, in exhaustive mode the shards' epochs together
    are one epoch of ``streamer``, each item once.

    Parameters
    ----------
    streamer : Streamer or mux
        What to split.
    index : int
        The worker, ``0 <= index < count``.
    count : int >= 1
        The number of workers; ``count == 1`` returns ``streamer`` itself.

    Raises
    ------
    SamplingError
        On a bad ``index`` or ``count``, or when a mux has fewer streamers
        than ``count`` so that shard ``index`` would have none (the message
        says to use fewer workers).

    Examples
    --------
    >>> from feedmux.sampling import ChainMux
    >>> mux = ChainMux(["ab", "cd", "ef"])
    >>> ["".join(shard(mux, index, 2)) for index in range(2)]
    ['abef', 'cd']
    >>> ["".join(shard(Streamer("abcde"), index, 2)) for index in range(2)]
    ['ace', 'bd']
    """
    if not is_streamer(streamer):
        raise SamplingError(
            f"streamer must be a Streamer or a mux, got streamer={streamer!r} "
            f"({type(streamer).__name__})"
        )
    check_shard(index, count)
    if count == 1:
        return streamer
    if isinstance(streamer, BaseMux):
        part = streamer.split(index, count)
        if part is not None:
            return part
    elif (
        type(streamer) is Streamer
        and isinstance(streamer.source, Streamer)
        and not streamer.args
        and not streamer.kwargs
    ):
        # Streamer(mux) is the mux: split the mux itself, by streamers.
        return shard(streamer.source, index, count)
    return _EveryNth(streamer, int(index), int(count))
