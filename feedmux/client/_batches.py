"""What a loader that asked for batches checks and says about them.

This module owns the trainer's side of ``RemoteLoader(..., batch_size=B,
drop_last=..., bucket_by=..., pad=...)`` that is not a socket: the checks of
those arguments, :class:`BatchMeta`, where a handed-out batch came from, and
a bucketed batch's variable-length leaves handed out as lists or padded with
a mask (:func:`~feedmux.protocol.ragged_tree`: numpy over the lengths the
server sent, no Python step per sample when padded). The batches
themselves are built by the server (``feedmux.server._delivery.batches``) and taken
from a message's stacked leaves by :func:`feedmux.protocol.stacked_tree`; this
module must never build or look at a single sample.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from feedmux.errors import ConfigurationError
from feedmux.protocol import SampleBatch, ragged_tree, stacked_tree, take_rows

__all__ = ["BatchMeta", "batch_meta", "batch_step", "check_batches", "check_buckets",
           "unpacked"]


class BatchMeta(NamedTuple):
    """Where a batch came from: the server's epoch (1-based), the position in that epoch
    of each of its samples (an int64 array) and the id of the server that sent it."""

    epoch: int
    positions: np.ndarray
    server_id: str


def batch_meta(tags: Any, server_id: str) -> BatchMeta:
    """The :class:`BatchMeta` of a batch tagged ``tags`` (rows of (epoch, position)).

    Examples
    --------
    >>> import numpy as np
    >>> batch_meta(np.array([[2, 6], [2, 7]]), "s1")
    BatchMeta(epoch=2, positions=array([6, 7]), server_id='s1')
    """
    return BatchMeta(int(tags[0, 0]), tags[:, 1], server_id)


def batch_step(tree: Any, tags: Any, start: int, stop: int, server_id: str,
               with_meta: bool) -> Any:
    """What a batch loader's ``next()`` returns for rows ``start .. stop - 1`` of a
    message's batch tree (tagged ``tags``): the batch (views of the tree's arrays), or
    ``(BatchMeta, batch)``.

    Examples
    --------
    >>> import numpy as np
    >>> tags = np.array([[1, 0], [1, 1], [1, 2]])
    >>> batch_step({"y": np.arange(3)}, tags, 2, 3, "s", with_meta=True)
    (BatchMeta(epoch=1, positions=array([2]), server_id='s'), {'y': array([2])})
    """
    batch = tree if start == 0 and stop == len(tags) else take_rows(tree, slice(start, stop))
    return (batch_meta(tags[start:stop], server_id), batch) if with_meta else batch


def check_batches(batch_size: Any, drop_last: Any) -> None:
    """Refuse a ``batch_size`` / ``drop_last`` pair a server could not serve.

    Examples
    --------
    >>> check_batches(256, True), check_batches(None, False)
    (None, None)
    >>> check_batches(0, False)
    Traceback (most recent call last):
    ...
    feedmux.errors.ConfigurationError: expected batch_size None or an int >= 1, got 0
    >>> check_batches(None, True)
    Traceback (most recent call last):
    ...
    feedmux.errors.ConfigurationError: expected drop_last=False without batch_size (it \
says what happens to an epoch's last, partial batch), got drop_last=True
    """
    if batch_size is not None and not (type(batch_size) is int and batch_size >= 1):
        raise ConfigurationError(f"expected batch_size None or an int >= 1, got {batch_size!r}")
    _check_batch_flag("drop_last", drop_last, batch_size,
                      "it says what happens to an epoch's last, partial batch")


def check_buckets(bucket_by: Any, pad: Any, batch_size: Any) -> None:
    """Refuse ``bucket_by`` / ``pad`` a server could not serve to this loader.

    Examples
    --------
    >>> check_buckets("tokens", True, 32), check_buckets(None, False, None)
    (None, None)
    >>> check_buckets("tokens", False, None)
    Traceback (most recent call last):
    ...
    feedmux.errors.ConfigurationError: expected bucket_by with batch_size= (the server groups \
samples of similar length into the batches it builds), got bucket_by='tokens', batch_size=None
    """
    if bucket_by is not None and not (type(bucket_by) is str and bucket_by):
        raise ConfigurationError(f"expected bucket_by None or a field name, got {bucket_by!r}")
    if bucket_by is not None and batch_size is None:
        raise ConfigurationError(
            f"expected bucket_by with batch_size= (the server groups samples of similar length "
            f"into the batches it builds), got bucket_by={bucket_by!r}, batch_size=None")
    _check_batch_flag("pad", pad, batch_size, "it pads the variable-length leaves of a batch")


def _check_batch_flag(name: str, value: Any, batch_size: Any, meaning: str) -> None:
    """Refuse a flag that is not a bool, or that is set without ``batch_size``."""
    if type(value) is not bool:
        raise ConfigurationError(f"expected {name} a bool, got {value!r}")
    if value and batch_size is None:
        raise ConfigurationError(
            f"expected {name}=False without batch_size ({meaning}), got {name}=True")


def unpacked(samples: Any, batched: bool, pad: bool = False) -> Any:
    """What a loader hands out of a decoded message's ``samples``: one batch tree
    (``batched``: its stacked leaves, no sample built; a bucketed batch's padded leaves
    as lists, or as :class:`~feedmux.protocol.Padded` with ``pad``), or a list of every
    sample.

    A stacked message's samples are built at once (C-level splits of the stacked
    leaves): handing them out is then a list lookup, not a chain of Python calls
    per sample and leaf.

    Examples
    --------
    >>> import numpy as np
    >>> unpacked([{"y": 1}, {"y": 2}], batched=True)
    {'y': array([1, 2])}
    """
    if batched:
        return ragged_tree(stacked_tree(samples), pad)
    if type(samples) is SampleBatch:
        return samples.unstacked()
    return samples
