"""Training batches of variable-length arrays: padded on the way, a list or a mask at the end.

A bucketed batch (``bucket_by=``, docs/ddp.md) holds samples of different
lengths. Its *length-led* leaves, the arrays whose first dimension is the
sample's length (``bucket_by``'s value) in every sample of the batch, travel
as one array padded with zeros to the batch's longest, beside the lengths:
the leaf's place in the batch tree holds ``{PADDED: values, LENGTHS:
lengths}`` (both with a row per sample, so a batch's rows can still be cut as
any batch's). Every other leaf is stacked as in :func:`training_batch`. The
receiver turns each such pair into what the trainer asked for
(:func:`ragged_tree`): a list of the samples' arrays (views), or
:class:`Padded`, the padded array and its mask, built by numpy from the
lengths with no Python step per sample. It never reads or writes bytes and
never decides which samples form a batch. A bucketed batch passed on as samples
(a lost trainer's rest, dealt again to trainers of other shapes) has each padded
leaf cut back to its samples' own arrays (:func:`without_padding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol._batch import ARRAY, SCALAR, SampleBatch, StackedLeaf
from feedmux.protocol._stacking import training_batch

__all__ = ["LENGTHS", "PADDED", "Padded", "gathered", "padded_batch", "ragged_tree",
           "stacked_batch", "without_padding"]

#: The two keys of a padded leaf's place in a batch tree.
PADDED, LENGTHS = "__feedmux_padded__", "__feedmux_lengths__"


class Padded(NamedTuple):
    """A batch's variable-length leaf: ``values`` padded with zeros to the batch's longest
    (``(batch, longest, ...)``) and ``mask``, True where a value is a sample's own."""

    values: np.ndarray
    mask: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """Each sample's length."""
        lengths: np.ndarray = self.mask.sum(axis=1)
        return lengths


