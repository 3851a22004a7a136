"""The forwarding loop of ``--workers N``: the shards' messages merged, numbered and sent on.

This module owns the server process's side of its sampling workers: it reads
each worker's socket, takes each message of a shard only under the shard's
current ticket (:class:`~feedmux.server._sources.assignment.ShardLedger`: what an
earlier owner of a moved shard still had on its way is dropped, and the new
owner starts after what was taken), merges the shards (in the fixed order of
:class:`~feedmux.server._sources.merge.Merge` for a seeded run, else as they
come), numbers positions per epoch across the shards, deals them to the ranks
of a ranked job through the ranked stage (each rank's rows are sliced out of the
workers' decoded batches, no sample built, and while more messages wait,
``world_size`` of them are held and dealt together so that a rank's message is
as full as a worker's) and hands every message to the shell. Between messages
it lets :class:`~feedmux.server._sources.scaling.WorkerScaling` change the
running workers, and hands a dead worker's shards to the others, with the
shared-memory pool too: it takes what the dead worker's socket already delivered,
reads that socket no more, and lets the pool take back the worker's runs that no
message it took refers to (:meth:`WorkerPool.bury`) before the shards get their new
tickets. A ranked job
that resumes from a checkpoint while the server runs starts a new *run*: every
shard gets a new ticket at the resumed epoch. It publishes to the workers the codec to
compress with (:mod:`feedmux.server._sources.packing`: only while it sends their
messages on as they are); a message that came compressed is merged and renumbered as it
is, and inflated first where the server must decode it (ranks, batches, groups, a
resumed run's cut). With ``--workers auto`` at a count of one the server's own process is
the one sampling seat (:class:`~feedmux.server._sources.inprocess.InProcessSeat`): between
its looks at the sockets the loop lets it draw a message's worth of chunks, which enter
the merge unencoded under their tickets as a worker's messages do, and the consecutive
ones of an epoch leave as one message. It must never sample but through that seat (the
workers do) nor decide who gets what (the dealer and the control core do). It is
composition, not a source: it drives the shell and reads the control core's state
between runs, so it sits above both, beside :mod:`feedmux.server.server`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack
import numpy as np
import zmq

from feedmux._plumbing.shm import ShmPool, carried_bytes, has_refs
from feedmux.errors import SkipLimitError
from feedmux.protocol import (
    Data,
    EndOfEpoch,
    Error,
    Resolver,
    decode,
    encode,
    packed,
    read_tags,
    replace_tags,
    stacking_into,
)
from feedmux.server._control.waitshare import trainers_wait
from feedmux.server._delivery.dealing import RankDealer
from feedmux.server._delivery.ranking import RankedStage, RankMessage
from feedmux.server._shell import SocketShell, StopFlag
from feedmux.server._sources.assignment import ShardLedger, unpack_shard
from feedmux.server._sources.inprocess import Drawn, InProcessSeat
from feedmux.server._sources.merge import MIN_READ_AHEAD_BYTES, READ_AHEAD_BYTES, Merge
from feedmux.server._sources.packing import passes_through
from feedmux.server._sources.scaling import WorkerScaling
from feedmux.server._sources.staffing import Staffing, WorkerSockets
from feedmux.server._sources.workers import WorkerPool
from feedmux.server._standin import ControlStandIn
from feedmux.server.config import EXIT_FAILED, EXIT_OK, ServerConfig

#: The most messages the forwarder reads from one worker per look at the sockets: each
#: look (a poll of every worker's socket, the merge's readable set) costs tens of µs, so
#: reading what is there at once spreads it over several messages.
DRAIN = 16

__all__ = ["forward", "ranked_dealer"]

log = logging.getLogger("feedmux.server")



class _Run:
    """The state of one run of the job: merge order, positions, the ranked stage (which
    holds the workers' samples to deal them together and cuts a resumed epoch), and what
    the server took of each shard (:class:`ShardLedger`)."""

    def __init__(self, pool: WorkerPool, shell: SocketShell, config: ServerConfig,
                 block: int | None) -> None:
        shards = len(pool.parts)
        self.merge: Merge[Any] = Merge(shards, block, read_ahead=max(
            READ_AHEAD_BYTES // shards, MIN_READ_AHEAD_BYTES))
        self.ledger = ShardLedger(shards, pool.tickets)
        #: The workers' skipped errors when the last epoch ended (``--on-error skip``).
        self.skipped_before = 0
        self.positions: dict[int, int] = {}
        start = shell.core.start_at  # a resumed job: the workers skip the epochs before
        #: Free trainers that outlived their server: where to resume, what they had.
        self.start, self.handed = start, shell.core.handed
        dealer = ranked_dealer(shell, config)
        #: A ranked job's batches (None: no ranked job, or it asked for none): cut here,
        #: from the merged stream (the free trainers' are cut as they are dealt).
        self.batches = None if dealer is None else shell.core.tables.batches.assemblers(
            config.buckets)
        #: A ranked job's dealing (None: free trainers).
        self.ranked = None if dealer is None else RankedStage(
            dealer, config.server_id, batches=self.batches, start=start)
        first = start[0] if start else 1
        # The workers fill their messages when the server gathers them into batches (a
        # ranked job's, or the free trainers' largest: cut as they are dealt).
        self.gather(pool, shell)
        self.publish(pool, shell)  # before the release: the first messages compressed too
        pool.place(self.ledger, start=(first, 0))  # new tickets: an earlier run's messages drop
        pool.release(first)

    def gather(self, pool: WorkerPool, shell: SocketShell) -> None:
        """Tell the workers the batch size their messages are filled for (see
        :meth:`WorkerPool.gather`): the ranked job's, or the free trainers' largest."""
        pool.gather(shell.core.batch_hint() if self.batches is None else
                    self.batches.batch_size)

    @property
    def holding(self) -> bool:
        """Whether samples are held for the ranks, waiting for more to deal them with."""
        return self.ranked is not None and self.ranked.holding

    def readable(self, pool: WorkerPool) -> list[int]:
        """The workers whose sockets to read: those that run a shard the merge may read
        ahead (or whose turn it is), and those that run none (their last messages drop)."""
        owners = pool.assignment.owners()
        wanted = {owners[index] for index in self.merge.readable()}
        running = set(owners)
        return sorted(seat for seat in pool.pids if seat in wanted or seat not in running)

    def reads_ahead(self, slot: int, pool: WorkerPool) -> bool:
        """Whether ``slot``'s socket may still be read now (:meth:`readable`, for one)."""
        return slot in self.readable(pool) if self.merge.order is not None else True

    def passes_through(self, shell: SocketShell) -> bool:
        """Whether the workers' messages go on as they are (so the workers may compress)."""
        return passes_through(self.ranked is not None, self.batches is not None,
                              shell.core.tables.grouped)

    def publish(self, pool: WorkerPool, shell: SocketShell) -> None:
        """Tell the workers the codec to compress with (none unless messages pass through)."""
        pool.codec.publish(shell.compression.worker_codec() if self.passes_through(shell)
                           else None)

    def take(self, frames: Any, shm: ShmPool | None) -> Error | None:
        """Hold a worker's message in the merge, or drop it (sent under an earlier ticket of
        its shard); a worker's Error is returned."""
        if len(frames) > 1:  # data: header + tags frame + buffers (or references)
            tags = read_tags(frames)
            head = packed(frames)  # a compressed message repeats its seq
            seq = msgpack.unpackb(frames[0].buffer)["seq"] if head is None else head["s"]
            shard, ticket = unpack_shard(seq)
            if self.ledger.take_data(shard, ticket, int(tags[0, 0]), int(tags[0, 1]),
                                     len(tags)):
                if shm is not None and has_refs(frames):
                    shm.forwarded.receive(frames)  # its runs are the server's (a death keeps them)
                self.merge.put(shard, frames, len(tags), carried_bytes(frames))
            elif shm is not None and has_refs(frames):
                shm.drop(frames)
            return None
        message = decode(frames)
        if isinstance(message, Error):
            return message
        if isinstance(message, EndOfEpoch):
            shard, ticket = unpack_shard(message.worker)
            if self.ledger.take_end(shard, ticket, message.epoch):
                self.merge.put(shard, message, None, 0)
        return None

    def take_drawn(self, shard: int, ticket: int, tags: np.ndarray,
                   samples: Sequence[Any], nbytes: int) -> None:
        """Hold a chunk (of about ``nbytes``) the server's own process drew of ``shard``
        under ``ticket`` (:class:`InProcessSeat`): as :meth:`take` does a worker's message,
        not encoded (:func:`_send_merged` encodes the consecutive chunks as one)."""
        if self.ledger.take_data(shard, ticket, int(tags[0, 0]), int(tags[0, 1]), len(tags)):
            self.merge.put(shard, Drawn(tags, samples), len(tags), nbytes)

    def take_here(self, shard: int, ticket: int, frames: Any) -> None:
        """Hold an end of epoch the server's own process sent of ``shard`` under
        ``ticket`` (as :meth:`take` does a worker's)."""
        message = decode(frames)
        if isinstance(message, EndOfEpoch) and self.ledger.take_end(shard, ticket,
                                                                    message.epoch):
            self.merge.put(shard, message, None, 0)

    def check_skipped(self, pool: WorkerPool, config: ServerConfig, epoch: int,
                      count: int) -> None:
        """``--on-error skip``: an epoch the workers sent nothing of but skips stops the run
        (each worker stops on its own streak of skips; only here is the whole epoch seen)."""
        if config.on_error != "skip":
            return
        skipped = sum(meter.errors_skipped for meter in pool.meters)
        before, self.skipped_before = self.skipped_before, skipped
        if not count and skipped > before:
            raise SkipLimitError(
                f"--on-error skip skipped every sample of epoch {epoch} ({skipped - before} "
                "error(s) in the sampling workers, no sample served; the first is logged "
                "above, naming its streamer)")

    def number(self, frames: Any) -> np.ndarray:
        """The tags of a worker's message with positions numbered across the shards."""
        tags: np.ndarray = read_tags(frames).copy()
        epoch = int(tags[0, 0])
        start = self.positions.get(epoch, 0)
        tags[:, 1] = np.arange(start, start + len(tags))
        self.positions[epoch] = start + len(tags)
        return tags


def forward(pool: WorkerPool, shell: SocketShell, config: ServerConfig, stop: StopFlag,
            block: int | None) -> int:
    """Forward the workers' messages until the stream ends, fails or the server stops.

    With a ``block`` (a seeded run) in the fixed order of :class:`Merge`, reading
    ahead of their turn from the other shards; without, in arrival order.
    Returns the server's exit code.
    """
    sockets = WorkerSockets(shell.context, config.hwm, shell.control)
    staffing = Staffing(pool, sockets)
    # ``auto``: the server's own process samples at a count of one, and control is
    # answered from another thread while it draws (as with --workers 1).
    stand_in = None if pool.home is None else ControlStandIn(
        shell.control, shell.answer_control, shell.follow_control)
    home = InProcessSeat(pool, config, shell.pool,
                         contextlib.nullcontext if stand_in is None else stand_in.drawing)
    scaling = WorkerScaling(pool, config.worker_range,
                            trainer_wait=lambda now: trainers_wait(shell.core.trainers.values(),
                                                                   now))
    shell.extra_stats.append(scaling.stats)
    def between_runs() -> None:
        # No shard runs yet (the run places them all): only the count asked for.
        requested = shell.core.scaling.take()
        if requested is not None:
            scaling.request(requested)
            staffing.match()

    try:
        staffing.fill()
        while True:
            if not shell.wait_for_trainers(between_runs):
                return EXIT_FAILED if shell.failed else EXIT_OK
            run = _Run(pool, shell, config, block)
            code = _forward_run(run, staffing, shell, config, stop, scaling, home)
            if code is not None:
                return code
            _drop_read_ahead(run, shell.pool)
            # The ranked job resumed from a checkpoint: a new run, from where it says.
            shell.core.restarted()
    except Exception as error:
        log.error("server failed: %s", error)
        shell.fail(error)
        return EXIT_FAILED
    finally:
        if stand_in is not None:
            stand_in.close()
        home.close()
        sockets.close_all()


def _forward_run(run: _Run, staffing: Staffing, shell: SocketShell, config: ServerConfig,
                 stop: StopFlag, scaling: WorkerScaling, home: InProcessSeat) -> int | None:
    """One run: the exit code when the stream ends (or stops), None when the job restarts."""
    pool, sockets = staffing.pool, staffing.sockets

    def read(socket: Any) -> Error | None:
        return _read(run, socket, shell)

    while not stop:
        if shell.core.restarting:
            return None
        sockets.watch(run.readable(pool), None if pool.zygote.gone else pool.zygote.fileno())
        # Held samples, and shards this process may draw, wait for no socket.
        drawing = home.ready(run.merge.readable()) is not None
        events = dict(sockets.poller.poll(0 if run.holding or drawing else 100))
        if shell.control in events:
            shell.serve_control(timeout=0)
        requested = shell.core.scaling.take()
        if requested is not None:
            scaling.request(requested)
        scaling.tick(time.monotonic(), shell.outbox.blocked_seconds, shell.core.samples_sent,
                     run.ledger)
        # A worker that ended is read no more: its socket was drained and closed here.
        error = staffing.reconcile(run.ledger, read)
        if error is not None:
            return _failed(error, shell)
        # The shards of the server's own process: a message's worth, sent on at once.
        drawn = home.draw(run.merge.readable, run.take_drawn, run.take_here)
        if isinstance(drawn, Error):
            return _failed(drawn, shell)
        if drawn:
            code = _send_merged(run, pool, shell, config, home)
            if code is not None:
                return None if shell.core.restarting else code
        ready = [seat for seat, socket in sorted(sockets.by_seat.items()) if socket in events]
        if not ready and not drawn:
            if run.ranked is not None and not _send_ranked(run.ranked.flush(), shell):
                return None if shell.core.restarting else EXIT_OK
            shell.tick()
            continue
        run.publish(pool, shell)
        staffing.fruitful.update(ready)
        for worker in ready:  # a few messages each: fair to every worker
            socket = sockets.by_seat[worker]
            for _ in range(DRAIN):
                try:
                    error = _read(run, socket, shell)
                except zmq.Again:
                    break
                if error is not None:  # at once, whoever's turn it is
                    return _failed(error, shell)
                if not run.reads_ahead(worker, pool):
                    break  # its read-ahead is full: the others' turns first
        code = _send_merged(run, pool, shell, config, home)
        if code is not None:
            return None if shell.core.restarting else code
    return EXIT_OK


def _read(run: _Run, socket: Any, shell: SocketShell) -> Error | None:
    """Take one message of a worker's ``socket`` (:meth:`_Run.take`); zmq.Again if none."""
    frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
    shell.compression.forms.arrived(frames)
    return run.take(frames, shell.pool)


def _failed(error: Error, shell: SocketShell) -> int:
    log.error("sampling worker failed: %s: %s", error.type, error.message)
    shell.fail(error)
    return EXIT_FAILED


def _send_merged(run: _Run, pool: WorkerPool, shell: SocketShell,
                 config: ServerConfig, home: InProcessSeat) -> int | None:
    """Send what is next in merge order; an exit code when the stream ends or stops.

    The chunks the server's own process drew (:class:`Drawn`) that come one after the
    other in an epoch go as one message (:meth:`InProcessSeat.encode`), as large as a
    message of ``--workers 1``: each message costs the server the same whatever it
    holds, and a turn of the merge is a few samples.
    """
    ranked, positions = run.ranked, run.positions
    after: tuple[Any, bool] | None = None
    while (taken := after or run.merge.next()) is not None:
        after = None
        item, epoch_over = taken
        if type(item) is Drawn:
            chunks, epoch, limit = [item], item.tags[0, 0], home.limit()
            count = len(item.tags)
            while count < limit and (after := run.merge.next()) is not None and (
                    type(after[0]) is Drawn and after[0].tags[0, 0] == epoch):
                chunks.append(after[0])
                count += len(after[0].tags)
                after = None
            item = home.encode(chunks)
            if item is None:  # every sample refused and skipped
                continue
        if isinstance(item, EndOfEpoch):
            if epoch_over:
                if ranked is not None and not _send_ranked(ranked.finish_epoch(item.epoch),
                                                           shell):
                    return EXIT_OK
                run.check_skipped(pool, config, item.epoch, positions.get(item.epoch, 0))
                shell.epoch_done(item.epoch, positions.get(item.epoch, 0))
                run.gather(pool, shell)  # the trainers of the next epoch
                if config.epochs is not None and item.epoch >= config.epochs:
                    shell.finish()
                    return EXIT_OK
                pool.release(item.epoch + 1)
            continue
        tags = run.number(item)
        if not run.passes_through(shell):
            item = shell.compression.forms.raw(item)  # came compressed before the change
        if ranked is not None:
            # Its header decoded (a batch's samples stay stacked, its arrays read from the
            # workers' runs in place), its rows held and dealt.
            message = decode(item, resolve=_reader(shell.pool))
            assert isinstance(message, Data)
            with _stacked_in_pool(shell.pool):  # a rank's rows of several messages, joined
                held = _send_ranked(ranked.hold(int(tags[0, 0]), int(tags[0, 1]),
                                                message.samples), shell)
            if not held:
                return EXIT_OK
            continue
        frames = _free_rows(run, item, tags, config.server_id, shell)
        if frames is not None and not shell.send_data(frames, len(read_tags(frames)),
                                                      int(tags[-1, 0])):
            return EXIT_OK
    return None


def _drop_read_ahead(run: _Run, shm: ShmPool | None) -> None:
    """Free the runs of the pool that the messages read ahead for a run that ended refer to."""
    for item in run.merge.drain():
        if shm is not None and not isinstance(item, EndOfEpoch) and has_refs(item):
            shm.drop(item)


def _stacked_in_pool(shm: ShmPool | None) -> contextlib.AbstractContextManager[None]:
    """While a trainer maps the pool, the arrays the server stacks from the workers' runs
    (a batch, a rank's rows of several messages) are made in the server's region of the
    pool (:meth:`~feedmux._plumbing.shm.ShmPool.empty`; plain memory when it is full): the
    stacking is their one copy, and they are sent on as references to it."""
    return stacking_into(shm.empty if shm is not None and shm.wanted else None)


def _reader(shm: ShmPool | None) -> Resolver | None:
    """The resolver that decodes a worker's references as views of its runs, in place (no
    copy: :meth:`~feedmux._plumbing.shm.ForwardedRuns.view`), or None without a pool.

    An array of such a view that the server encodes again from its first byte (a
    rank's share of whole samples, a batch of one) is sent on as a reference to the
    same run; what the server builds from several (a batch of many samples) is a
    new array, placed as any other.
    """
    return None if shm is None else shm.forwarded.view


def _free_rows(run: _Run, frames: Any, tags: np.ndarray, server_id: str,
               shell: SocketShell) -> Any:
    """A worker's message for free trainers (renumbered ``tags``), or None when nothing of
    it goes out: a resumed run drops what comes before its start and what the trainers
    that outlived their server had (decoding and re-encoding only such messages)."""
    epoch = int(tags[0, 0])
    kept = run.handed.fresh(epoch, tags[:, 1])
    if run.start is not None and epoch == run.start[0]:
        after = tags[:, 1] >= run.start[1]
        kept = after if kept is None else kept & after
    if kept is None or kept.all():
        return replace_tags(frames, tags)
    rows = np.flatnonzero(kept).tolist()
    shm = shell.pool
    if not rows:
        if shm is not None and has_refs(frames):
            shm.drop(frames)
        return None
    message = decode(shell.compression.forms.raw(frames), resolve=_reader(shm))
    assert isinstance(message, Data)
    return encode(Data(tags[rows], [message.samples[row] for row in rows], server_id))


def ranked_dealer(shell: SocketShell, config: ServerConfig) -> RankDealer | None:
    """The dealer of a ranked run (its trainers' hellos told the world size), else None."""
    world_size = shell.core.ranks.world_size
    if not world_size:
        return None
    # Live ranks that outlived a server are ahead: nothing they had is dealt to them again.
    return RankDealer(world_size, config.uneven, ahead=shell.core.ranks_ahead)


def _send_ranked(messages: Iterable[RankMessage], shell: SocketShell) -> bool:
    """Send each rank its messages; False when the server is stopping (or restarting)."""
    return all(shell.send_data(message.frames, message.samples, message.epoch, message.rank)
               for message in messages)
