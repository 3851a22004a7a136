"""Maps: functions that reshape a stream of dict items (batches, tuples).

This module owns pescador's three maps, :func:`buffer_stream`,
:func:`tuples` and :func:`keras_tuples`. Each checks its arguments when
called and returns a generator over the input stream; items that cannot be
combined raise :class:`~feedmux.errors.DataError` naming the key and the
shapes. It is pure and must never hold more than one batch of items.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from feedmux.errors import DataError, SamplingError

__all__ = ["MissingKeyError", "buffer_stream", "keras_tuples", "tuples"]


class MissingKeyError(DataError, KeyError):
    """An item lacks a requested key (also a ``KeyError``, as in pescador)."""

    def __str__(self) -> str:
        # KeyError would quote the whole message.
        return str(self.args[0]) if self.args else ""


def _shape(value: object) -> tuple[int, ...] | str:
    try:
        return tuple(np.asarray(value).shape)
    except ValueError:
        return "ragged"


def _describe(item: object) -> str:
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


def _stack(batch: list[Any], axis: int | None, first: int) -> dict[Hashable, np.ndarray]:
    keys: list[Hashable] | None = None
    for offset, item in enumerate(batch):
        if not isinstance(item, Mapping):
            raise DataError(
                f"cannot batch item {first + offset}, {_describe(item)} "
                f"({type(item).__name__}): buffer_stream expects dicts of arrays"
            )
        if keys is None:
            keys = list(item)
        elif item.keys() != set(keys):
            raise DataError(
                f"cannot batch item {first + offset}: its keys {sorted(map(str, item))} differ "
                f"from those of item {first}, {sorted(map(str, keys))}"
            )
    batched: dict[Hashable, np.ndarray] = {}
    for key in keys or []:
        values = [item[key] for item in batch]
        try:
            if axis is None:
                batched[key] = np.stack(values)
            else:
                batched[key] = np.concatenate(values, axis=axis)
        except (ValueError, TypeError) as error:
            shapes = [_shape(value) for value in values]
            distinct = sorted(set(shapes), key=str)
            how = "stack" if axis is None else f"concatenate along axis={axis}"
            raise DataError(
                f"cannot {how} key {key!r} of items {first}..{first + len(batch) - 1}: "
                f"shapes {distinct} ({error})"
            ) from error
    return batched


def buffer_stream(
    stream: Iterable[Mapping[Any, Any]],
    buffer_size: int,
    partial: bool = False,
    axis: int | None = None,
) -> Iterator[dict[Hashable, np.ndarray]]:
    """Group the items of a stream of dicts into batches of ``buffer_size``.

    Parameters
    ----------
    stream : iterable of dict
        Items that are dicts of arrays (or of scalars) with the same keys.
    buffer_size : int >= 1
        Items per batch.
    partial : bool
        Whether to yield the last, smaller batch when the stream ends.
    axis : int or None
        None stacks the values of a key along a new first axis; an int
        concatenates them along that existing axis (to merge batches).

    Returns
    -------
    iterator of dict
        One dict of arrays per batch.

    Raises
    ------
    SamplingError
        At the call, on a bad ``buffer_size`` or ``axis``.
    DataError
        During iteration, if an item is not a dict, has other keys than the
        first item of its batch, or has values that cannot be stacked (the
        message names the key and the shapes).

    Examples
    --------
    >>> items = [{"x": np.array([i, i]), "y": i % 2} for i in range(5)]
    >>> batches = list(buffer_stream(items, 2, partial=True))
    >>> [batch["x"].shape for batch in batches]
    [(2, 2), (2, 2), (1, 2)]
    >>> batches[0]["y"]
    array([0, 1])
    >>> merged = next(buffer_stream(batches, 2, axis=0))
    >>> merged["x"].shape
    (4, 2)
    """
    if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 1:
        raise SamplingError(f"buffer_size must be an int >= 1, got buffer_size={buffer_size!r}")
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise SamplingError(f"axis must be None or an int, got axis={axis!r}")
    return _buffer(stream, buffer_size, bool(partial), axis)


def _buffer(
    stream: Iterable[Mapping[Any, Any]], buffer_size: int, partial: bool, axis: int | None
) -> Iterator[dict[Hashable, np.ndarray]]:
    batch: list[Any] = []
    first = 0
    for item in stream:
        batch.append(item)
        if len(batch) == buffer_size:
            stacked = _stack(batch, axis, first)
            first += buffer_size
            batch = []
            yield stacked
    if batch and partial:
        yield _stack(batch, axis, first)


def _get(item: object, key: Any, position: int) -> Any:
    if not isinstance(item, Mapping):
        raise DataError(
            f"item {position}, {_describe(item)} ({type(item).__name__}), is not a dict"
        )
    try:
        return item[key]
    except KeyError:
        raise MissingKeyError(
            f"item {position} has no key {key!r}; its keys are {sorted(map(str, item))}"
        ) from None


def tuples(stream: Iterable[Mapping[Any, Any]], *keys: Any) -> Iterator[tuple[Any, ...]]:
    """Turn each dict item into the tuple of its values at ``keys``.

    Parameters
    ----------
    stream : iterable of dict
        The items.
    *keys
        The keys, in the order of the tuple; at least one.

    Raises
    ------
    SamplingError
        At the call, if no key is given.
    DataError
        During iteration, if an item is not a dict or lacks a key (the
        latter is also a ``KeyError``).

    Examples
    --------
    >>> list(tuples([{"x": 1, "y": 2}, {"x": 3, "y": 4}], "y", "x"))
    [(2, 1), (4, 3)]
    """
    if not keys:
        raise SamplingError("tuples needs at least one key, got keys=()")
    return _tuples(stream, keys)


def _tuples(
    stream: Iterable[Mapping[Any, Any]], keys: tuple[Any, ...]
) -> Iterator[tuple[Any, ...]]:
    for position, item in enumerate(stream):
        yield tuple(_get(item, key, position) for key in keys)


def _keys(value: str | Sequence[str] | None, argument: str) -> tuple[list[Any], bool]:
    if value is None:
        return [], False
    if isinstance(value, str):
        return [value], True
    try:
        return list(value), False
    except TypeError:
        raise SamplingError(
            f"{argument} must be None, a key or a list of keys, got {argument}={value!r}"
        ) from None


def keras_tuples(
    stream: Iterable[Mapping[Any, Any]],
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """Turn each dict item into an ``(inputs, outputs)`` pair as Keras expects.

    Parameters
    ----------
    stream : iterable of dict
        The items.
    inputs, outputs : key, list of keys or None
        A single key gives the value itself, a list gives a list of values,
        None gives None. At least one key must be given in all.

    Raises
    ------
    SamplingError
        At the call, if neither ``inputs`` nor ``outputs`` names a key.
    DataError
        During iteration, if an item is not a dict or lacks a key.

    Examples
    --------
    >>> item = {"a": 1, "b": 2, "c": 3}
    >>> next(keras_tuples([item], inputs="a", outputs=["b", "c"]))
    (1, [2, 3])
    >>> next(keras_tuples([item], inputs=["a"]))
    ([1], None)
    """
    input_keys, single_input = _keys(inputs, "inputs")
    output_keys, single_output = _keys(outputs, "outputs")
    if not input_keys and not output_keys:
        raise SamplingError(
            f"keras_tuples needs at least one key in inputs or outputs, got "
            f"inputs={inputs!r}, outputs={outputs!r}"
        )
    return _keras(stream, input_keys, single_input, output_keys, single_output)


def _keras(
    stream: Iterable[Mapping[Any, Any]],
    input_keys: list[Any],
    single_input: bool,
    output_keys: list[Any],
    single_output: bool,
) -> Iterator[tuple[Any, Any]]:
    for position, item in enumerate(stream):
        x: Any = [_get(item, key, position) for key in input_keys] or None
        y: Any = [_get(item, key, position) for key in output_keys] or None
        if single_input:
            x = x[0]
        if single_output:
            y = y[0]
        yield (x, y)
