"""Streamers: restartable sources of items, the unit every mux is built from.

This module owns the activation model. A :class:`Streamer` wraps a *source*
(a generator function, any callable returning an iterable, or a re-iterable
such as a list, an array or another streamer) and every activation starts
that source afresh from its first item. It is pure: no I/O, no threads, and
no activation state on the object beyond a counter of open activations, so
two iterations of one streamer never interfere. It must never pull more
items from a source than it yields.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, ParamSpec, TypeGuard, TypeVar

from feedmux.errors import SamplingError

__all__ = [
    "StreamErrorHook",
    "Streamer",
    "activate",
    "blamed_streamer",
    "check_max_iter",
    "close_stream",
    "describe_streamer",
    "is_integer",
    "is_real",
    "streamable",
]

T = TypeVar("T")
P = ParamSpec("P")

#: What a mux does when one of its streams raises, handed down explicitly from
#: the caller that activates it. None: the exception propagates and ends the
#: pass. A callable: it is called with the exception, then that stream counts
#: as ended and the pass goes on with the others.
StreamErrorHook = Callable[[BaseException], None]


def is_integer(value: object) -> TypeGuard[numbers.Integral]:
    """Whether ``value`` is an int or a numpy integer (a bool is not).

    Examples
    --------
    >>> is_integer(3), is_integer(True), is_integer(3.0)
    (True, False, False)
    """
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral)


def is_real(value: object) -> TypeGuard[numbers.Real]:
    """Whether ``value`` is a real number, numpy ones included (a bool is not)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Real)


def check_max_iter(max_iter: object, argument: str = "max_iter") -> int | None:
    """Validate a ``max_iter``-like argument and return it as an int or None.

    ``None`` and ``inf`` mean "no limit". A non-integral number is rounded up,
    as pescador does (it stops once the count reaches the limit).

    Raises
    ------
    SamplingError
        If the value is not None or a number >= 0.

    Examples
    --------
    >>> check_max_iter(3), check_max_iter(None), check_max_iter(2.5)
    (3, None, 3)
    """
    if max_iter is None:
        return None
    if is_integer(max_iter):
        limit = int(max_iter)
        if limit >= 0:
            return limit
    elif is_real(max_iter):
        value = float(max_iter)
        if value == math.inf:
            return None
        if value >= 0:  # False for NaN
            return math.ceil(value)
    raise SamplingError(f"{argument} must be None or a number >= 0, got {argument}={max_iter!r}")


def close_stream(iterator: object) -> None:
    """Close ``iterator`` if it can be closed (a generator, an activation)."""
    # Close the source generator as soon as its activation is over, so that a
    # capped activation releases its resources (open files, ...) at once
    # instead of whenever the garbage collector gets to it.
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def activate(
    streamer: Streamer[T], limit: int | None = None, on_stream_error: StreamErrorHook | None = None
) -> Iterator[T]:
    """One activation of ``streamer``, handing ``on_stream_error`` down to its muxes.

    This is how muxes and the epoch loop open their streams. ``limit`` is an
    already checked ``max_iter`` (an int >= 0 or None). A subclass that
    overrides ``iterate`` (pescador style) is activated through it, so the
    hook does not reach the muxes it runs inside.

    Examples
    --------
    >>> list(activate(Streamer("abc"), 2))
    ['a', 'b']
    """
    if type(streamer).iterate is not Streamer.iterate:
        return streamer.iterate(limit)
    return streamer._activation(limit, on_stream_error)


#: Characters of each argument's repr in :func:`blamed_streamer` (a path, a config...).
MAX_ARGUMENT_REPR = 200
#: The attribute an exception carries the streamer that raised it in.
_BLAMED = "__feedmux_streamer__"


def blamed_streamer(error: BaseException) -> str | None:
    """The streamer whose source raised ``error``: its function's qualified name and its
    arguments, as a call (None: not raised by a streamer's source function).

    The innermost streamer with a callable source that saw ``error`` pass is the
    one named (a mux around it, or a streamer of that mux, is not).

    Examples
    --------
    >>> def load(path, *, scale=1):
    ...     yield 1
    ...     raise OSError(f"cannot read {path}")
    >>> items = Streamer(load, "/data/a.npz", scale=2).iterate()
    >>> next(items)
    1
    >>> try:
    ...     next(items)
    ... except OSError as error:
    ...     blamed_streamer(error)
    "feedmux.sampling.streamer.load('/data/a.npz', scale=2)"
    """
    blamed = getattr(error, _BLAMED, None)
    return blamed if isinstance(blamed, str) else None


def describe_streamer(streamer: Any) -> str:
    """A streamer as a call of its source (a mux or other source: its type and size).

    Examples
    --------
    >>> def read(path):
    ...     yield path
    >>> describe_streamer(Streamer(read, "a.txt"))
    "feedmux.sampling.streamer.read('a.txt')"
    >>> describe_streamer(Streamer([1, 2]))
    'Streamer(list)'
    """
    if isinstance(streamer, Streamer) and streamer._callable_source:
        return _describe_call(streamer.source, streamer.args, streamer.kwargs)
    inner = getattr(streamer, "streamers", None)
    if inner is not None:
        return f"{type(streamer).__name__} of {len(inner)} streamers"
    if isinstance(streamer, Streamer):
        return f"Streamer({type(streamer.source).__name__})"
    return type(streamer).__name__


