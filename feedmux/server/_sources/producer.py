"""Turn a streamer's epochs into encoded data messages (transport batching).

Shared by the in-process sampler and the sampling worker processes. It pulls
``(epoch, position, item)`` from an :class:`~feedmux.sampling.epochs.EpochIterator`,
groups items into data messages and hands each message's frames to a ``send``
callable. It owns no socket: ``send`` decides where the frames go and reports
whether the server is still running.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from feedmux._plumbing.shm import ShmPool, drawing_into
from feedmux._ratelog import RateLimitedLog
from feedmux.errors import DataError, ProtocolError, SkipLimitError
from feedmux.protocol import Data, Error, encode
from feedmux.sampling.epochs import Chunk, EpochIterator
from feedmux.sampling.streamer import StreamErrorHook, blamed_streamer, describe_streamer
from feedmux.server._delivery.batches import Batches, unstackable
from feedmux.server._delivery.dealing import RankDealer
from feedmux.server._delivery.outbox import Frames
from feedmux.server._delivery.ranking import RankedStage
from feedmux.server._sources.meters import SamplerMeter
from feedmux.server._sources.owning import DrawnItems, own
from feedmux.server._sources.policy import TARGET_MESSAGE_BYTES, BatchPolicy, payload_bytes
from feedmux.server._sources.skips import DEFAULT_MAX_SKIPS, SkipGuard

__all__ = [
    "Draw",
    "Pacer",
    "SampleErrors",
    "encode_batch",
    "error_message",
    "failure_text",
    "produce",
    "skip_epoch",
    "skip_logger",
    "unstackable",
]

log = logging.getLogger("feedmux.server")
#: A streamer that raises on every pull would otherwise write a traceback per pull.
error_log = RateLimitedLog(log)

#: ``fresh(epoch, positions) -> mask or None``: which samples nobody handed out yet (a
#: resumed run of free trainers); only those go out.
Fresh = Callable[[int, np.ndarray], "np.ndarray | None"]

#: A ranked chunk (one message per rank) may take up to this many times ``max_delay`` to
#: sample (320 ms at the default): up to this many ranks (8 hosts x 8 GPUs), each rank's
#: message is as full as a free trainer's; beyond, messages shrink. Held to ``max_delay``
#: alone, 64 ranks got 2 samples a message and a seventh of the two-rank rate; with 20
#: times, 0.80 of it; with 64, 1.0 (``benchmarks.bench_scale``). Only a fast sampler's
#: chunks grow: a slow one's are bounded by one sample a rank anyway.
RANK_CHUNK_DELAYS = 64
#: Most training batches (``batch_size=``) one data message carries: the trainer's cost
#: of a message is shared by its batches.
MAX_BATCHES_PER_MESSAGE = 16
#: About how long a message of several batches may take to fill (at least one batch
#: goes out, however long it takes): a trainer cannot start a step before its batch is
#: complete, and a step of a model on an accelerator takes tens of ms.
BATCH_MESSAGE_DELAY = 0.05


#: Most characters of an error's message and of its traceback on the wire: an Error must
#: fit in one control frame (``CONTROL_FRAME_BYTES``) on the trainer's side.
MAX_ERROR_TEXT = 12 * 1024


#: How ``--on-error skip`` would have gone on after a streamer's exception.
SKIP_HINT = ("`feedmux serve --on-error skip` (Server(on_error='skip')) would log it and skip "
             "the rest of that stream: inside a mux the other streams go on, a top-level "
             "streamer goes on with its next epoch")


def failure_text(error: BaseException) -> str:
    """``error``'s message, naming the streamer that raised it (its function's qualified
    name and arguments) and how ``--on-error skip`` would skip it, when a streamer did.

    Examples
    --------
    >>> failure_text(ValueError("bad row"))
    'bad row'
    """
    streamer = blamed_streamer(error)
    if streamer is None:
        return str(error)
    return f"{error} (raised by streamer {streamer}; {SKIP_HINT})"


def error_message(error: BaseException, server_id: str) -> Error:
    """The wire message that carries ``error`` (type, message, traceback) to trainers.

    Sent only to trainers about the server's own sampling; the message names the
    streamer that raised it (:func:`failure_text`), and keeps its head and the
    traceback its tail (the innermost frames) when they are too long.
    """
    kind = type(error)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    text = "".join(traceback.format_exception(kind, error, error.__traceback__))
    if len(text) > MAX_ERROR_TEXT:
        text = "...\n" + text[-MAX_ERROR_TEXT:]
    return Error(type=name[:256], message=failure_text(error)[:MAX_ERROR_TEXT], traceback=text,
                 server_id=server_id)


def skip_logger(meter: SamplerMeter, guard: SkipGuard) -> StreamErrorHook:
    """The hook that skips a stream's error inside a mux (``--on-error skip``): counted,
    checked against the guard's limits, logged naming the streamer (rate-limited)."""
    def log_skipped(error: BaseException) -> None:
        guard.skipped(error)
        meter.skipped()
        error_log.log(logging.WARNING, "stream", "%s; skipping the rest of that stream",
                      _raised(error), exc_info=error)
    return log_skipped


