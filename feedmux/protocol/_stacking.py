"""Training batches: the samples of one step as one tree of stacked arrays.

A trainer that asks for ``batch_size=B`` gets each data message as one batch:
the samples' common tree (dict / list / tuple) with each leaf stacked across
them. This module owns what such a batch holds, on both ends. The sender
builds it with :func:`training_batch` (transport batching's stacking, plus
plain ``bool`` / ``int`` / ``float`` leaves turned into 1-d arrays, so that the
receiver finds every number in a buffer and builds no Python object per
sample); the receiver takes the tree with :func:`stacked_tree`. Strings,
bytes and None stay lists. It never reads or writes bytes and never decides
which samples form a batch (the server's batch assembler does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol._batch import COLUMN, SCALAR, SampleBatch, StackedLeaf, stack_samples

__all__ = ["stacked_tree", "take_rows", "training_batch"]

# The dtype a column of plain Python numbers becomes, by the set of their types.
_COLUMN_DTYPES: dict[frozenset[type], np.dtype[Any]] = {
    frozenset({bool}): np.dtype(np.bool_),
    frozenset({int}): np.dtype(np.int64),
    frozenset({float}): np.dtype(np.float64),
    frozenset({int, float}): np.dtype(np.float64),
}


def training_batch(samples: Sequence[Any]) -> SampleBatch:
    """``samples`` (one structure) as a :class:`SampleBatch` whose numbers are all arrays.

    Raises :class:`~feedmux.errors.ProtocolError` naming the first sample whose
    structure differs from the first one's.

    Examples
    --------
    >>> import numpy as np
    >>> batch = training_batch([{"x": np.zeros(2), "y": 1, "n": "a"},
    ...                         {"x": np.ones(2), "y": 2, "n": "b"}])
    >>> tree = stacked_tree(batch)
    >>> tree["x"].shape, tree["y"], tree["n"]
    ((2, 2), array([1, 2]), ['a', 'b'])
    """
    if type(samples) is SampleBatch:
        template = samples.template
    elif not samples:
        raise ProtocolError("expected at least one sample in a batch, got none")
    else:
        template = stack_samples(samples)
        if template is None:
            raise ProtocolError(
                f"expected the samples of one batch to share one structure (the same "
                f"containers and keys, numpy leaves of one dtype and shape), got "
                f"{_first_difference(samples)}"
            )
    return SampleBatch(_numeric_columns(template), len(samples))


def _numeric_columns(template: Any) -> Any:
    kind = type(template)
    if kind is StackedLeaf:
        if template.kind != COLUMN:
            return template
        dtype = _COLUMN_DTYPES.get(frozenset(map(type, template.values)))
        if dtype is None:
            return template
        try:
            values = np.array(template.values, dtype=dtype)
        except OverflowError:  # an int beyond int64 stays a Python int
            return template
        return StackedLeaf(SCALAR, values)
    if kind is dict:
        return {key: _numeric_columns(value) for key, value in template.items()}
    children = [_numeric_columns(value) for value in template]
    return children if kind is list else tuple(children)


def _first_difference(samples: Sequence[Any]) -> str:
    """Which sample differs from the first, in words."""
    for index in range(1, len(samples)):
        if stack_samples([samples[0], samples[index]]) is None:
            return (f"sample {index} of {len(samples)} ({_describe(samples[index])}) unlike "
                    f"sample 0 ({_describe(samples[0])})")
    return f"a sample of a type that cannot be stacked ({_describe(samples[0])})"


def _describe(sample: Any, depth: int = 0) -> str:
    if depth > 3:
        return "..."
    if isinstance(sample, np.ndarray):
        return f"{sample.dtype}{list(sample.shape)}"
    if type(sample) is dict:
        inner = ", ".join(f"{key!r}: {_describe(value, depth + 1)}"
                          for key, value in sample.items())
        return "{" + inner + "}"
    if type(sample) in (list, tuple):
        inner = ", ".join(_describe(value, depth + 1) for value in sample)
        return f"[{inner}]" if type(sample) is list else f"({inner})"
    return type(sample).__name__


def stacked_tree(samples: Sequence[Any]) -> Any:
    """The batch tree of a decoded data message's samples: stacked arrays, lists of strings.

    A stacked message (the usual case) costs one walk over its template; a
    message of unstacked samples (a batch of one) is stacked here.

    Examples
    --------
    >>> import numpy as np
    >>> stacked_tree([(np.float32(0.5), [1, "a"])])
    (array([0.5], dtype=float32), [array([1]), ['a']])
    """
    if type(samples) is not SampleBatch:
        samples = training_batch(samples)
    return samples.stacked()


def take_rows(tree: Any, rows: slice | Sequence[int]) -> Any:
    """The rows ``rows`` of a batch tree (from :func:`stacked_tree`), as a batch tree: for
    a slice, views of its arrays.

    Examples
    --------
    >>> import numpy as np
    >>> take_rows({"x": np.arange(4), "n": list("abcd")}, [0, 2])
    {'x': array([0, 2]), 'n': ['a', 'c']}
    >>> take_rows((np.arange(4), [np.arange(4)]), slice(1, 3))
    (array([1, 2]), [array([1, 2])])
    """
    kind = type(tree)
    if kind is dict:
        return {key: take_rows(value, rows) for key, value in tree.items()}
    if kind is tuple:
        return tuple(take_rows(value, rows) for value in tree)
    if kind is list:
        # A leaf's column holds plain values; a list container holds trees.
        if tree and not isinstance(tree[0], _TREE_TYPES):
            return tree[rows] if type(rows) is slice else [tree[row] for row in rows]
        return [take_rows(value, rows) for value in tree]
    return tree[rows] if type(rows) is slice else tree[np.asarray(rows, dtype=np.intp)]


_TREE_TYPES = (np.ndarray, list, tuple, dict)
