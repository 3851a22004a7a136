"""Epoch and iteration accounting over any iterable: :class:`Stream` and :class:`ManualStream`.

This module owns the trainer-side loop helpers. They follow ``zero.stream`` of
zero 0.0.2 item for item, and add saved state (:meth:`Stream.state_dict`) and an
epoch generator (:meth:`Stream.epochs`). It is pure logic over whatever iterable
it is given (a list, a generator, a torch ``DataLoader``, a ``RemoteLoader``): it
must never import zmq, open sockets, start threads or read clocks, so a list is
all its tests need. Argument checks are explicit ``raise`` statements, never
``assert``, so that they survive ``python -O``.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sized
from typing import Any, ClassVar, Final, Generic, Protocol, TypeVar, cast

from feedmux.errors import StreamError, StreamStateError, StreamTypeError, StreamValueError

__all__ = ["ManualStream", "Stream"]

T = TypeVar("T")

# The keys of a state_dict(). Constant, so that saved states stay readable.
_CLASS_KEY: Final = "class"
_LOADER_KEY: Final = "loader"

_COUNT_HELP: Final = "expected an int or math.inf"


def _check_count(value: object, name: str) -> int | float:
    """Return ``value`` as an int or an infinite float, the only counts zero accepted.

    A finite float is refused with the AssertionError-flavoured error because zero
    asserted it; anything that is not a number at all is a type error. ``bool`` is
    refused although it is an ``int``: ``data(True)`` is a bug, not a count.
    """
    if isinstance(value, bool):
        raise StreamTypeError(f"{name}: {_COUNT_HELP}, got the bool {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        as_float = float(value)
        if math.isinf(as_float):
            return as_float
        raise StreamStateError(f"{name}: {_COUNT_HELP}, got the finite float {value!r}")
    raise StreamTypeError(f"{name}: {_COUNT_HELP}, got {type(value).__name__} {value!r}")


def _length(loader: object) -> int | None:
    """``len(loader)``, or None when it has none (yet).

    A torch ``DataLoader`` over an ``IterableDataset`` defines ``__len__`` but raises
    TypeError (or NotImplementedError) from it, and a ``RemoteLoader`` raises
    TypeError until the server has told it the epoch size: both count as len-less.
    """
    if not isinstance(loader, Sized):
        return None
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return None


def _check_loader(loader: object) -> None:
    """Refuse what zero refused (an empty sized loader) and what can never be iterated."""
    kind = type(loader)
    if not (hasattr(kind, "__iter__") or hasattr(kind, "__getitem__")):
        raise StreamTypeError(f"loader: expected an iterable, got {kind.__name__} {loader!r}")
    if _length(loader) == 0:
        raise StreamStateError(
            f"loader: expected a non-empty iterable, got an empty {kind.__name__} "
            "(a stream over it would have nothing to yield)"
        )


def _is_stateful(loader: object) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


class _ProgressBar(Protocol):
    """The part of a ``tqdm`` bar that :meth:`Stream.epochs` uses."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


def _progress_bar_factory() -> Callable[..., _ProgressBar]:
    # Imported lazily and through importlib: tqdm is an optional extra and ships
    # no type information, so a plain import would tie mypy to its stub package.
    try:
        module = importlib.import_module("tqdm.auto")
    except ImportError as exc:
        raise StreamError(
            "epochs(progress=True) needs tqdm, which is not installed: "
            "run `pip install tqdm` or `pip install 'feedmux[progress]'`"
        ) from exc
    return cast("Callable[..., _ProgressBar]", module.tqdm)