def _describe_call(source: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    name = getattr(source, "__qualname__", None) or type(source).__qualname__
    module = getattr(source, "__module__", None)
    if module and module != "builtins":
        name = f"{module}.{name}".replace(".<locals>", "")
    shown = [_short_repr(arg) for arg in args]
    shown += [f"{key}={_short_repr(value)}" for key, value in kwargs.items()]
    return f"{name}({', '.join(shown)})"


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not hide the error being named
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_ARGUMENT_REPR else text[:MAX_ARGUMENT_REPR - 3] + "..."


def _rebuild(factory: Callable[..., Streamer[Any]], args: tuple[Any, ...], kwargs: Any) -> Any:
    return factory(*args, **kwargs)


class Streamer(Generic[T]):
    """A restartable stream of items: each activation starts the source afresh.

    Parameters
    ----------
    source : generator function, callable or re-iterable
        A generator function or any callable returning an iterable (called
        with ``*args, **kwargs`` at each activation), or an iterable that can
        be iterated again and again (list, tuple, str, range, numpy array,
        another Streamer or mux).
    *args, **kwargs
        Arguments for ``source`` when it is callable.

    Raises
    ------
    SamplingError
        If ``source`` is a one-shot iterator (such as a generator object),
        which could not restart, or neither callable nor iterable, or if
        arguments are given for a source that is not callable.

    Notes
    -----
    Unlike pescador 3.0, ``iterate(max_iter)`` stops *before* pulling item
    ``max_iter + 1`` from the source, and a generator object is rejected at
    construction instead of silently yielding its items only once.

    Examples
    --------
    >>> def count(n):
    ...     yield from range(n)
    >>> stream = Streamer(count, 5)
    >>> list(stream)
    [0, 1, 2, 3, 4]
    >>> list(stream.iterate(max_iter=3))
    [0, 1, 2]
    >>> list(stream.cycle(max_iter=7))
    [0, 1, 2, 3, 4, 0, 1]
    >>> list(stream(max_iter=8, cycle=True))
    [0, 1, 2, 3, 4, 0, 1, 2]
    >>> list(Streamer("abc"))
    ['a', 'b', 'c']
    """

    source: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __init__(self, source: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(source, Streamer):
            callable_source = False
        elif isinstance(source, Iterator):
            raise SamplingError(
                f"source={source!r} is a one-shot iterator ({type(source).__name__}), which "
                "cannot restart at the next activation; pass the generator function itself "
                "(Streamer(function, *args)) or a re-iterable such as a list"
            )
        elif callable(source):
            callable_source = True
        elif isinstance(source, Iterable):
            callable_source = False
        else:
            raise SamplingError(
                "source must be a generator function, a callable returning an iterable or a "
                f"re-iterable, got source={source!r} ({type(source).__name__})"
            )
        if (args or kwargs) and not callable_source:
            raise SamplingError(
                f"arguments were given for source={source!r}, which is not callable "
                "and so cannot take them"
            )
        self.source = source
        self.args = args
        self.kwargs = kwargs
        self._callable_source = callable_source
        self._active = 0
        # Set by @streamable so that the streamer pickles by the decorated name.
        self._factory: Callable[..., Streamer[T]] | None = None

    # --- pescador compatibility -------------------------------------------------

    #: pescador's handle on an activation: None on every streamer, set only on
    #: the copy that ``with streamer as active`` returns (see ``__enter__``).
    stream_: Iterator[Any] | None = None

    @property
    def streamer(self) -> Any:
        """The source, under its pescador name."""
        return self.source

    @property
    def active(self) -> int:
        """The number of activations of this streamer currently open."""
        return self._active

    def __enter__(self) -> Streamer[T]:
        """Open an activation the pescador way, for subclasses written against it.

        As in pescador 3.0, ``with streamer as active`` leaves ``streamer``
        itself untouched (its ``stream_`` stays None) and returns a copy whose
        ``stream_`` is the fresh activation of the source; the copy keeps it
        after the block ends, and entering the copy again returns the copy.

        Examples
        --------
        >>> stream = Streamer("ab")
        >>> with stream as active:
        ...     items = list(active.stream_)
        ...     open_inside = stream.active
        >>> items, open_inside, stream.active, stream.stream_ is None
        (['a', 'b'], 1, 0, True)
        """
        if self.stream_ is not None:
            return self
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.stream_ = self._start(None)
        self._active += 1
        return copy

    def __exit__(self, *exc_info: object) -> None:
        if self.stream_ is None:
            self._active -= 1

    # --- activation -----------------------------------------------------------

    def _start(self, on_stream_error: StreamErrorHook | None) -> Iterator[T]:
        """Open one activation of the source (the hook muxes override).

        ``on_stream_error`` is handed down to the muxes this activation starts.
        """
        source = self.source
        if isinstance(source, Streamer):
            return activate(source, None, on_stream_error)
        if not self._callable_source:
            return iter(source)
        produced = source(*self.args, **self.kwargs)
        try:
            return iter(produced)
        except TypeError:
            raise SamplingError(
                f"source={source!r} returned {type(produced).__name__!s}, which is not iterable"
            ) from None

    def _activation(
        self, limit: int | None, on_stream_error: StreamErrorHook | None
    ) -> Iterator[T]:
        if limit == 0:
            return
        self._active += 1
        try:
            items = self._start(on_stream_error)
            try:
                if limit is None:
                    yield from items
                else:
                    # islice stops after `limit` items without asking for one more.
                    yield from itertools.islice(items, limit)
            finally:
                close_stream(items)
        except Exception as error:
            self._blame(error)
            raise
        finally:
            self._active -= 1

    def _blame(self, error: Exception) -> None:
        """Name this streamer on ``error`` (:func:`blamed_streamer`) if its own source raised
        it: a callable source, and no streamer inside it named yet."""
        if not self._callable_source or hasattr(error, _BLAMED):
            return
        try:
            setattr(error, _BLAMED, _describe_call(self.source, self.args, self.kwargs))
        except Exception:  # an exception type that takes no attributes goes unnamed
            return

    def iterate(self, max_iter: int | float | None = None) -> Iterator[T]:
        """Activate the streamer once and yield its items.

        Parameters
        ----------
        max_iter : int >= 0 or None
            The most items to yield; None runs the activation to its end.
            Item ``max_iter + 1`` is never pulled from the source.

        Returns
        -------
        iterator
            A fresh activation; the source is started at the first ``next()``.

        Examples
        --------
        >>> list(Streamer(range(10)).iterate(4))
        [0, 1, 2, 3]
        """
        return self._activation(check_max_iter(max_iter), None)

    def cycle(self, max_iter: int | float | None = None) -> Iterator[T]:
        """Yield items forever, starting a new activation whenever one ends.

        Parameters
        ----------
        max_iter : int >= 0 or None
            The most items to yield in total; None cycles forever.

        Raises
        ------
        SamplingError
            If an activation yields no item: cycling it would never yield
            anything (pescador loops forever instead).

        Examples
        --------
        >>> list(Streamer("ab").cycle(5))
        ['a', 'b', 'a', 'b', 'a']
        """
        return self._cycle(check_max_iter(max_iter))

    def _cycle(self, limit: int | None) -> Iterator[T]:
        remaining = limit
        while remaining is None or remaining > 0:
            produced = 0
            for produced, item in enumerate(self._activation(remaining, None), 1):  # noqa: B007
                yield item
            if produced == 0:
                raise SamplingError(
                    f"cannot cycle {self!r}: an activation yielded no items, so cycling it "
                    "would never yield anything"
                )
            if remaining is not None:
                remaining -= produced

    def __call__(self, max_iter: int | float | None = None, cycle: bool = False) -> Iterator[T]:
        """Iterate (``cycle=False``) or cycle (``cycle=True``), as in pescador.

        Examples
        --------
        >>> list(Streamer([1, 2])(cycle=True, max_iter=3))
        [1, 2, 1]
        """
        return self.cycle(max_iter) if cycle else self.iterate(max_iter)

    def __iter__(self) -> Iterator[T]:
        return self.iterate()

    # --- plumbing ---------------------------------------------------------------

    def __repr__(self) -> str:
        parts = [repr(self.source)]
        parts += [repr(arg) for arg in self.args]
        parts += [f"{key}={value!r}" for key, value in self.kwargs.items()]
        return f"{type(self).__name__}({', '.join(parts)})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._factory is not None:
            # The decorated function's module attribute is the factory, not the
            # raw generator function: pickle the call that rebuilds us.
            return _rebuild, (self._factory, self.args, self.kwargs)
        return super().__reduce_ex__(protocol)


def streamable(function: Callable[P, Iterable[T]]) -> Callable[P, Streamer[T]]:
    """Turn a generator function into a factory of :class:`Streamer` objects.

    Parameters
    ----------
    function : callable
        A generator function, or any callable returning an iterable.

    Returns
    -------
    callable
        Takes the same arguments as ``function`` and returns
        ``Streamer(function, *args, **kwargs)``.

    Examples
    --------
    >>> @streamable
    ... def letters(word):
    ...     yield from word
    >>> stream = letters("xyz")
    >>> list(stream), list(stream)
    (['x', 'y', 'z'], ['x', 'y', 'z'])
    """

    @functools.wraps(function)
    def make_streamer(*args: P.args, **kwargs: P.kwargs) -> Streamer[T]:
        streamer: Streamer[T] = Streamer(function, *args, **kwargs)
        streamer._factory = make_streamer
        return streamer

    return make_streamer
