"""Make each drawn item the server's own before the streamer runs again.

A streamer may write every sample into one array or one dict
(``buf[:] = ...; yield buf``). A sample waits in its data message until the message is encoded
and sent, and ZeroMQ (or the server, keeping frames for re-sending to a lost
trainer's audience or a rank's successor) still reads a zero-copy frame after
that; so the server takes each item out of the streamer's hands as it is drawn,
before the streamer is resumed. This module owns that step and nothing else: it
never encodes, never sends, and never keeps a reference to memory the streamer
can still write once the next item is drawn.

Two ways, item by item:

- Small samples that are flat dicts of numpy arrays, numpy scalars and plain
  values (the common shape, the one the codec stacks) are **stacked as they are
  drawn**: each array's bytes are taken as it is drawn (one C-level copy) and
  joined into the message's stacked leaf, with the checks the codec would make
  at encoding done then too. That copy replaces the stacking the codec would do
  anyway, so the safe default costs what the zero-copy option costs (measured
  drawing and encoding ``{'X': float32[16], 'y': int64}`` in 256-sample
  messages: 1.27-1.32 µs per sample, zero-copy 1.35-1.40, copying each item
  with :func:`own` 2.4; docs/performance.md has the end-to-end figures).
- Anything else (nested samples, large arrays, a sample of another shape than
  the chunk's rows) is copied by :func:`own`: arrays copied, containers rebuilt,
  immutable leaves shared. For a large array that is one memcpy, which the
  server pays on top of sending it over a socket (see docs/performance.md); while
  the server sends through the same-host shared-memory pool, the copy is made
  into the pool and is the only one (:func:`feedmux._plumbing.shm.owned_copy`).

Why not detect reuse instead: a streamer that reuses a buffer writes into it
*before* yielding it again, so by the time the same array is seen twice the
earlier sample has already changed; and an array's reference count cannot say
whether the streamer's own code still holds it (wrappers and muxes hold the
current item too). Copying as drawn is the one rule that never corrupts.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from feedmux._plumbing.shm import ShmPool, owned_copy
from feedmux.protocol import (
    SampleBatch,
    StackedLeaf,
    TensorError,
    is_tensor,
    stack_scalars,
    tensor_array,
)

__all__ = ["STACK_AS_DRAWN_BYTES", "DrawnItems", "own"]

#: Samples with at most this many bytes of array data are stacked as they are drawn;
#: bigger ones travel one or a few per message and are copied one by one.
STACK_AS_DRAWN_BYTES = 64 * 1024

_PLAIN_LEAF_TYPES = frozenset({str, bytes, int, float, bool, type(None)})
#: Kinds of numpy scalars whose type alone fixes their dtype (a numpy bool, integer,
#: float or complex scalar is always in native byte order), so the compiled check of a
#: sample skips reading ``.dtype`` (the dearest check of a small sample's scalar label).
#: Datetimes (their unit), strings, bytes and voids (their size) still compare dtypes.
_TYPE_FIXES_DTYPE = frozenset("biufc")


def own(item: Any, pool: ShmPool | None = None) -> Any:
    """``item`` with its arrays copied (into ``pool``, while the server sends through it:
    :func:`~feedmux._plumbing.shm.owned_copy`) and its containers rebuilt (the rest shared).

    Examples
    --------
    >>> buffer = np.zeros(2)
    >>> sample = own({"x": buffer, "tags": ("a", 1)})
    >>> buffer[:] = 7
    >>> sample["x"].tolist(), sample["tags"]
    ([0.0, 0.0], ('a', 1))
    """
    kind = type(item)
    if kind is np.ndarray:
        return owned_copy(item, pool)
    if kind is dict:
        return {key: own(value, pool) for key, value in item.items()}
    if kind is tuple or kind is list:
        return kind(own(value, pool) for value in item)
    if is_tensor(item):  # a torch CPU tensor: copied as the array viewing it
        try:
            return owned_copy(tensor_array(item), pool)
        except TensorError:
            return item  # the codec refuses it, saying where it sits and why
    return item


class _Stacked:
    """What the hook returns for an item it copied into the stacked rows."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<stacked row>"


STACKED = _Stacked()