def _raised(error: BaseException) -> str:
    streamer = blamed_streamer(error)
    where = "a stream" if streamer is None else f"streamer {streamer}"
    return f"{where} raised {type(error).__name__}: {error}"


class SampleErrors:
    """How one sampling process handles what goes wrong with a sample: a streamer's
    exception or a sample the codec refuses is skipped (``skip``: counted in ``meter``,
    logged naming its streamer, checked by ``guard``) or raised naming it. ``source``
    describes the streamer the epochs are drawn from (a refused sample names it)."""

    def __init__(self, skip: bool, meter: SamplerMeter, source: str = "",
                 guard: SkipGuard | None = None) -> None:
        self.skip = skip
        self.meter = meter
        self.source = source
        self.guard = SkipGuard() if guard is None else guard

    def hook(self) -> StreamErrorHook | None:
        """What a mux does with a stream's exception (None: it propagates)."""
        return skip_logger(self.meter, self.guard) if self.skip else None

    def streamer_raised(self, error: Exception) -> None:
        """A top-level streamer raised: re-raise it, or (``skip``) count and log it."""
        if not self.skip or isinstance(error, SkipLimitError):
            raise error
        self.guard.skipped(error)
        self.meter.skipped()
        error_log.log(logging.WARNING, "streamer", "%s; going on with the next epoch",
                      _raised(error), exc_info=error)

    def refused(self, error: ProtocolError, tag: np.ndarray) -> None:
        """The codec refused the sample tagged ``tag`` (epoch, position): skip it, or raise
        a :class:`ProtocolError` naming it."""
        epoch, position = (int(value) for value in tag[:2])
        where = f"sample {position} of epoch {epoch}" + (f" from {self.source}" * bool(self.source))
        if not self.skip:
            raise ProtocolError(
                f"{where} cannot be sent: {error}; `feedmux serve --on-error skip` "
                "(Server(on_error='skip')) would skip such samples, count them "
                "(errors_skipped) and go on") from error
        self.guard.skipped(error)
        self.meter.skipped()
        error_log.log(logging.WARNING, "refused", "skipping %s that cannot be sent: %s",
                      where, error)

    def sent(self, samples: int) -> None:
        self.guard.sent(samples)

    def epoch_done(self, epoch: int, count: int) -> None:
        if self.skip:
            self.guard.epoch_done(epoch, count)

    def check(self, tags: np.ndarray, items: Sequence[Any],
              server_id: str) -> tuple[np.ndarray, Sequence[Any]]:
        """The rows of a chunk the codec takes, the others skipped (or raised, named):
        for the stages that encode later (ranks, batches), where a refusal cannot be
        undone. One encode of the chunk; one per sample only when it fails."""
        try:
            encode(Data(tags, items, server_id, 0))
            return tags, items
        except ProtocolError:
            pass
        kept: list[int] = []
        for row, sample in enumerate(items):
            try:
                encode(Data(tags[row : row + 1], [sample], server_id, 0))
            except ProtocolError as error:
                self.refused(error, tags[row])
                continue
            kept.append(row)
        return tags[kept], [items[row] for row in kept]


