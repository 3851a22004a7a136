"""Turn a streamer's epochs into encoded data messages (transport batching).

Shared by the in-process sampler and the sampling worker processes. It pulls
``(epoch, position, item)`` from an :class:`~feedmux.server.epochs.EpochIterator`,
groups items into data messages and hands each message's frames to a ``send``
callable. It owns no socket: ``send`` decides where the frames go and reports
whether the server is still running.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol import Data, Error, encode
from feedmux.server.mux import on_stream_error

__all__ = [
    "BatchPolicy",
    "Frames",
    "error_message",
    "produce",
]

log = logging.getLogger("feedmux.server")

Frames = Sequence[Any]

#: Most samples one data message carries when the caller does not fix it.
MAX_SAMPLES_PER_MESSAGE = 256
#: Target payload of one data message; bigger samples travel one per message.
TARGET_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class BatchPolicy:
    """How samples are grouped into data messages.

    Parameters
    ----------
    samples_per_message : int or None
        A fixed count, or None to size each message from its first sample:
        as many samples as fit in ``TARGET_MESSAGE_BYTES``, at most
        ``MAX_SAMPLES_PER_MESSAGE``.
    max_delay : float
        Seconds a message may wait for more samples before it is sent anyway,
        so a slow sampler does not hold finished samples back.
    """

    samples_per_message: int | None = None
    max_delay: float = 0.005

    def limit_for(self, first_sample: Any) -> int:
        """How many samples the message starting with ``first_sample`` may hold."""
        if self.samples_per_message is not None:
            return self.samples_per_message
        size = max(1, _payload_bytes(first_sample))
        return max(1, min(MAX_SAMPLES_PER_MESSAGE, TARGET_MESSAGE_BYTES // size))


def _payload_bytes(sample: Any) -> int:
    """Bytes of array data in a sample (containers walked; other leaves count 8)."""
    if isinstance(sample, np.ndarray):
        return int(sample.nbytes)
    if isinstance(sample, dict):
        return sum(_payload_bytes(value) for value in sample.values())
    if isinstance(sample, (list, tuple)):
        return sum(_payload_bytes(value) for value in sample)
    if isinstance(sample, (str, bytes)):
        return len(sample)
    return 8


def error_message(error: BaseException, server_id: str) -> Error:
    """The wire message that carries ``error`` (type, message, traceback) to trainers."""
    kind = type(error)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    text = "".join(traceback.format_exception(kind, error, error.__traceback__))
    return Error(type=name, message=str(error), traceback=text, server_id=server_id)


def _encode_batch(
    tags: list[tuple[int, int]], samples: list[Any], server_id: str, seq: int, skip_bad: bool
) -> tuple[list[Any], int]:
    """Encode one data message; with ``skip_bad``, drop samples the codec refuses.

    Returns the frames (empty when nothing was left) and how many samples they hold.
    """
    try:
        data = Data(np.array(tags, dtype=np.int64), samples, server_id, seq)
        return list(encode(data)), len(samples)
    except ProtocolError:
        if not skip_bad:
            raise
    kept_tags, kept = [], []
    for tag, sample in zip(tags, samples, strict=True):
        try:
            encode(Data(np.array([tag], dtype=np.int64), [sample], server_id, seq))
        except ProtocolError as error:
            log.warning("skipping sample %s that cannot be encoded: %s", tag, error)
            continue
        kept_tags.append(tag)
        kept.append(sample)
    if not kept:
        return [], 0
    return list(encode(Data(np.array(kept_tags, dtype=np.int64), kept, server_id, seq))), len(kept)


def produce(
    items: Iterator[tuple[int, int, Any]],
    send: Callable[[Frames], bool],
    *,
    policy: BatchPolicy,
    server_id: str,
    skip_errors: bool = False,
    epoch_done: Callable[[int, int], bool] = lambda epoch, count: True,
) -> int:
    """Pull items, batch and encode them, and ``send`` each message; return samples sent.

    A message never spans two epochs: when an item of a new epoch arrives, the
    message in progress is sent first and ``epoch_done(epoch, count)`` is
    called with the epoch that just ended and the number of samples it had;
    the last epoch is reported once ``items`` is exhausted. Sampling stops when
    ``items`` is exhausted or ``send`` / ``epoch_done`` return False (the
    server is stopping). With ``skip_errors`` an exception from the streamer
    is logged and sampling goes on; otherwise it propagates after the samples
    already drawn have been sent. Inside a mux, a stream that raises is
    skipped alone (the mux goes on with its other streams); a top-level
    streamer that raises abandons the rest of its epoch.
    """
    token = on_stream_error.set(_log_skipped) if skip_errors else None
    try:
        return _produce(items, send, policy, server_id, skip_errors, epoch_done)
    finally:
        if token is not None:
            on_stream_error.reset(token)


def _log_skipped(error: BaseException) -> None:
    log.warning("a stream raised %s: %s; skipping the rest of it", type(error).__name__, error,
                exc_info=error)


def _produce(
    items: Iterator[tuple[int, int, Any]],
    send: Callable[[Frames], bool],
    policy: BatchPolicy,
    server_id: str,
    skip_errors: bool,
    epoch_done: Callable[[int, int], bool],
) -> int:
    seq = 0
    sent = 0
    clock = time.monotonic
    carry: tuple[int, int, Any] | None = None
    current_epoch = 0
    epoch_count = 0
    pending_error: BaseException | None = None
    finished = False
    while not finished and pending_error is None:
        tags: list[tuple[int, int]] = []
        samples: list[Any] = []
        limit = 1
        deadline = 0.0
        epoch_ended = False
        while True:
            if carry is not None:
                epoch, position, item = carry
                carry = None
            else:
                try:
                    epoch, position, item = next(items)
                except StopIteration:
                    finished = True
                    break
                except Exception as error:
                    if not skip_errors:
                        pending_error = error
                        break
                    log.warning(
                        "streamer raised %s: %s; skipping it",
                        type(error).__name__, error, exc_info=error,
                    )
                    continue
            if epoch != current_epoch:
                if samples or epoch_count:
                    carry = (epoch, position, item)
                    epoch_ended = True
                    break
                current_epoch = epoch
            if not samples:
                limit = policy.limit_for(item)
                deadline = clock() + policy.max_delay
            tags.append((epoch, position))
            samples.append(item)
            if len(samples) >= limit or clock() >= deadline:
                break
        if samples:
            frames, count = _encode_batch(tags, samples, server_id, seq, skip_errors)
            if frames:
                if not send(frames):
                    return sent
                seq += 1
                sent += count
                epoch_count += count
        if (epoch_ended or finished) and epoch_count:
            if not epoch_done(current_epoch, epoch_count):
                return sent
            epoch_count = 0
            if carry is not None:
                current_epoch = carry[0]
    if pending_error is not None:
        raise pending_error
    return sent