class _FlatRows:
    """Rows of flat-dict samples shaped like one sample, gathered as they are drawn.

    An array leaf keeps each sample's bytes (``tobytes``: one C-level copy, in C
    order whatever the array's strides) and joins them into the stacked array in
    :meth:`take_batch`; numpy scalars and plain values are immutable and kept as
    they are. The per-sample step is compiled for the leaves of the sample (as
    :mod:`dataclasses` compiles ``__init__``): a loop over the leaves and a call
    through a dispatcher cost about 60 % more per sample than straight-line code
    (0.82 against 0.51 µs for ``{'X': float32[16], 'y': int64}``), and on small
    samples this step is most of what copying them costs. The rows are reused from
    one chunk to the next while the samples keep their shape.
    """

    def __init__(self, first: dict[Any, Any], other: Callable[[Any], Any]) -> None:
        self.keys = keys = tuple(first)
        #: (position in keys, each sample's bytes, shape, dtype) per array leaf.
        self.arrays: list[tuple[int, list[bytes], tuple[int, ...], np.dtype[Any]]] = []
        #: (position in keys, each sample's value, numpy scalar type or None, dtype or None)
        #: per other leaf.
        self.columns: list[tuple[int, list[Any], Any, Any]] = []
        for position, value in enumerate(first.values()):
            kind = type(value)
            if kind is np.ndarray:
                if value.dtype.hasobject or not value.dtype.itemsize:
                    raise _NotFlat  # refused by the codec, or no bytes to stack
                self.arrays.append((position, [], value.shape, value.dtype))
            elif isinstance(value, np.generic):
                self.columns.append((position, [], kind, value.dtype))
            elif kind in _PLAIN_LEAF_TYPES:
                self.columns.append((position, [], None, None))
            else:
                raise _NotFlat
        self._rows = self.arrays[0][1] if self.arrays else self.columns[0][1]
        #: ``accept(sample)``: copy ``sample`` into the next row and return True, or
        #: return False (keeping nothing of it) when it has another shape.
        #: ``hook(sample)``: the same, returning STACKED, or ``other(sample)``.
        self.accept, self.hook = self._compile(keys, other)

    @property
    def count(self) -> int:
        """How many samples the rows hold."""
        return len(self._rows)

    def _compile(self, keys: tuple[Any, ...], other: Callable[[Any], Any]) -> Any:
        getter = operator.itemgetter(*keys)
        bound: dict[str, Any] = {
            "keys": keys, "values": getter if len(keys) > 1 else lambda sample: (getter(sample),),
            "other": other, "stacked": STACKED,
        }
        kinds = ["plain"] * len(keys)
        for position, rows, shape, dtype in self.arrays:
            kinds[position] = "array"
            bound.update({f"shape{position}": shape, f"dtype{position}": dtype,
                          f"take{position}": rows.append})
        for position, column, scalar_type, dtype in self.columns:
            bound[f"take{position}"] = column.append
            if scalar_type is not None:
                bound[f"type{position}"] = scalar_type
                if dtype.kind in _TYPE_FIXES_DTYPE:
                    kinds[position] = "typed scalar"
                else:
                    kinds[position] = "scalar"
                    bound[f"dtype{position}"] = dtype
        make = _MAKERS.get(tuple(kinds))
        if make is None:
            if len(_MAKERS) > 256:
                _MAKERS.clear()
            make = _MAKERS[tuple(kinds)] = _compile_maker(kinds, sorted(bound))
        return make(**bound)

    @staticmethod
    def fits(sample: Any) -> bool:
        """Whether ``sample`` is a non-empty flat dict small enough to stack as drawn."""
        if type(sample) is not dict or not sample:
            return False
        size = sum(value.nbytes for value in sample.values() if type(value) is np.ndarray)
        return size <= STACK_AS_DRAWN_BYTES

    def take_batch(self) -> SampleBatch:
        """The rows as one batch of stacked leaves; the rows are empty again after."""
        count = self.count
        leaves: dict[int, StackedLeaf] = {}
        for position, rows, shape, dtype in self.arrays:
            stacked = np.frombuffer(b"".join(rows), dtype).reshape((count, *shape))
            rows.clear()
            leaves[position] = StackedLeaf(StackedLeaf.ARRAY, stacked)
        for position, column, scalar_type, dtype in self.columns:
            if scalar_type is None:
                leaves[position] = StackedLeaf(StackedLeaf.COLUMN, column.copy())
            else:
                leaves[position] = StackedLeaf(StackedLeaf.SCALAR, stack_scalars(column, dtype))
            column.clear()
        template = {key: leaves[position] for position, key in enumerate(self.keys)}
        return SampleBatch(template, count)