def encode_batch(
    tags: np.ndarray, samples: Sequence[Any], server_id: str, seq: int, skip_bad: bool,
    errors: SampleErrors | None = None, close_ranks: bool = False,
) -> tuple[list[Any], int]:
    """Encode one data message; the samples the codec refuses are skipped (``skip_bad``)
    or raised naming the first (``errors`` handles both: it counts and names them).

    With ``close_ranks`` the samples kept are numbered on from the first tag's
    position, without the skipped ones' holes: a sampling worker counts the
    samples it sent, and the server expects each of its messages to start where
    the last one ended.

    Returns the frames (empty when nothing was left) and how many samples they hold.
    """
    try:
        return encode(Data(tags, samples, server_id, seq)), len(samples)
    except ProtocolError:
        if not skip_bad and errors is None:
            raise
    kept: list[int] = []
    for row, sample in enumerate(samples):
        try:
            encode(Data(tags[row : row + 1], [sample], server_id, seq))
        except ProtocolError as error:
            if errors is None:
                log.warning("skipping sample %s that cannot be encoded: %s",
                            tags[row].tolist(), error)
            else:
                errors.refused(error, tags[row])  # raises unless skipping
            continue
        kept.append(row)
    if not kept:
        return [], 0
    kept_tags = tags[kept]
    if close_ranks:
        kept_tags[:, 1] = np.arange(tags[0, 1], tags[0, 1] + len(kept))
    data = Data(kept_tags, [samples[row] for row in kept], server_id, seq)
    return encode(data), len(kept)