class _StreamData(Generic[T]):
    """The iterator of ``data()``: ``stream.next()`` until a counter has grown by ``limit``.

    A class rather than a generator on purpose: when the loader runs dry,
    ``stream.next()`` raises StopIteration, which simply ends this iterator (a
    generator would turn it into RuntimeError). The counter is read from the
    stream, not kept here, so ``next()`` calls and other ``data()`` iterators made
    meanwhile count toward ``limit``.
    """

    def __init__(self, stream: Stream[T], limit: int | float, counter: Callable[[], int]) -> None:
        self._stream = stream
        self.limit = limit
        self._counter = counter
        self._start = counter()

    def __iter__(self) -> _StreamData[T]:
        return self

    def __next__(self) -> T:
        if self._counter() - self._start >= self.limit:
            raise StopIteration
        return self._stream.next()


class _ProgressData(Generic[T]):
    """An epoch's iterator that also advances a progress bar, closing it at the end."""

    def __init__(self, data: Iterator[T], bar: _ProgressBar) -> None:
        self._data = data
        self.bar = bar

    def __iter__(self) -> _ProgressData[T]:
        return self

    def __next__(self) -> T:
        try:
            item = next(self._data)
        except StopIteration:
            self.bar.close()
            raise
        self.bar.update(1)
        return item