def _compile_maker(kinds: list[str], names: list[str]) -> Callable[..., Any]:
    """A function of ``names`` returning ``(accept, hook)`` for rows whose leaves are ``kinds``.

    The source holds only positions and the kinds' fixed checks: the keys, shapes,
    dtypes and lists are arguments, so no value of a sample reaches the source.
    """
    checks, copies, takes = [], [], []
    for position, kind in enumerate(kinds):
        value = f"v{position}"
        if kind == "array":
            checks.append(f"type({value}) is not nd or {value}.shape != shape{position} or "
                          f"({value}.dtype is not dtype{position} "
                          f"and {value}.dtype != dtype{position})")
            copies.append(f"{value} = {value}.tobytes()")
        elif kind == "scalar":
            checks.append(f"type({value}) is not type{position} or "
                          f"({value}.dtype is not dtype{position} "
                          f"and {value}.dtype != dtype{position})")
        elif kind == "typed scalar":
            checks.append(f"type({value}) is not type{position}")
        else:
            checks.append(f"type({value}) not in plain")
        takes.append(f"take{position}({value})")
    unpacked = "".join(f"v{position}, " for position in range(len(kinds)))

    def body(taken: str, refused: str) -> list[str]:
        return [
            "        if type(sample) is not dict or tuple(sample) != keys:",
            f"            return {refused}",
            f"        ({unpacked}) = values(sample)",
            *(f"        if {check}:\n            return {refused}" for check in checks),
            # Every copy before the first append: a failure leaves no half sample behind.
            *(f"        {copy}" for copy in copies),
            *(f"        {take}" for take in takes),
            f"        return {taken}",
        ]

    source = "\n".join([
        f"def make({', '.join(names)}):",
        "    def accept(sample):",
        *body("True", "False"),
        "    def hook(sample):",
        *body("stacked", "other(sample)"),
        "    return accept, hook",
    ])
    namespace: dict[str, Any] = {"nd": np.ndarray, "plain": _PLAIN_LEAF_TYPES}
    exec(compile(source, "<feedmux stacked rows>", "exec"), namespace)
    make: Callable[..., Any] = namespace["make"]
    return make


#: The compiled ``make`` of :func:`_compile_maker`, by the kinds of the leaves.
_MAKERS: dict[tuple[str, ...], Callable[..., Any]] = {}


class _NotFlat(Exception):
    """A sample cannot be stacked as drawn."""


class DrawnItems:
    """Makes each item the server's own as it is drawn, a chunk at a time.

    :meth:`start` begins a chunk and returns the hook to apply to each item as
    it is drawn (an :class:`~feedmux.sampling.epochs.EpochIterator`'s
    ``prepare``); the hook returns what stands for the item in the chunk, and
    :meth:`samples` turns the chunk's items into the samples to encode: a
    :class:`~feedmux.protocol.SampleBatch` over the rows stacked as drawn when
    every item of the chunk was, else a list of samples the server owns (their
    large arrays copied into ``pool``, the server's shared-memory pool, when given).

    Examples
    --------
    >>> drawn = DrawnItems()
    >>> buffer = np.zeros(2)
    >>> def reusing():
    ...     for index in range(3):
    ...         buffer[:] = index
    ...         yield {"x": buffer, "i": index}
    >>> hook = drawn.start()
    >>> samples = drawn.samples([hook(item) for item in reusing()])
    >>> type(samples).__name__, [(sample["x"].tolist(), sample["i"]) for sample in samples]
    ('SampleBatch', [([0.0, 0.0], 0), ([1.0, 1.0], 1), ([2.0, 2.0], 2)])
    """

    def __init__(self, pool: ShmPool | None = None) -> None:
        self.pool = pool
        #: The rows of the chunk (kept for the next while samples keep their shape).
        self._rows: _FlatRows | None = None

    def start(self) -> Callable[[Any], Any]:
        """Begin a chunk; the hook to call with each of its items as it is drawn."""
        return self._other if self._rows is None else self._rows.hook

    def _other(self, item: Any) -> Any:
        """An item the chunk's compiled hook did not take (or the chunk has none)."""
        rows = self._rows
        if rows is None and _FlatRows.fits(item):
            try:
                rows = self._rows = _FlatRows(item, self._other)
            except _NotFlat:
                return own(item, self.pool)
        if rows is not None and rows.accept(item):
            return STACKED
        return own(item, self.pool)

    def samples(self, items: list[Any]) -> Sequence[Any]:
        """The samples of the chunk begun by :meth:`start`, from ``items`` as the hook gave them."""
        rows = self._rows
        count = 0 if rows is None else rows.count
        if rows is None or not count:
            self._rows = None  # the next chunk takes its shape from its own first item
            return items
        batch = rows.take_batch()
        if count == len(items):
            return batch
        # Samples of another shape came in between: put each back in its place.
        samples, row = [], 0
        for item in items:
            if item is STACKED:
                item = batch[row]
                row += 1
            samples.append(item)
        return samples

    def abandon(self) -> None:
        """Forget the rows of a chunk whose drawing failed before it returned any item."""
        self._rows = None
