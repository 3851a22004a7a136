"""RemoteLoader: the trainer's end of the wire, an iterable of decoded samples.

This module owns the trainer's sockets and nothing else: one data DEALER per
server (named by this trainer's client id, so that the server can address it:
by rank, or to whichever free trainer has room) and one DEALER per server's
control endpoint. It connects,
polls, receives, decodes and sends; every decision about what the servers said
(welcomes, restarts, drains, ends of stream, remote errors, heartbeats,
timeouts) belongs to the pure link state in ``_link``, which it calls once per
message and never once per sample. It never imports the server package. Every
blocking wait is bounded: by the user's ``timeout``, or by a heartbeat interval
when no timeout is asked for (then it waits for data as long as it takes, by
the user's choice).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.util
import os
import time
import uuid
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import zmq

from feedmux._auditlog import AuditLog, NoAudit, open_audit
from feedmux._plumbing.curve import ClientCurve
from feedmux._plumbing.handshakes import HandshakeWatch
from feedmux._plumbing.sockets import (
    DEFAULT_HWM,
    HEARTBEAT_INTERVAL,
    MAX_CLIENT_ID,
    readable,
)
from feedmux.client._acks import HandOutAcks, SeenPositions, left_of, progress_of
from feedmux.client._batches import BatchMeta, batch_step, unpacked
from feedmux.client._data import DataSockets, send_or_drop
from feedmux.client._diagnosis import InputDiagnosis
from feedmux.client._endpoints import check_endpoint, endpoints, fetch_stats
from feedmux.client._handout import HandOut, SampleMeta
from feedmux.client._link import Action, Attach, Grant, Send, ServerLinks, check_membership
from feedmux.client._markfile import MarkFile, mark_path, read_marks
from feedmux.client._moves import AddressBook, Resolve
from feedmux.client._origin import Origin, not_a_map, register_with_torch
from feedmux.client._resume import HandedRanges, RankPositions
from feedmux.client._sockets import close_sockets, open_sockets
from feedmux.client._waiting import WAITED, LoaderWaits
from feedmux.errors import (
    ConfigurationError,
    ResumeWarning,
    StreamValueError,
    TransportClosedError,
)
from feedmux.protocol import (
    CONTROL_LIMITS,
    Data,
    StatsRequest,
    decode,
)

__all__ = ["BatchMeta", "RemoteLoader", "SampleMeta", "check_endpoint",
           "deprecated_loader_reliable", "fetch_stats"]

log = logging.getLogger("feedmux.client")

#: Said to a loader given ``reliable=`` (a DeprecationWarning).
RELIABLE_IS_DEFAULT = (
    "RemoteLoader(reliable=...) is deprecated and does nothing: every free trainer gets "
    "every sample of an epoch exactly once by default (its loader grants credit and "
    "acknowledges what it handed out, what reliable=True did), so what a trainer that "
    "leaves, closes, dies or hangs had not handed out goes to the others; drop the argument")



def deprecated_loader_reliable(options: dict[str, Any], stacklevel: int = 3) -> None:
    """Take a ``reliable`` argument out of the RemoteLoader ``options`` that a wrapper
    passes on, with a DeprecationWarning if it was given (it is a no-op now:
    :data:`RELIABLE_IS_DEFAULT`): said once, at the wrapper's caller, and never again by
    the loaders the wrapper makes."""
    if options.pop("reliable", None) is not None:
        warnings.warn(RELIABLE_IS_DEFAULT, DeprecationWarning, stacklevel=stacklevel)


#: A data message larger than this is refused by ZeroMQ before it reaches Python.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30


class RemoteLoader:
    """An iterable over the samples that one or more feedmux servers push.

    Parameters
    ----------
    address : str or sequence of str
        Data endpoint(s) of the server(s), e.g. ``"tcp://127.0.0.1:5555"``.
        With several, samples are taken from whichever has them.
    control : str or sequence of str, optional
        Control endpoint(s), one per address; default: each data port + 1.
    timeout : float, optional
        Seconds without any data before ``next()`` raises
        :class:`~feedmux.errors.TransportTimeoutError`. None waits forever
        (through server restarts), by choice.
    hwm : int
        Data messages queued in this process before the server is held back.
    world_size : int
        Trainers sharing the stream. Without ``rank``, ``len(loader)`` is
        ``epoch_size // world_size``.
    rank : int, optional
        This trainer's rank in a data-parallel job of ``world_size`` ranks (torch
        DDP): the server deals each epoch among the ranks by a fixed rule of the
        position and every rank gets the same number of samples per epoch (see
        the server's ``uneven``), so every rank's ``iter_epoch()`` ends on the
        same step and ``len(loader)`` is the steps per epoch. None: a free
        trainer, dealt whatever it has room for.
    group : str, optional
        This trainer's consumer group (any server serves them): every group
        receives the whole stream, every epoch complete, and the trainers of one
        group split it (``world_size`` is then the number of trainers in the
        group). None: the default group.
    with_meta : bool
        Yield ``(SampleMeta, sample)`` pairs instead of bare samples.
    max_message_bytes : int
        Larger data messages are refused (and the connection dropped).
    client_id : str, optional
        This trainer's name to its servers: its data socket's identity, the
        name in the servers' logs, ``feedmux top`` and the audit log. Default:
        a fresh ``"<pid>-<random>"`` per loader (and per copy of it in another
        process). One id belongs to one live
        loader at a time: a loader whose id a live trainer of the server holds
        is refused at once (:class:`~feedmux.errors.ConfigurationError` naming
        the id, within a heartbeat: a closed predecessor's id is free again as
        soon as the server finds it gone), and the holder goes on undisturbed.
    curve_server_key : str or bytes, optional
        The server's public key (its ``.key`` file or the Z85 key): CURVE
        encryption on every socket of this loader.
    curve_certificate : str, optional
        This trainer's secret certificate, for a server that lets in only known
        clients; default: a fresh key pair.
    tune_malloc : bool
        When the first large message (over 1 MiB) arrives, make glibc's malloc
        keep freed large buffers for reuse in this process (see
        ``feedmux._plumbing.sockets.keep_freed_memory``): 1.2-1.8x the throughput of
        16 MiB samples at half the trainer CPU. The price: freed buffers stay in
        the process, up to its peak heap use (not a fixed bound; see
        ``docs/performance.md``). False leaves the allocator alone.
    shm : bool
        Map the shared-memory pool of a server on this host (proved in the
        handshake) and receive its large arrays as views of it, with no copy: a
        run of the pool is reused once every view of it is gone. False (or a
        server on another host) receives everything over the sockets.
    reliable : bool, optional
        Deprecated, a no-op with a DeprecationWarning. Every loader grants
        ``hwm`` messages of credit and acknowledges what it handed out (what
        ``reliable=True`` did): if this trainer leaves, closes, dies or hangs,
        what it had received and not handed out goes to the others, so a free
        trainer gets every sample of an epoch exactly once across the trainers.
    diagnose_window : float, optional
        Seconds per window of the input-bound diagnosis (see :meth:`stats`):
        a window in which the training loop waited inside ``next()`` more than
        ``diagnose_threshold`` of the time logs a warning with the likely cause
        and the fix. None turns the diagnosis off (the heartbeats still tell
        the servers the share of each second the loop waited: ``--workers
        auto`` sizes the sampling from it).
    diagnose_threshold : float
        The wait fraction above which a window gets that warning.
    resolve : callable, optional
        ``() -> [(data, control), ...]``: where the servers listen now, one pair
        per address. Asked once a second (from the loop that reads data, never
        per sample); a server whose pair changed (restarted elsewhere by a
        cluster manager) is followed there and greeted again. A failing
        resolver is logged and the known endpoints kept.
    batch_size : int, optional
        Hand out one batch of ``batch_size`` samples per step instead of single
        samples, stacked by the server: a dict of stacked arrays for dict
        samples, the same nesting for tuples and lists, numbers (numpy or
        plain ``bool`` / ``int`` / ``float``) as 1-d arrays, strings, bytes and
        None as lists. A batch never spans two epochs; ``len()``, ``Stream`` and
        the saved state count batches (docs/stream.md). The shape is this
        loader's own: loaders with other ones (or none) may read the same
        server; the ranks of one job ask the same ``batch_size`` and
        ``drop_last``.
    drop_last : bool
        With ``batch_size``: drop each epoch's last, partial batch (of the free
        trainers, or of each rank: every rank's is the same size) instead of
        handing it out short.
    bucket_by : str, optional
        With ``batch_size``: have the server build each batch from samples of
        similar length, read from the sample's field ``bucket_by`` (an int, or
        an array's first dimension; docs/ddp.md). A free trainer's batches come
        from its share of the stream, each of one bucket, each bucket's rest of
        an epoch short (or dropped, ``drop_last``); a ranked job's steps are
        dealt so that every rank's batch of a step holds similar lengths, and
        every rank of the job names the same field. The arrays whose first
        dimension is the sample's length come as a list of the samples' arrays,
        or padded (``pad``).
    pad : bool
        With ``batch_size``: hand out each variable-length leaf of a bucketed
        batch as :class:`~feedmux.protocol.Padded` (``values`` padded with zeros
        to the batch's longest, and ``mask``), built by numpy with no Python step
        per sample, instead of a list.
    audit_log : str or path, optional
        Append a record of every sample handed out (server, epoch, position) to
        this file, for ``feedmux audit`` (docs/resume.md): one line per data
        message, written before any server is told what was handed out, plus a
        record at each ``state_dict()`` and ``load_state_dict()``. ``{rank}``,
        ``{pid}`` and ``{client_id}`` in the path are filled in.
    audit_key : str, optional
        With ``audit_log``: also record each sample's field of this name (an
        int or str id), so that the audit can compare what was handed out.

    Notes
    -----
    Iteration ends (``StopIteration``) only when every server ran a finite
    number of epochs and said so; otherwise it goes on forever. A server that
    restarts (a new server id) is picked up again by itself, with a warning.
    ``len()`` raises TypeError until an epoch size is known, like a torch
    DataLoader over an IterableDataset. A loader pickles as its arguments: the
    copy connects in the process that iterates it (a fresh client id unless one
    was given). A forked copy (``os.fork``, a torch DataLoader worker) does the
    same: at its first use in the child it starts over from its arguments, with
    a context and sockets of its own, and never touches its parent's. Under
    torch's DataLoader use :class:`feedmux.torch.RemoteDataset`, which also gives
    each worker its share of a rank.
    """

    #: Always True (every loader grants credit and acknowledges its hand-outs); kept for
    #: code that still reads it, like the deprecated ``reliable=``.
    reliable = True

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        control: str | Sequence[str] | None = None,
        timeout: float | None = None,
        hwm: int = DEFAULT_HWM,
        world_size: int = 1,
        rank: int | None = None,
        group: str | None = None,
        with_meta: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        client_id: str | None = None,
        reliable: bool | None = None,
        curve_server_key: str | bytes | None = None,
        curve_certificate: str | None = None,
        tune_malloc: bool = True,
        diagnose_window: float | None = 60.0, diagnose_threshold: float = 0.25,
        resolve: Resolve | None = None, shm: bool = True,
        audit_log: str | os.PathLike[str] | None = None, audit_key: str | None = None,
        batch_size: int | None = None, drop_last: bool = False,
        bucket_by: str | None = None, pad: bool = False,
    ) -> None:
        if reliable is not None:  # (a copy made from the arguments does not warn again)
            warnings.warn(RELIABLE_IS_DEFAULT, DeprecationWarning, stacklevel=2)
        self._origin = Origin({name: value for name, value in locals().items()
                               if name not in ("self", "reliable")})
        register_with_torch(RemoteLoader)
        addresses, controls, derived = endpoints(address, control)
        _check_settings(timeout=timeout, world_size=world_size, hwm=hwm, client_id=client_id)
        #: Samples per batch handed out (None: single samples).
        self.batch_size = batch_size
        check_membership(world_size=world_size, rank=rank, group=group)
        self.rank, self.group, self.world_size = rank, group, world_size
        self.addresses, self.timeout, self.hwm = addresses, timeout, hwm
        self.with_meta, self.max_message_bytes = with_meta, max_message_bytes
        self._tune_malloc = tune_malloc
        self._handshakes = HandshakeWatch([], [])  # CURVE: what refused this loader's key
        self.shm = shm
        self._security = None if curve_server_key is None else ClientCurve.create(
            curve_server_key, curve_certificate)
        self.client_id = client_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._links = ServerLinks(
            addresses, controls, client_id=self.client_id, world_size=world_size,
            rank=-1 if rank is None else rank, group=group or "", timeout=timeout,
            heartbeat_interval=HEARTBEAT_INTERVAL, derived=derived,
            batch_size=batch_size, drop_last=drop_last, bucket_by=bucket_by, pad=pad,
        )
        self._diagnosis = InputDiagnosis(len(addresses), diagnose_window, diagnose_threshold)
        self._links.wait_share = self._diagnosis.share.report  # what the heartbeats carry
        self._context: zmq.Context[Any] | None = None
        self._data = DataSockets([], client_id="", addresses=(), tune_malloc=False)
        self._control: list[Any] = []  # one DEALER per server
        self._waits: LoaderWaits | None = None  # its sockets' poller, once connected
        # Closed; asked for the epoch size; said hello as a trainer (in this process).
        self._closed = self._asked = self._announced = False
        #: The current data message and the next sample of it to hand out.
        self._out = HandOut()
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._acks: HandOutAcks | None = None
        #: A ranked loader's mark file (opened when it connects) and whether a checkpoint was
        #: restored (a predecessor's marks then mean nothing).
        self._marks: MarkFile | None = None
        self._restored = False
        self._seen = SeenPositions()
        self._book = None if resolve is None else AddressBook(resolve)
        self._positions, self._recent = _trackers(self._links, self._out, rank, world_size)
        self._audit = open_audit(audit_log, audit_key, self, self._links)

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_loader, (self._origin.arguments,)

    def __getitem__(self, index: object) -> Any:  # a DataLoader took it for a map-style dataset
        raise TypeError(not_a_map(index))

    # -- the iterable ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        out = self._out
        index = out.index
        while index >= out.count:
            self._receive()
            out = self._out  # (a forked copy makes itself anew at its first receive)
            index = out.index
        if self.batch_size is not None:  # a step: the message's next batch_size rows, stacked
            out.index = stop = min(index + self.batch_size, out.count)
            if out.marked is not None:
                out.marked[0] = stop
            return batch_step(out.samples, out.tags, index, stop, out.server_id,
                              self.with_meta)
        out.index = index + 1
        if out.marked is not None:  # a ranked loader: kept across a SIGKILL (_markfile)
            out.marked[0] = index + 1
        if self.with_meta:
            return out.last_meta, out.samples[index]
        return out.samples[index]

    def iter_epoch(self) -> Iterator[Any]:
        """Yield this trainer's samples of one server epoch, like one pass of a DataLoader.

        The epoch is that of the next sample; the iterator ends before the first
        sample of a later epoch (which stays for the next call) or at the end of
        the stream. It needs no epoch size, so it works from the first epoch on.
        """
        epoch = self._upcoming()
        while epoch is not None and self._upcoming() == epoch:
            yield next(self)

    def _upcoming(self) -> int | None:
        """The epoch of the next sample, received first; None at the end of the stream."""
        with contextlib.suppress(StopIteration):  # (None at the end of the stream)
            while (epoch := self._out.upcoming_epoch()) is None:
                self._receive()
            return epoch
        return None

    def __len__(self) -> int:
        """Samples (steps) per epoch for this trainer; TypeError while the size is unknown.

        Before the first sample this asks the servers (a bounded wait for their
        welcome), so a declared epoch size is known from the start.
        """
        if self._links.epoch_size is None and not self._closed and not self._asked:
            self._asked = True  # once: a server that does not answer is not asked again
            self._connect(announce=False)
            assert self._waits is not None
            self._waits.for_welcome()
        return self._links.length()

    # -- what was seen --------------------------------------------------------------------
    @property
    def last_meta(self) -> SampleMeta | None:
        """Epoch, position and server of the sample most recently yielded."""
        return self._out.last_meta

    @property
    def last_epoch(self) -> int | None:
        """The server epoch of the sample most recently yielded (None before the first)."""
        return None if (meta := self.last_meta) is None else meta.epoch

    @property
    def last_position(self) -> int | None:
        """The position in its epoch of the sample most recently yielded."""
        return None if (meta := self.last_meta) is None else meta.position

    @property
    def server_ids(self) -> list[str]:
        """The id of each server, in address order ('' until it answered)."""
        return self._links.server_ids

    @property
    def epoch_size(self) -> int | None:
        """The total epoch size over all servers, once every one of them knows it."""
        return self._links.epoch_size

    def stats(self) -> dict[str, float | None]:
        """Is the training loop waiting for data? The last diagnosis window's figures.

        ``samples_per_second`` handed to the loop, ``wait_fraction`` of the time
        spent waiting inside ``next()``, the window's length ``window_s``, and
        the servers' ``server_busy_fraction`` (sampling, per sampling process)
        and ``server_blocked_fraction`` (waiting for trainers to take more),
        fetched over the control channel. Until the first window has passed, the
        figures so far (from a second after the first sample; None before, and
        the servers' until they answered); all None with ``diagnose_window=None``.
        """
        return self._diagnosis.stats(time.monotonic())

    def state_dict(self) -> dict[str, Any]:
        """Plain data: servers, the last (epoch, position, server) seen, messages received,
        and for a ranked trainer its job's position with each server (``"resume"``).

        Restored into a ranked loader (:meth:`load_state_dict`, before its first
        sample), the position is announced to the servers, which resume the job
        there: each rank gets exactly what an uninterrupted run would have given
        it from that step on (docs/resume.md). A free trainer's state records
        where it was, and whether that was between epochs (``"between_epochs"``).
        """
        between = None if self._positions else self._out.between_epochs(self._links.finished)
        return _state_of(self.addresses, self.server_ids, self.last_meta,
                         dict(self._links.received), self._positions, self._audit,
                         self._out.index, between)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (the last sample seen, and a ranked job's
        position, which the next hello announces). Any rank's state will do, from a job
        of any world size: the position is the job's.

        A free trainer (no ``rank``) resumes at epoch granularity: it takes the
        live stream where the server is. Its state saved in the middle of an epoch
        cannot be resumed there, and restoring one warns
        (:class:`~feedmux.errors.ResumeWarning`, docs/resume.md).
        """
        last = _restored_meta(state)
        if last is not None:
            if self._positions is None and not state.get("between_epochs"):
                warnings.warn(_mid_epoch_warning(last), ResumeWarning, stacklevel=2)
            self._out.restore_last(last)
        if self._positions is not None and state.get("resume") is not None:
            if self._announced:
                raise StreamValueError(_RESTORED_LATE)
            self._positions.restore(state["resume"])
            self._restored = True
            self._links.predecessor = _no_predecessor
        self._audit.resumed(state)
        self._origin.loaded = state  # a forked copy restores it again when it starts over

    # -- sockets --------------------------------------------------------------------------
    def _connect(self, announce: bool = True) -> None:
        """Open the sockets (once per process); ``announce``: say hello as a trainer.

        Asking for the epoch size (``len()``) does not announce the trainer: a
        state loaded after that and before the first sample still reaches the
        servers in the hello (a restored rank's position).
        """
        if self._closed:
            raise TransportClosedError(f"this RemoteLoader of {self.addresses} is closed")
        self._origin.follow(self)  # a forked copy starts over here, in the child
        if self._context is not None:
            if announce and not self._announced:
                self._announced = True
                # A trainer now: the servers may deal to it (welcomed already, when it asked
                # for len(): no Grant comes).
                self._data.grant_credit(self.hwm)
                self._act(self._links.hello())
            return
        # A fresh context in every process: a ZeroMQ context must never cross a fork.
        self._context = context = zmq.Context()
        data_sockets, self._control = open_sockets(
            context, self._links, client_id=self.client_id, hwm=self.hwm,
            max_message_bytes=self.max_message_bytes, security=self._security,
            instance=uuid.uuid4().hex[:8],  # a second loader with this client id is refused
        )
        # The acknowledging thread acknowledges; this thread only once a whole credit waits.
        self._data = DataSockets(data_sockets, client_id=self.client_id,
                                 addresses=self.addresses, tune_malloc=self._tune_malloc,
                                 ack_batch=self.hwm, shm=self.shm)
        # No credit yet: it is granted when a server welcomes this loader's hello (Grant), so
        # a loader asked for len() alone (a DataLoader's parent, which says no hello) and a
        # second loader refused for its client id are dealt nothing.
        self._links.views_held = self._data.views_held  # said to a trainer waiting for data
        controls = [link.control_address for link in self._links.links]
        if self._security is not None:  # a refused key is otherwise a silent timeout
            self._handshakes = HandshakeWatch(self._control, controls)
        sockets = [*self._handshakes.monitors, *data_sockets, *self._control]
        self._waits = LoaderWaits(sockets, self._control, self._links, self._serve_control,
                                  self._handshakes.explain)
        self._announced = announce
        self._open_marks(controls)
        self._act(self._links.hello() if announce else self._links.probe())
        self._finalizer = weakref.finalize(self, close_sockets, self._origin.pid, context,
                                           sockets)
        # A restarted rank continues after the last sample this one handed out, and a free
        # trainer's unfinished message goes to the others cut there: tell the servers every
        # few ms, from a thread (nothing per sample on the hot path).
        self._acks = HandOutAcks(controls, client_id=self.client_id,
                                 rank=-1 if self.rank is None else self.rank,
                                 progress=self._audit.guard(progress_of(self._out)),
                                 security=self._security, finished=self._data.finished,
                                 credits=self.hwm, left=left_of(self._out))
        weakref.finalize(self, self._acks.stop)
        if multiprocessing.parent_process() is not None:
            # A child process (a DataLoader worker) ends without running weakref
            # finalizers: close there, so that its goodbye reaches the servers.
            _close_at_child_exit(self)

    def _open_marks(self, controls: list[str]) -> None:
        """A ranked loader: read the mark file its dead predecessor of the same rank left on
        this host (what it handed out last, said in the hellos) and make its own."""
        if self.rank is None:
            return
        path = mark_path(self.addresses, controls, self.group or "", self.rank,
                         self.world_size)
        links = len(self.addresses)
        carried = None if self._restored else read_marks(
            path, rank=self.rank, world_size=self.world_size, links=links)
        try:
            self._marks = MarkFile.create(path, rank=self.rank, world_size=self.world_size,
                                          links=links, carried=carried or ())
        except OSError as error:
            log.warning("rank %d keeps no mark file (%s): if this process is killed, its "
                        "successor gets its last ~100 ms of samples again", self.rank, error)
            return
        self._out.marked = self._marks.index
        weakref.finalize(self, self._marks.close)
        if carried is not None and any(carried):
            log.info("rank %d continues after what its predecessor handed out: %s", self.rank,
                     carried)
            for link, mark in enumerate(carried):
                if mark is not None:
                    self._audit.predecessor(link, *mark)
            self._links.predecessor = carried.__getitem__

    def _act(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                # If the server is away and the queue full, the next heartbeat will do.
                send_or_drop(self._control[action.link], action.message)
            elif isinstance(action, Attach):
                self._data.attach(action.link, self._control[action.link], action.path)
            elif isinstance(action, Grant):
                if self._announced:  # a loader asked for len() alone is dealt nothing
                    self._data.grant_credit(self.hwm, action.link)
            else:  # the link's server restarted
                self._data.forget_ack(action.link)  # its sequence number means nothing now
                self._data.grant_credit(self.hwm, action.link)
                self._out.drop_rest(action.link, self._links.links[action.link].stale)

    def _receive(self) -> None:
        """Block until the next data message is current (or raise / end the iteration)."""
        self._audit.upto(self._out.index)  # before the servers hear of it (acknowledgements)
        self._connect()
        waits, links = self._waits, self._links
        assert waits is not None
        waited_from = now = time.monotonic()
        # Wait first when the last message needed a wait (LoaderWaits.first), the message
        # just handed out left for the acknowledging thread first.
        polled = waits.first and not links.finished
        if polled:
            self._data.finish_pending()
            now = waits.for_data(waited_from, now)
        while True:
            due = links.tick(now, waited_from)
            if due:
                self._act(due)
            if self._book is not None and self._book.due(now):
                self._act(self._book.follow(now, links, self._data.sockets, self._control,
                                            self._acks))
                self.addresses = self._data.addresses = links.data_addresses
            message = self._data.receive(links)
            if message is not None and self._take(message, now):
                # ``now`` is a moment old (taken after the last wait): close enough for the
                # input diagnosis, and one clock read less per message.
                if self._diagnosis.message(now, waited_from, len(message.samples)):
                    _ask_for_stats(self._control, self.client_id)
                for index, socket in enumerate(self._control):
                    if readable(socket):  # asked here: a method call less when idle
                        self._serve_control(index)
                waits.first = polled and now - waited_from > WAITED
                return
            if links.finished:
                raise StopIteration from None
            now, polled = waits.for_data(waited_from, now), True

    def _take(self, message: Data, now: float) -> bool:
        """Make ``message`` the current one; False when it is dropped (a stale server's)."""
        samples, tags, server_id = message.samples, message.tags, message.server_id
        count = len(samples)
        tracker = self._positions or self._recent
        if tracker is not None and not tracker.next_message(
                fresh=server_id not in self._links.links[self._data.link].stale):
            return False  # sent before its server restarted: the new one resumes here
        if self._recent is not None:  # a restarted server's first message: the old run's
            self._recent.serving(self._data.link, server_id)  # records are dropped
        actions = self._links.data(server_id, int(tags[0, 0]) if count else 0, now=now)
        if actions:
            self._act(actions)
        samples = unpacked(samples, self.batch_size is not None, self._links.pad)
        # Dealt to this trainer twice (a re-send crossed its acknowledgement)?
        samples, tags = self._seen.once(server_id, tags, samples, self.batch_size is not None)
        count = len(tags)
        current = None
        if self._acks is not None:  # (a server's first message waits until its marks can go)
            current = self._acks.current(self._data.link, server_id, tags, self._data.seq)
        if self._marks is not None:
            self._marks.message(self._data.link, server_id, tags)
        self._out.replace(samples, tags, server_id, count, current)
        self._audit.begin(self._data.link, server_id, tags, samples)
        return True

    def _serve_control(self, index: int) -> None:
        socket = self._control[index]
        while readable(socket):
            message = decode(socket.recv_multipart(copy=False), limits=CONTROL_LIMITS)
            if not self._diagnosis.answer(index, message, time.monotonic()):
                self._act(self._links.control(index, message))

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the sockets; iterating afterwards raises TransportClosedError."""
        self._closed = True
        if self._acks is not None:
            self._acks.stop()  # its last acknowledgement goes out before the sockets close
        if self._marks is not None:
            self._out.marked = None
            self._marks.close()  # a clean close: a successor starts afresh
        if self._context is not None and self._origin.pid == os.getpid():
            # What it received and did not hand out goes to the others now.
            current = self._out.current
            if current is not None and current[1] in self._links.links[current[0]].stale:
                current = None  # an old process's message: its numbers mean nothing now
            self._data.goodbye(_mark_of(current, self._out.index),
                               used_up=self._out.index >= self._out.count)
        self._audit.close(self._out.index, ended=self._links.finished)
        if self._finalizer is not None:
            self._finalizer()
        self._context = None

    def __enter__(self) -> RemoteLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteLoader({self.addresses!r}, timeout={self.timeout!r})"


def _no_predecessor(link: int) -> None:
    """A loader restored from a checkpoint continues from there, not from a predecessor."""
    return None


def _close_at_child_exit(loader: RemoteLoader) -> None:
    """Close ``loader`` (if still alive) when this multiprocessing child process exits."""
    ref = weakref.ref(loader)

    def close() -> None:
        target = ref()
        if target is not None and not target._closed:
            target.close()

    multiprocessing.util.Finalize(None, close, exitpriority=0)


def _mark_of(current: tuple[int, str, Any, int] | None,
             used: int) -> tuple[int, int, int, int] | None:
    """(link, sequence number, epoch, position) of the last sample handed out of the
    current message, or None."""
    if current is None or used <= 0:
        return None
    link, _, tags, seq = current
    row = tags[min(used, len(tags)) - 1]
    return link, seq, int(row[0]), int(row[1])


def _state_of(addresses: list[str], server_ids: list[str], meta: SampleMeta | None,
              received: dict[str, int], positions: RankPositions | None,
              audit: AuditLog | NoAudit, used: int,
              between_epochs: bool | None) -> dict[str, Any]:
    """RemoteLoader.state_dict's plain data (recorded as a checkpoint in ``audit``, with the
    ``used`` samples of the current message before it; ``between_epochs``: a free
    trainer's)."""
    state: dict[str, Any] = {
        "addresses": list(addresses),
        "server_ids": server_ids,
        "last_epoch": None if meta is None else meta.epoch,
        "last_position": None if meta is None else meta.position,
        "last_server_id": None if meta is None else meta.server_id,
        "received_messages": received,
    }
    if positions is not None:
        state.update(resume=positions.state(), rank=positions.rank,
                     world_size=positions.world_size)
    if between_epochs is not None:
        state["between_epochs"] = between_epochs
    return audit.checkpoint(state, used)


def _trackers(links: ServerLinks, out: HandOut, rank: int | None,
              world_size: int) -> tuple[RankPositions | None, HandedRanges | None]:
    """What a loader tells a server that must resume: a rank's position with each server
    (also saved by state_dict), or a free trainer's recent hand-outs."""
    count = len(links.links)
    if rank is not None:
        positions = RankPositions(count, rank=rank, world_size=world_size,
                                  current=out.progress)
        links.say_position(positions.announce)
        return positions, None
    recent = HandedRanges(count, current=out.progress)
    links.say_hand_outs(recent.announce, recent.below, recent.summarized)
    return None, recent


_RESTORED_LATE = ("expected load_state_dict before the loader's first sample (it tells "
                  "the servers where to resume), got it on a loader already iterating")


def _mid_epoch_warning(last: SampleMeta) -> str:
    return (f"restoring a free trainer's state saved in the middle of epoch {last.epoch} "
            f"(last position {last.position}): free trainers (no rank=) are dealt samples "
            "as they go, so they resume at epoch granularity. This loader takes the live "
            "stream where the server is; what was in flight to the saved trainer is not "
            "dealt again. For an exact resume mid-epoch give every trainer rank= and "
            "world_size=; otherwise save the state at an epoch boundary (when iter_epoch() "
            "ends). See docs/resume.md")


def _restored_meta(state: dict[str, Any]) -> SampleMeta | None:
    """The last sample a saved RemoteLoader state records, checked."""
    missing = {"last_epoch", "last_position", "last_server_id"} - set(state)
    if missing:
        raise StreamValueError(
            f"RemoteLoader state lacks {sorted(missing)}; got keys {sorted(state)}"
        )
    if state["last_epoch"] is None:
        return None
    return SampleMeta(int(state["last_epoch"]), int(state["last_position"]),
                      str(state["last_server_id"]))


def _rebuild_loader(arguments: dict[str, Any]) -> RemoteLoader:
    """A fresh, unconnected loader from the arguments of a pickled one."""
    return RemoteLoader(arguments.pop("address"), **arguments)


def _check_settings(*, timeout: float | None, world_size: int, hwm: int,
                    client_id: str | None) -> None:
    if timeout is not None and not timeout > 0:
        raise ConfigurationError(f"expected timeout None or > 0 seconds, got {timeout!r}")
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ConfigurationError(f"expected world_size an int >= 1, got {world_size!r}")
    if not (isinstance(hwm, int) and hwm >= 1):
        raise ConfigurationError(f"expected hwm an int >= 1, got {hwm!r}")
    if client_id is not None and not (isinstance(client_id, str)
                                      and len(client_id) <= MAX_CLIENT_ID):
        raise ConfigurationError(f"expected client_id a str of at most {MAX_CLIENT_ID} "
                                 f"characters, got {type(client_id).__name__} of "
                                 f"{len(str(client_id))} characters")


def _ask_for_stats(control: list[Any], client_id: str) -> None:
    """The diagnosis wants the servers' load: ask each (a full queue skips a window)."""
    request = StatsRequest(client_id=client_id)
    for socket in control:
        send_or_drop(socket, request)