def padded_batch(samples: Sequence[Any], lengths: Sequence[int] | np.ndarray) -> SampleBatch:
    """``samples`` (of ``lengths``) as one batch, each length-led leaf padded.

    Examples
    --------
    >>> import numpy as np
    >>> batch = padded_batch([{"x": np.arange(2), "y": 1}, {"x": np.arange(3), "y": 2}], [2, 3])
    >>> tree = batch.stacked()
    >>> tree["x"][PADDED].tolist(), tree["x"][LENGTHS].tolist(), tree["y"].tolist()
    ([[0, 1, 0], [0, 1, 2]], [2, 3], [1, 2])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    batch = stacked_batch(samples, lengths)
    if batch is None:
        return SampleBatch(_template(list(samples), lengths), len(samples))
    return batch


def stacked_batch(samples: Sequence[Any], lengths: np.ndarray) -> SampleBatch | None:
    """``samples`` as one batch when they stack without padding (the usual case for small
    samples, whose leaves are numbers; a length-led leaf of samples all equally long comes in
    the padded form, with no padding), else None.

    Examples
    --------
    >>> import numpy as np
    >>> stacked_batch([{"n": 1}, {"n": 2}], np.array([1, 2])).stacked()
    {'n': array([1, 2])}
    >>> stacked_batch([{"x": np.zeros(1)}, {"x": np.zeros(2)}], np.array([1, 2])) is None
    True
    """
    try:
        template = training_batch(samples).template
    except ProtocolError:
        return None
    return SampleBatch(_length_led_stacked(template, lengths), len(samples))


def gathered(parts: Sequence[tuple[SampleBatch, np.ndarray]], back: np.ndarray,
             lengths: np.ndarray) -> SampleBatch | None:
    """The rows ``rows`` of each ``(batch, rows)`` of ``parts`` (batches of one layout, their
    numbers stacked), joined, then taken in the order ``back``, as one batch (with
    :func:`stacked_batch`'s padded form of length-led leaves): one numpy gather per leaf
    and part, no sample built; None when the parts' layouts differ.

    Examples
    --------
    >>> import numpy as np
    >>> batch = training_batch([{"x": np.full(2, i), "n": i} for i in range(4)])
    >>> tree = gathered([(batch, np.array([3, 0])), (batch, np.array([1]))],
    ...                 np.array([2, 0, 1]), np.array([1, 3, 0])).stacked()
    >>> tree["x"].tolist(), tree["n"].tolist()
    ([[1, 1], [3, 3], [0, 0]], [1, 3, 0])
    """
    try:
        template = _gathered([batch.template for batch, _ in parts],
                             [rows for _, rows in parts], back)
    except _Mismatch:
        return None
    return SampleBatch(_length_led_stacked(template, lengths), len(back))


class _Mismatch(Exception):
    """The parts of :func:`gathered` differ in layout."""


def _gathered(templates: list[Any], picks: list[np.ndarray], back: np.ndarray) -> Any:
    first = templates[0]
    kind = type(first)
    if any(type(template) is not kind for template in templates):
        raise _Mismatch
    if kind is StackedLeaf:
        leaf_kind = first.kind
        if any(template.kind != leaf_kind for template in templates):
            raise _Mismatch
        if type(first.values) is list:
            values = [v for template, rows in zip(templates, picks, strict=True)
                      for v in [template.values[row] for row in rows.tolist()]]
            return StackedLeaf(leaf_kind, [values[row] for row in back.tolist()])
        arrays = [template.values[rows] for template, rows in zip(templates, picks, strict=True)]
        if any(a.dtype != arrays[0].dtype or a.shape[1:] != arrays[0].shape[1:]
               for a in arrays):
            raise _Mismatch
        joined = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        return StackedLeaf(leaf_kind, joined[back])
    if kind is dict:
        if any(template.keys() != first.keys() for template in templates):
            raise _Mismatch
        return {key: _gathered([t[key] for t in templates], picks, back) for key in first}
    if any(len(template) != len(first) for template in templates):
        raise _Mismatch
    children = [_gathered([t[i] for t in templates], picks, back) for i in range(len(first))]
    return children if kind is list else tuple(children)


def _length_led_stacked(template: Any, lengths: np.ndarray) -> Any:
    """A stacked template with each array leaf whose first dimension is every sample's
    length in the padded form (no padding: the samples are equally long)."""
    kind = type(template)
    if kind is StackedLeaf:
        values = template.values
        if (template.kind == ARRAY and values.ndim >= 2 and len(lengths)
                and (lengths == values.shape[1]).all()):
            return {PADDED: template, LENGTHS: StackedLeaf(SCALAR, lengths)}
        return template
    if kind is dict:
        return {key: _length_led_stacked(value, lengths) for key, value in template.items()}
    children = [_length_led_stacked(value, lengths) for value in template]
    return children if kind is list else tuple(children)


def _template(values: list[Any], lengths: np.ndarray) -> Any:
    first = values[0]
    kind = type(first)
    if kind is dict and all(type(v) is dict and v.keys() == first.keys() for v in values):
        return {key: _template([v[key] for v in values], lengths) for key in first}
    if kind in (list, tuple) and all(type(v) is kind and len(v) == len(first) for v in values):
        children = [_template([v[i] for v in values], lengths) for i in range(len(first))]
        return children if kind is list else tuple(children)
    if _length_led(values, lengths):
        return {PADDED: StackedLeaf(ARRAY, _padded(values, lengths)),
                LENGTHS: StackedLeaf(SCALAR, lengths)}
    return training_batch(values).template


def _length_led(values: list[Any], lengths: np.ndarray) -> bool:
    first = values[0]
    if not (isinstance(first, np.ndarray) and first.ndim >= 1 and not first.dtype.hasobject):
        return False
    dtype, rest = first.dtype, first.shape[1:]
    return all(type(v) is np.ndarray and v.dtype == dtype and v.shape[1:] == rest
               and v.shape[0] == length for v, length in zip(values, lengths.tolist(), strict=True))


def _padded(values: list[np.ndarray], lengths: np.ndarray) -> np.ndarray:
    longest = int(lengths.max()) if len(lengths) else 0
    first = values[0]
    out = np.zeros((len(values), longest, *first.shape[1:]), dtype=first.dtype)
    out[np.arange(longest) < lengths[:, None]] = np.concatenate(values)
    return out


def ragged_tree(tree: Any, pad: bool) -> Any:
    """``tree`` (a batch tree) with each padded leaf as :class:`Padded` (``pad``), or as a
    list of the samples' arrays (views of the padded one).

    Examples
    --------
    >>> import numpy as np
    >>> tree = {"x": {PADDED: np.array([[1, 0, 0], [1, 2, 0]]), LENGTHS: np.array([1, 2])}}
    >>> ragged_tree(tree, pad=False)["x"]
    [array([1]), array([1, 2])]
    >>> padded = ragged_tree(tree, pad=True)["x"]
    >>> padded.values.tolist(), padded.mask.tolist(), padded.lengths.tolist()
    ([[1, 0], [1, 2]], [[True, False], [True, True]], [1, 2])
    """
    kind = type(tree)
    if kind is dict:
        if PADDED in tree and len(tree) == 2 and LENGTHS in tree:
            return _unpadded(tree[PADDED], tree[LENGTHS], pad)
        return {key: ragged_tree(value, pad) for key, value in tree.items()}
    if kind is tuple:
        return tuple(ragged_tree(value, pad) for value in tree)
    if kind is list and tree and isinstance(tree[0], (list, tuple, dict)):
        return [ragged_tree(value, pad) for value in tree]
    return tree


def _unpadded(values: np.ndarray, lengths: np.ndarray, pad: bool) -> Any:
    longest = int(lengths.max()) if len(lengths) else 0
    values = values[:, :longest]  # rows cut from a longer batch: as long as their longest
    if pad:
        return Padded(values, np.arange(longest) < lengths[:, None])
    return [values[row, :length] for row, length in enumerate(lengths.tolist())]


def without_padding(samples: Sequence[Any]) -> Sequence[Any]:
    """``samples`` (a decoded message's) as they were sampled: when they are a bucketed
    batch, a list of its samples, each padded leaf cut back to the sample's own array;
    else ``samples`` itself (one look at the batch's template, no sample built).

    Examples
    --------
    >>> import numpy as np
    >>> batch = padded_batch([{"x": np.arange(2), "y": 1}, {"x": np.arange(3), "y": 2}], [2, 3])
    >>> [(sample["x"].tolist(), int(sample["y"])) for sample in without_padding(batch)]
    [([0, 1], 1), ([0, 1, 2], 2)]
    >>> plain = [{"y": 1}]
    >>> without_padding(plain) is plain
    True
    """
    if type(samples) is not SampleBatch or not _holds_padded(samples.template):
        return samples
    return [_cut_to_length(sample) for sample in samples.unstacked()]


def _holds_padded(template: Any) -> bool:
    kind = type(template)
    if kind is dict:
        if len(template) == 2 and PADDED in template and LENGTHS in template:
            return True
        return any(_holds_padded(value) for value in template.values())
    if kind in (list, tuple):
        return any(_holds_padded(value) for value in template)
    return False


def _cut_to_length(sample: Any) -> Any:
    kind = type(sample)
    if kind is dict:
        if len(sample) == 2 and PADDED in sample and LENGTHS in sample:
            return sample[PADDED][:int(sample[LENGTHS])]
        return {key: _cut_to_length(value) for key, value in sample.items()}
    if kind is tuple:
        return tuple(_cut_to_length(value) for value in sample)
    if kind is list:
        return [_cut_to_length(value) for value in sample]
    return sample