class Stream(Generic[T]):
    """A loop over any iterable that counts iterations and epochs, cycling the iterable forever.

    The behaviour is that of ``zero.stream.Stream`` (zero 0.0.2): the stream holds
    one iterator over ``loader`` that only moves forward and restarts with
    ``iter(loader)`` whenever it runs out, as if it ran::

        while True:
            for item in loader:
                ...

    ``iteration`` counts the items taken, ``epoch`` the successful
    :meth:`increment_epoch` calls; how many items make an epoch is up to the
    caller (:meth:`data`).

    Parameters
    ----------
    loader : Iterable[T]
        Any iterable: a list, a generator, an iterator, a torch ``DataLoader``, a
        ``RemoteLoader``. A sized loader must not be empty; a loader whose
        ``len()`` raises TypeError or NotImplementedError counts as len-less.

    Raises
    ------
    StreamStateError
        If ``loader`` is sized and empty (an AssertionError, as in zero).
    StreamTypeError
        If ``loader`` is not iterable.

    Examples
    --------
    >>> stream = Stream(range(5))
    >>> while stream.increment_epoch(2):
    ...     for x in stream.data():
    ...         print(stream.epoch, stream.iteration, x)
    1 1 0
    1 2 1
    1 3 2
    1 4 3
    1 5 4
    2 6 0
    2 7 1
    2 8 2
    2 9 3
    2 10 4
    >>> stream.epoch, stream.iteration
    (2, 10)
    """

    # The counters a state_dict() carries, each stored in the attribute "_" + name.
    _COUNTERS: ClassVar[tuple[str, ...]] = ("epoch", "iteration")

    def __init__(self, loader: Iterable[T]) -> None:
        _check_loader(loader)
        self._loader = loader
        self._iterator: Iterator[T] | None = None
        self._iteration = 0
        self._epoch = 0

    def __repr__(self) -> str:
        counters = ", ".join(f"{name}={getattr(self, '_' + name)}" for name in self._COUNTERS)
        return f"<{type(self).__name__} over {type(self._loader).__name__}: {counters}>"

    @property
    def iteration(self) -> int:
        """The number of items taken so far (by :meth:`next`, directly or through :meth:`data`)."""
        return self._iteration

    @property
    def epoch(self) -> int:
        """The number of successful :meth:`increment_epoch` calls so far."""
        return self._epoch

    @property
    def loader(self) -> Iterable[T]:
        """The iterable given to the constructor or to :meth:`set_loader`."""
        return self._loader

    def increment_epoch(self, max: int | float | None = None) -> bool:
        """Add 1 to ``epoch``, unless ``epoch`` has already reached ``max``.

        Parameters
        ----------
        max : int or math.inf, optional
            With None (or ``math.inf``) the epoch is always incremented; otherwise
            only while ``epoch < max``.

        Returns
        -------
        bool
            Whether the epoch was incremented.

        Raises
        ------
        StreamStateError
            If ``max`` is a finite float (an AssertionError, as in zero).
        StreamTypeError
            If ``max`` is not a number.

        Examples
        --------
        >>> stream = Stream(range(5))
        >>> stream.increment_epoch(), stream.epoch
        (True, 1)
        >>> stream.increment_epoch(2), stream.epoch
        (True, 2)
        >>> stream.increment_epoch(2), stream.epoch
        (False, 2)
        """
        limit = None if max is None else _check_count(max, "max")
        if limit is not None and not self._epoch < limit:
            return False
        self._epoch += 1
        return True

    def data(self, n_items: int | float | None = None) -> Iterator[T]:
        """Iterate over the next ``n_items`` items, taken with :meth:`next`.

        The iterator counts with the shared ``iteration`` counter from the moment
        ``data()`` is called, so :meth:`next` calls and other ``data()`` iterators
        made meanwhile count toward ``n_items``. It ends early and quietly when a
        one-shot loader runs dry.

        Parameters
        ----------
        n_items : int or math.inf, optional
            How many items to yield. None means ``len(loader)``, read now;
            ``math.inf`` never ends; 0 yields nothing.

        Raises
        ------
        StreamValueError
            If ``n_items`` is None and the loader has no length (yet).
        StreamStateError
            If ``n_items`` is a finite float (an AssertionError, as in zero).
        StreamTypeError
            If ``n_items`` is not a number.

        Examples
        --------
        The stream never starts over by itself: an epoch of 3 items over 5 goes on
        where the last one stopped.

        >>> stream = Stream(range(5))
        >>> while stream.increment_epoch(3):
        ...     print(list(stream.data(3)))
        [0, 1, 2]
        [3, 4, 0]
        [1, 2, 3]
        >>> stream.epoch, stream.iteration
        (3, 9)
        >>> stream = Stream(range(5))
        >>> list(stream.data(7))
        [0, 1, 2, 3, 4, 0, 1]
        >>> list(stream.data(7))
        [2, 3, 4, 0, 1, 2, 3]

        Over a one-shot iterator, the data simply runs out:

        >>> stream = Stream(iter(range(5)))
        >>> while stream.increment_epoch(3):
        ...     print(list(stream.data(4)))
        [0, 1, 2, 3]
        [4]
        []
        """
        return self._data_by_iteration(n_items, "n_items")

    def next(self) -> T:
        """Take the next item and add 1 to ``iteration``.

        When the current iterator is exhausted, ``iter(loader)`` is called once more
        and its first item taken, so a finite iterable cycles forever. ``epoch``
        never changes here.

        Raises
        ------
        StopIteration
            If the loader yields nothing even after a restart: a one-shot iterator
            that has run dry raises it on every call. ``iteration`` is then unchanged.

        Examples
        --------
        >>> import math
        >>> stream = Stream(range(5))
        >>> for x in stream.data(math.inf):
        ...     print(stream.iteration, x)
        ...     if stream.iteration == 7:
        ...         break
        1 0
        2 1
        3 2
        4 3
        5 4
        6 0
        7 1
        >>> stream = Stream(range(5))
        >>> while True:
        ...     x = stream.next()
        ...     print(stream.iteration, x)
        ...     if stream.iteration == 7:
        ...         break
        1 0
        2 1
        3 2
        4 3
        5 4
        6 0
        7 1
        """
        iterator = self._iterator if self._iterator is not None else self._restart()
        try:
            item = next(iterator)
        except StopIteration:
            # A second StopIteration means the loader has nothing left at all
            # (a spent iterator or generator): let it propagate.
            item = next(self._restart())
        self._iteration += 1
        return item

    def reload_iterator(self) -> None:
        """Set the current iterator to ``iter(loader)``.

        For a re-iterable loader (a list, a ``DataLoader``) this drops the rest of
        the current pass; for an iterator or generator it changes nothing.

        Examples
        --------
        >>> stream = Stream(range(5))
        >>> stream.next(), stream.next()
        (0, 1)
        >>> stream.reload_iterator()
        >>> stream.next()
        0
        >>> stream = Stream(iter(range(5)))
        >>> stream.next(), stream.next()
        (0, 1)
        >>> stream.reload_iterator()
        >>> stream.next()
        2
        """
        self._restart()

    def _restart(self) -> Iterator[T]:
        self._iterator = iter(self._loader)
        return self._iterator

    def set_loader(self, loader: Iterable[T]) -> None:
        """Replace the loader; the counters are kept.

        If iteration has started, the stream switches to ``iter(loader)`` at once
        and the rest of the old loader's pass is dropped, even in the middle of a
        ``data()`` loop.

        Raises
        ------
        StreamStateError
            If ``loader`` is sized and empty (the old loader is then kept).
        StreamTypeError
            If ``loader`` is not iterable.

        Examples
        --------
        >>> from itertools import repeat
        >>> stream = Stream(repeat(0))
        >>> for x in stream.data(5):
        ...     print(stream.iteration, x)
        ...     if stream.iteration == 2:
        ...         stream.set_loader(repeat(1))
        1 0
        2 0
        3 1
        4 1
        5 1
        """
        _check_loader(loader)
        self._loader = loader
        if self._iterator is not None:
            self._iterator = iter(loader)

    def epochs(
        self,
        max_epoch: int | float,
        epoch_size: int | float | None = None,
        progress: bool = False,
    ) -> Generator[Iterator[T], None, None]:
        """Yield one ``data(epoch_size)`` iterator per epoch until ``epoch`` reaches ``max_epoch``.

        Equivalent to ``while stream.epoch < max_epoch: stream.increment_epoch();
        yield stream.data(epoch_size)``, so a restored stream goes on from its
        saved epoch. The arguments are checked when ``epochs()`` is called;
        ``epoch_size=None`` reads ``len(loader)`` at the start of every epoch.

        Parameters
        ----------
        max_epoch : int or math.inf
            The epoch to stop at.
        epoch_size : int or math.inf, optional
            Items per epoch; None means ``len(loader)``.
        progress : bool, default False
            Show a ``tqdm`` progress bar per epoch (needs the optional ``tqdm``,
            the ``progress`` extra).

        Raises
        ------
        StreamError
            If ``progress`` is true and tqdm is not installed.
        StreamStateError
            If ``max_epoch`` or ``epoch_size`` is a finite float.
        StreamTypeError
            If ``max_epoch`` or ``epoch_size`` is not a number.

        Examples
        --------
        >>> stream = Stream(range(5))
        >>> for epoch_data in stream.epochs(3, epoch_size=2):
        ...     print(stream.epoch, list(epoch_data))
        1 [0, 1]
        2 [2, 3]
        3 [4, 0]
        """
        limit = _check_count(max_epoch, "max_epoch")
        if epoch_size is not None:
            _check_count(epoch_size, "epoch_size")
        make_bar = _progress_bar_factory() if progress else None
        return self._epochs(limit, epoch_size, make_bar)

    def _epochs(
        self,
        max_epoch: int | float,
        epoch_size: int | float | None,
        make_bar: Callable[..., _ProgressBar] | None,
    ) -> Generator[Iterator[T], None, None]:
        bar: _ProgressBar | None = None
        try:
            while self._epoch < max_epoch:
                self.increment_epoch()
                data = self._data_by_iteration(epoch_size, "epoch_size")
                if make_bar is None:
                    yield data
                    continue
                if bar is not None:
                    bar.close()  # an epoch left early must not leave its bar behind
                total = None if math.isinf(data.limit) else data.limit
                bar = make_bar(total=total, desc=f"epoch {self._epoch}")
                yield _ProgressData(data, bar)
        finally:
            if bar is not None:
                bar.close()

    def state_dict(self) -> dict[str, Any]:
        """The stream's state as plain data (str keys; ints, strs, lists, dicts).

        Holds the class name (key ``"class"``), the counters (``"epoch"``,
        ``"iteration"``, and ``"mstep"`` for a :class:`ManualStream`) and, when the
        loader has ``state_dict`` and ``load_state_dict`` methods, the loader's own
        ``state_dict()`` under ``"loader"``. ``json.dumps`` accepts it as long as
        the loader's state is plain data too.

        Examples
        --------
        >>> stream = Stream(range(5))
        >>> stream.increment_epoch()
        True
        >>> list(stream.data(2))
        [0, 1]
        >>> stream.state_dict()
        {'class': 'Stream', 'epoch': 1, 'iteration': 2}
        """
        state: dict[str, Any] = {_CLASS_KEY: type(self).__name__}
        for name in self._COUNTERS:
            state[name] = getattr(self, "_" + name)
        if _is_stateful(self._loader):
            state[_LOADER_KEY] = cast(Any, self._loader).state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the counters, and the loader's state, from a :meth:`state_dict`.

        Everything is checked before anything changes. The loader's
        ``load_state_dict`` is called with its saved state, and the next item is
        taken from a fresh ``iter(loader)``: a stateful loader resumes where its
        state says, any other loader starts a new pass. ``data()`` iterators made
        before count from the counters they saw.

        Raises
        ------
        StreamValueError
            If the state comes from another class, misses a key (named in the
            message), has unknown keys, or carries a loader state that the current
            loader cannot take (or lacks one that it needs).
        StreamTypeError
            If ``state`` is not a mapping or a counter is not an int.

        Examples
        --------
        >>> stream = Stream(range(5))
        >>> stream.load_state_dict({"class": "Stream", "epoch": 3, "iteration": 12})
        >>> stream.epoch, stream.iteration, stream.next()
        (3, 12, 0)
        >>> stream.load_state_dict({"class": "Stream", "epoch": 3})
        Traceback (most recent call last):
        ...
        feedmux.errors.StreamValueError: cannot restore a Stream: missing key 'iteration'
        """
        cls = type(self).__name__
        if not isinstance(state, Mapping):
            raise StreamTypeError(
                f"cannot restore a {cls}: expected a mapping from state_dict(), "
                f"got {type(state).__name__}"
            )
        stateful = _is_stateful(self._loader)
        required = [_CLASS_KEY, *self._COUNTERS] + ([_LOADER_KEY] if stateful else [])
        missing = [key for key in required if key not in state]
        problems = []
        saved_class = state.get(_CLASS_KEY)
        if _CLASS_KEY in state and saved_class != cls:
            problems.append(f"expected the state of a {cls}, got the state of a {saved_class!r}")
        if missing:
            keys = ", ".join(repr(key) for key in missing)
            problems.append(f"missing key{'s' if len(missing) > 1 else ''} {keys}")
        if problems:
            raise StreamValueError(f"cannot restore a {cls}: " + "; ".join(problems))
        if _LOADER_KEY in state and not stateful:
            raise StreamValueError(
                f"cannot restore a {cls}: the state carries a loader state, but the loader "
                f"({type(self._loader).__name__}) has no state_dict/load_state_dict to take it"
            )
        unknown = sorted(set(state) - {_CLASS_KEY, _LOADER_KEY, *self._COUNTERS}, key=str)
        if unknown:
            raise StreamValueError(f"cannot restore a {cls}: unknown keys {unknown!r}")
        counters = {name: self._check_counter(state[name], name) for name in self._COUNTERS}

        if stateful:
            cast(Any, self._loader).load_state_dict(state[_LOADER_KEY])
        for name, value in counters.items():
            setattr(self, "_" + name, value)
        self._iterator = None

    def _check_counter(self, value: object, name: str) -> int:
        cls = type(self).__name__
        if isinstance(value, bool) or not isinstance(value, int):
            raise StreamTypeError(
                f"cannot restore a {cls}: {name!r} must be an int, got {type(value).__name__}"
            )
        if value < 0:
            raise StreamValueError(f"cannot restore a {cls}: {name!r} must be >= 0, got {value}")
        return value

    def _data_by_iteration(self, n_items: int | float | None, name: str) -> _StreamData[T]:
        if n_items is None:
            limit: int | float = self._loader_length(name)
        else:
            limit = _check_count(n_items, name)
        return _StreamData(self, limit, lambda: self._iteration)

    def _loader_length(self, name: str) -> int:
        loader, kind = self._loader, type(self._loader).__name__
        if not isinstance(loader, Sized):
            raise StreamValueError(
                f"{name}=None means len(loader), but the loader ({kind}) has no len(): pass {name}"
            )
        try:
            return len(loader)
        except (TypeError, NotImplementedError) as exc:
            # The loader's own words usually say when its length will be known.
            detail = f" ({exc})" if str(exc) else ""
            raise StreamValueError(
                f"{name}=None means len(loader), but the loader ({kind}) has no length "
                f"yet{detail}: pass {name}"
            ) from exc


class ManualStream(Stream[T]):
    """A :class:`Stream` with a manual step counter, for steps made of several items.

    ``mstep`` counts :meth:`increment_mstep` calls, independently of
    ``iteration``: useful when one logical step (say, one optimizer step) takes
    several items. Everything else is as in :class:`Stream`, except that
    :meth:`data` takes keyword-only arguments.

    Parameters
    ----------
    loader : Iterable[T]
        As for :class:`Stream`.

    Examples
    --------
    Two items per manual step, three manual steps:

    >>> stream = ManualStream(range(5))
    >>> batch = []
    >>> for x in stream.data(n_msteps=3):
    ...     batch.append(x)
    ...     if len(batch) == 2:
    ...         print(tuple(batch))
    ...         batch.clear()
    ...         stream.increment_mstep()
    (0, 1)
    (2, 3)
    (4, 0)
    >>> stream.mstep, stream.iteration
    (3, 6)
    """

    _COUNTERS: ClassVar[tuple[str, ...]] = ("epoch", "iteration", "mstep")

    def __init__(self, loader: Iterable[T]) -> None:
        super().__init__(loader)
        self._mstep = 0

    @property
    def mstep(self) -> int:
        """The number of :meth:`increment_mstep` calls so far."""
        return self._mstep

    def increment_mstep(self) -> None:
        """Add 1 to ``mstep``."""
        self._mstep += 1

    # Keyword-only on purpose (as in zero): data(3) would silently mean a
    # different unit than Stream.data(3). That breaks substitutability, hence
    # the ignore.
    def data(  # type: ignore[override]
        self,
        *,
        n_iterations: int | float | None = None,
        n_msteps: int | float | None = None,
    ) -> Iterator[T]:
        """Iterate over items until ``iteration`` or ``mstep`` has grown by the given amount.

        Exactly one argument must be given. ``n_iterations`` behaves like
        ``Stream.data(n_iterations)``; with ``n_msteps`` the iterator yields items
        until ``mstep`` has advanced by ``n_msteps`` since this call.

        Raises
        ------
        StreamStateError
            If both or neither argument is given, or one is a finite float
            (AssertionErrors, as in zero).
        StreamTypeError
            If the argument is not a number, or is given positionally.

        Examples
        --------
        >>> stream = ManualStream(range(5))
        >>> data = stream.data(n_msteps=1)
        >>> next(data), next(data), next(data), stream.iteration
        (0, 1, 2, 3)
        >>> stream.increment_mstep()
        >>> next(data)
        Traceback (most recent call last):
        ...
        StopIteration
        """
        if (n_iterations is None) == (n_msteps is None):
            given = "neither" if n_iterations is None else "both"
            raise StreamStateError(
                f"ManualStream.data: expected exactly one of n_iterations and n_msteps, got {given}"
            )
        if n_msteps is None:
            return self._data_by_iteration(n_iterations, "n_iterations")
        limit = _check_count(n_msteps, "n_msteps")
        return _StreamData(self, limit, lambda: self._mstep)