class Pacer:
    """Sizes each ``take`` so that a message fills up without keeping samples waiting.

    A chunk holds what ``policy`` allows for the payload size and no more than
    the sampler produces in ``max_delay`` seconds (from a running mean of its
    time per item), so a fast sampler ships full messages and a slow one ships
    small messages promptly. The first chunk is a single item, to measure.
    """

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self.size_limit = 1
        self.item_seconds = 0.0
        self.item_bytes = 1

    def limit(self, batch_size: int = 0) -> int:
        """Samples of the next message; with ``batch_size``, whole training batches: as
        many as fit the payload target and ``BATCH_MESSAGE_DELAY`` (or ``max_delay``
        if longer) of sampling, at least one, at most ``MAX_BATCHES_PER_MESSAGE``."""
        if batch_size:
            batches = min(MAX_BATCHES_PER_MESSAGE,
                          TARGET_MESSAGE_BYTES // (batch_size * self.item_bytes))
            if self.item_seconds > 0:
                delay = max(self.policy.max_delay, BATCH_MESSAGE_DELAY)
                batches = min(batches, int(delay / self.item_seconds) // batch_size)
            return batch_size * max(1, batches)
        if self.policy.samples_per_message is not None:
            return self.policy.samples_per_message
        if self.item_seconds <= 0:
            return self.size_limit
        by_time = int(self.policy.max_delay / self.item_seconds)
        return max(1, min(self.size_limit, by_time))

    def observe(self, items: Sequence[Any], seconds: float) -> None:
        if not items:
            return
        self.observe_time(len(items), seconds)
        self.observe_size(items[0])

    def observe_time(self, count: int, seconds: float) -> None:
        """``count`` samples took ``seconds`` to draw (a running mean per sample)."""
        if not count:
            return
        per_item = seconds / count
        self.item_seconds = per_item if self.item_seconds <= 0 else (
            0.8 * self.item_seconds + 0.2 * per_item
        )

    def observe_size(self, sample: Any) -> None:
        """The messages hold samples like ``sample`` (their size limit, their bytes)."""
        self.size_limit = self.policy.limit_for(sample)
        self.item_bytes = max(1, payload_bytes(sample))


def produce(
    epochs: EpochIterator[Any],
    send: Callable[[Frames, int, int], bool],
    *,
    policy: BatchPolicy,
    server_id: str,
    skip_errors: bool = False,
    epoch_done: Callable[[int, int], bool] = lambda epoch, count: True,
    dealer: RankDealer | None = None,
    meter: SamplerMeter | None = None,
    align: int | None = None,
    start: tuple[int, int] | None = None,
    fresh: Fresh | None = None,
    batches: Batches | None = None,
    shm: ShmPool | None = None,
    max_skips: int = DEFAULT_MAX_SKIPS,
    meanwhile: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    batch_hint: Callable[[], int] = lambda: 0,
) -> int:
    """Take chunks of items, encode each as a data message and ``send`` it.

    ``send(frames, n_samples, epoch)`` delivers one message and returns False
    when the server is stopping.

    Returns the number of samples sent. A message never spans two epochs;
    after the last message of an epoch, ``epoch_done(epoch, count)`` is called
    with the number of samples that epoch had. Sampling stops when the epochs
    run out or ``send`` / ``epoch_done`` return False (the server is stopping).
    With ``skip_errors`` an exception from the streamer is logged and sampling
    goes on: inside a mux, the stream that raised is skipped alone (the mux
    carries on with its other streams); a top-level streamer that raises
    abandons the rest of its epoch; a sample the codec refuses is skipped
    alone; each is counted and logged naming its streamer, and
    ``max_skips`` of them in a row without a sample sent, or an epoch of
    nothing but skips, stops the run (:class:`~feedmux.errors.SkipLimitError`,
    :class:`~feedmux.server._sources.skips.SkipGuard`). Otherwise the exception
    propagates, after the samples drawn before it have been sent, naming its
    streamer (a refused sample: its epoch position and the top-level streamer).

    With a ``dealer`` (ranked trainers) each chunk goes through the ranked
    stage (:class:`~feedmux.server._delivery.ranking.RankedStage`: dealt to the
    ranks, then encoded, one message per rank), and ``send`` gets the rank as a
    fourth argument.

    With ``align``, no message crosses a multiple of ``align`` samples of its
    epoch (counting the samples sent), so a server merging several workers in
    blocks of ``align`` gets the same order whatever the message sizes.

    ``meter`` gets the seconds spent sampling and encoding each message (not
    sending it: that is the shell's blocked time) and every skipped stream.

    ``start`` resumes a run at ``(epoch, position)``: what comes before is
    sampled again and discarded (``EpochIterator.resume_at``), and the dealer
    deals that epoch from ``position`` on. ``fresh(epoch, positions)`` (free
    trainers that outlived their server) says which samples of a chunk nobody
    had yet (None: all of them); the others are not sent.

    With ``batches`` (a ranked job asked for ``batch_size=B``) each rank's
    message holds whole training batches (up to ``MAX_BATCHES_PER_MESSAGE``, as
    the payload and ``max_delay`` allow): each rank's share is cut by its
    :class:`~feedmux.server._delivery.batches.BatchAssembler` after the dealing
    (free trainers' batches are cut as they are dealt, each trainer's shape its
    own: :mod:`feedmux.server._delivery.freebatches`). Ranked and batched,
    a sample the codec refuses is found before the dealing (one encode of each chunk,
    in skip mode only) and skipped there, so that no batch or rank comes short.

    ``batch_hint()`` is the largest batch size the free trainers asked for (0: none):
    without ``samples_per_message``, a free message then holds whole batches of it
    (as many as :meth:`Pacer.limit` allows), so that their batches, cut as they are
    dealt, are slices of one message (only the message's size changes: no stage).

    ``shm`` is the server's shared-memory pool (its region of it, in a worker):
    the drawn large arrays are copied into it, and :func:`shared_empty` allocates
    there while the streamer is drawn from (:func:`drawing_into`).

    Each draw from the streamer (the user's code) runs within ``meanwhile()``:
    the server answers control from another thread meanwhile
    (:class:`~feedmux.server._standin.ControlStandIn`).
    """
    meter = SamplerMeter() if meter is None else meter
    errors = SampleErrors(skip_errors, meter, describe_streamer(epochs.streamer),
                          SkipGuard(max_skips))
    # The muxes get the hook from the epochs, which hand it down at each activation.
    drawn = Draw(DrawnItems(shm) if policy.copy_arrays else None, errors.hook(), shm, errors,
                  meter, meanwhile)
    stage = None if dealer is None else RankedStage(dealer, server_id, batches=batches,
                                                    start=start)
    if start is not None and stage is not None and stage.resamples_resumed_epoch:
        epochs.resume_at(start[0], 0, keep=0)  # the stage leaves out what was dealt before
    elif start is not None:
        epochs.resume_at(*start, keep=0 if dealer is None else dealer.world_size - 1)
    if stage is not None:
        return _produce_ranked(epochs, drawn, send, policy, errors, epoch_done, meter,
                               stage, start)
    return _produce(epochs, drawn, send, policy, server_id, errors, epoch_done, meter, align,
                    start, fresh, batch_hint)


@dataclass(frozen=True)
class Draw:
    """How each chunk is drawn from the epochs: its items made the server's own as
    drawn (with ``owned``), a stream's error skipped (with ``on_stream_error``)."""

    owned: DrawnItems | None
    on_stream_error: StreamErrorHook | None
    #: The pool :func:`shared_empty` allocates from while the streamer is drawn from.
    shm: ShmPool | None = None
    #: How what goes wrong is skipped or raised (a worker's runners share it).
    errors: SampleErrors | None = None
    #: Counts the drawn samples in the count field's unit, when it has one.
    meter: SamplerMeter | None = None
    #: What runs around each draw: who answers control meanwhile (see :func:`produce`).
    meanwhile: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    def take(self, epochs: EpochIterator[Any], limit: int) -> tuple[Chunk, Sequence[Any]]:
        """The next chunk and its samples."""
        with drawing_into(self.shm), self.meanwhile():
            if self.owned is None:
                chunk = epochs.take(limit, on_stream_error=self.on_stream_error)
                samples: Sequence[Any] = chunk.items
            else:
                try:
                    chunk = epochs.take(limit, prepare=self.owned.start(),
                                        on_stream_error=self.on_stream_error)
                except BaseException:
                    self.owned.abandon()
                    raise
                samples = self.owned.samples(chunk.items)
        if self.meter is not None and self.meter.count_field:
            self.meter.count(samples)
        return chunk, samples


def _produce(
    epochs: EpochIterator[Any],
    drawn: Draw,
    send: Callable[[Frames, int, int], bool],
    policy: BatchPolicy,
    server_id: str,
    errors: SampleErrors,
    epoch_done: Callable[[int, int], bool],
    meter: SamplerMeter,
    align: int | None,
    start: tuple[int, int] | None = None,
    fresh: Fresh | None = None,
    batch_hint: Callable[[], int] = lambda: 0,
) -> int:
    clock = time.perf_counter
    hinted = policy.samples_per_message is None
    pacer = Pacer(policy)
    seq = sent = epoch_count = 0
    while True:
        started = clock()
        try:
            limit = pacer.limit(batch_hint() if hinted else 0)
            if align is not None:
                limit = min(limit, align - epoch_count % align)
            chunk, items = drawn.take(epochs, limit)
        except StopIteration:
            return sent
        except Exception as error:
            errors.streamer_raised(error)
            # The epoch is over even when it raised on its first pull: a worker must say
            # so (the server waits for every shard's end of epoch) and wait for the next.
            errors.epoch_done(epochs.epoch, epoch_count)
            if not epoch_done(epochs.epoch, epoch_count):
                return sent
            epoch_count = 0
            continue
        pacer.observe(items, clock() - started)
        if start is not None:
            if chunk.epoch == start[0]:
                epoch_count = chunk.start  # the resumed epoch's size counts what came before
            start = None
        if items:
            tags = np.empty((len(items), 2), dtype=np.int64)
            tags[:, 0] = chunk.epoch
            tags[:, 1] = np.arange(chunk.start, chunk.start + len(items))
            if fresh is not None and (unhad := fresh(chunk.epoch, tags[:, 1])) is not None:
                rows = np.flatnonzero(unhad).tolist()
                epoch_count += len(items) - len(rows)  # had by a trainer, not sent again
                tags, items = tags[rows], [items[row] for row in rows]
        if items:
            frames, count = encode_batch(tags, items, server_id, seq, errors.skip, errors)
            meter.add_busy(clock() - started)
            if frames:
                if not send(frames, count, chunk.epoch):
                    return sent
                seq += 1
                sent += count
                epoch_count += count
                errors.sent(count)
        if chunk.last:
            errors.epoch_done(chunk.epoch, epoch_count)
            if not epoch_done(chunk.epoch, epoch_count):
                return sent
            epoch_count = 0


def skip_epoch(error: Exception, skip_errors: bool, meter: SamplerMeter,
                errors: SampleErrors | None = None) -> None:
    """A top-level streamer raised: re-raise it, or (``skip_errors``) count and log it."""
    (errors or SampleErrors(skip_errors, meter)).streamer_raised(error)


def _produce_ranked(
    epochs: EpochIterator[Any],
    drawn: Draw,
    send: Callable[..., bool],
    policy: BatchPolicy,
    errors: SampleErrors,
    epoch_done: Callable[[int, int], bool],
    meter: SamplerMeter,
    stage: RankedStage,
    start: tuple[int, int] | None = None,
) -> int:
    """:func:`produce` for ranked trainers: each chunk through the ranked stage.

    A chunk holds about ``world_size`` messages' worth of samples, so each rank's
    message is as full as a free trainer's would be (up to
    :data:`RANK_CHUNK_DELAYS` ranks; a chunk then takes up to that many times
    ``max_delay`` to sample). A sample the codec refuses
    fails the run here, named (skipping it would move every later position, by
    which the ranks are dealt and resumed); a top-level
    streamer that raises with ``skip_errors`` ends its epoch where it stopped
    (the stage pads or drops the last round, so the ranks stay even).
    """
    clock = time.perf_counter
    pacer = Pacer(policy)
    sent = epoch_count = 0
    n = stage.world_size
    chunk: Chunk | None
    batch_size = 0 if stage.batches is None else stage.batches.batch_size
    while True:
        started = clock()
        try:
            chunk, items = drawn.take(epochs, pacer.limit(batch_size) * n)
        except StopIteration:
            return sent
        except Exception as error:
            errors.streamer_raised(error)
            chunk = None
            epoch, last = epochs.epoch, bool(epoch_count)  # nothing taken: nothing to finish
            messages = stage.finish_epoch(epoch)
        else:
            epoch, last = chunk.epoch, chunk.last
            if start is not None:
                if epoch == start[0]:  # the resumed epoch: dealt from where the job stood
                    head = epochs.resumed_head  # drawn while skipping: made ours here
                    if drawn.owned is not None:
                        head = [own(item, drawn.shm) for item in head]
                    stage.skipped(epoch, head)
                    epoch_count = chunk.start  # the epoch's size counts what came before
                start = None
            # Time per rank message: sampling one item of each rank's message (n items),
            # spread over up to RANK_CHUNK_DELAYS times max_delay.
            pacer.observe(items, (clock() - started) * n / min(n, RANK_CHUNK_DELAYS))
            epoch_count += len(items)
            try:
                messages = stage.deal(epoch, chunk.start, items)
            except ProtocolError as error:
                _ranked_failure(errors, stage, epoch, chunk, items, error)
            if last:
                messages = itertools.chain(messages, stage.finish_epoch(epoch))
        try:
            for message in messages:  # encoded as it comes: busy until it is sent
                meter.add_busy(clock() - started)  # sampling, dealing and encoding, not sending
                if not send(message.frames, message.samples, epoch, message.rank):
                    return sent
                started = clock()
                sent += message.samples
                errors.sent(message.samples)
        except ProtocolError as error:
            _ranked_failure(errors, stage, epoch, chunk, items, error)
        meter.add_busy(clock() - started)
        if last:
            errors.epoch_done(epoch, epoch_count)
            if not epoch_done(epoch, epoch_count):
                return sent
            epoch_count = 0



def _ranked_failure(errors: SampleErrors, stage: RankedStage, epoch: int, chunk: Chunk | None,
                    items: Sequence[Any], error: ProtocolError) -> NoReturn:
    """A ranked chunk failed to deal or encode: raise naming why (a sample the codec
    refuses: its position; samples that do not stack into a batch: what to do)."""
    if chunk is not None and items:
        tags = np.empty((len(items), 2), dtype=np.int64)
        tags[:, 0], tags[:, 1] = epoch, np.arange(chunk.start, chunk.start + len(items))
        _refuse_ranked(errors, tags, items, stage.server_id)
    if stage.batches is not None:
        raise DataError(unstackable(error, epoch, stage.batches.batch_size,
                                    ranked=True)) from error
    raise error


def _refuse_ranked(errors: SampleErrors, tags: np.ndarray, items: Sequence[Any],
                   server_id: str) -> None:
    """Ranked trainers: a sample of the chunk the codec refuses stops the run even with
    ``--on-error skip``, named (its epoch position and streamer), saying why it is not
    skipped. One encode of the chunk; one per sample only when it fails."""
    try:
        encode(Data(tags, items, server_id, 0))
        return
    except ProtocolError:
        pass
    for row, sample in enumerate(items):
        try:
            encode(Data(tags[row : row + 1], [sample], server_id, 0))
        except ProtocolError as error:
            epoch, position = (int(value) for value in tags[row, :2])
            source = f" from {errors.source}" if errors.source else ""
            raise ProtocolError(
                f"sample {position} of epoch {epoch}{source} cannot be sent: {error}; ranked "
                "trainers cannot skip it (--on-error skip): every later position of the "
                "epoch, by which the ranks are dealt and resumed, would move. Leave such "
                "samples out in the streamer") from error
