"""RemoteLoader: the trainer's end of the wire, an iterable of decoded samples.

This module owns the trainer's sockets and nothing else: one PULL socket
connected to every server's data endpoint (in reliable mode one DEALER per
server instead) and one DEALER per server's control endpoint. It connects,
polls, receives, decodes and sends; every decision about what the servers said
(welcomes, restarts, drains, ends of stream, remote errors, heartbeats,
timeouts) belongs to the pure link state in ``_link``, which it calls once per
message and never once per sample. It never imports the server package. Every
blocking wait is bounded: by the user's ``timeout``, or by a heartbeat interval
when no timeout is asked for (then it waits for data as long as it takes, by
the user's choice).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import zmq

from feedmux._security import ClientCurve
from feedmux._shm import ShmViews
from feedmux._transport import (
    DEFAULT_HWM,
    HEARTBEAT_INTERVAL,
    control_address_for,
    keep_freed_memory,
    make_socket,
    readable,
    send_message,
)
from feedmux.client._link import Action, Attach, Send, ServerLinks
from feedmux.errors import (
    ConfigurationError,
    ProtocolError,
    RemoteError,
    StreamValueError,
    TransportClosedError,
    TransportTimeoutError,
    VersionMismatchError,
)
from feedmux.protocol import (
    Ack,
    Credit,
    Data,
    EndOfStream,
    Error,
    Message,
    ShmAttach,
    decode,
    unpack_envelope,
)

__all__ = ["RemoteLoader", "SampleMeta", "fetch_stats"]

log = logging.getLogger("feedmux.client")

#: A frame larger than this makes the loader tune malloc (see ``tune_malloc``).
LARGE_MESSAGE_BYTES = 1 << 20
#: A data message larger than this is refused by ZeroMQ before it reaches Python.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30


class SampleMeta(NamedTuple):
    """Where a sample came from: the server's epoch (1-based), its position in that
    epoch (0-based) and the id of the server process that sent it."""

    epoch: int
    position: int
    server_id: str


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
        Trainers sharing the stream; ``len(loader)`` is ``epoch_size // world_size``.
    with_meta : bool
        Yield ``(SampleMeta, sample)`` pairs instead of bare samples.
    max_message_bytes : int
        Larger data messages are refused (and the connection dropped).
    curve_server_key : str or bytes, optional
        The server's public key (its ``.key`` file or the Z85 key): CURVE
        encryption on every socket of this loader.
    curve_certificate : str, optional
        This trainer's secret certificate, for a server that lets in only known
        clients; default: a fresh key pair.
    tune_malloc : bool
        When the first large message (over 1 MiB) arrives, make glibc's malloc
        keep freed large buffers for reuse in this process (see
        ``feedmux._transport.keep_freed_memory``): 1.2-1.8x the throughput of
        16 MiB samples at half the trainer CPU, for up to 1 GiB of freed heap
        kept. False leaves the allocator alone.
    shm : bool
        Map the shared-memory pool of a server on this host (proved in the
        handshake) and receive its large arrays as views of it, with no copy: a
        run of the pool is reused once every view of it is gone. False (or a
        server on another host) receives everything over the sockets.
    reliable : bool
        Talk to a server started with ``reliable=True`` / ``--reliable``: grant
        ``hwm`` messages of credit and acknowledge each message once all its
        samples were handed out, so that if this trainer dies, what it had not
        finished goes to the others.

    Notes
    -----
    Iteration ends (``StopIteration``) only when every server ran a finite
    number of epochs and said so; otherwise it goes on forever. A server that
    restarts (a new server id) is picked up again by itself, with a warning.
    ``len()`` raises TypeError until an epoch size is known, like a torch
    DataLoader over an IterableDataset.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        control: str | Sequence[str] | None = None,
        timeout: float | None = None,
        hwm: int = DEFAULT_HWM,
        world_size: int = 1,
        with_meta: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        client_id: str | None = None,
        reliable: bool = False,
        curve_server_key: str | bytes | None = None,
        curve_certificate: str | None = None,
        tune_malloc: bool = True,
        shm: bool = True,
    ) -> None:
        addresses, controls = _endpoints(address, control)
        _check_settings(timeout=timeout, world_size=world_size, hwm=hwm)
        self.addresses = addresses
        self.timeout = timeout
        self.hwm = hwm
        self.world_size = world_size
        self.with_meta = with_meta
        self.max_message_bytes = max_message_bytes
        self.reliable = reliable
        self._tune_malloc = tune_malloc
        self.shm = shm
        self._views: ShmViews | None = None
        self._security = (
            None if curve_server_key is None
            else ClientCurve.create(curve_server_key, curve_certificate)
        )
        self.client_id = client_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._links = ServerLinks(
            addresses, controls, client_id=self.client_id, world_size=world_size,
            reliable=reliable, timeout=timeout, heartbeat_interval=HEARTBEAT_INTERVAL,
        )
        # Reliable mode: (link number, sequence number) of the message being handed out.
        self._pending_ack: tuple[int, int] | None = None
        self._turn = 0
        self._context: zmq.Context[Any] | None = None
        self._pid = 0
        self._data: Any = None  # plain mode: one PULL socket connected to every server
        self._data_sockets: list[Any] = []  # reliable mode: one DEALER per server
        self._control: list[Any] = []  # one DEALER per server
        self._poller: zmq.Poller | None = None
        self._closed = False
        # The current data message: its samples, tags and the next index to hand out.
        self._samples: Sequence[Any] = ()
        self._tags: Any = None
        self._server_id = ""
        self._index = 0
        self._count = 0
        self._last: SampleMeta | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # -- the iterable ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        index = self._index
        while index >= self._count:
            self._receive()
            index = self._index
        self._index = index + 1
        if self.with_meta:
            return self.last_meta, self._samples[index]
        return self._samples[index]

    def iter_epoch(self) -> Iterator[Any]:
        """Yield this trainer's samples of one server epoch, like one pass of a DataLoader.

        The epoch is that of the next sample; the iterator ends before the first
        sample of a later epoch (which stays for the next call) or at the end of
        the stream. It needs no epoch size, so it works from the first epoch on.
        """
        epoch = None
        while True:
            while self._index >= self._count:
                try:
                    self._receive()
                except StopIteration:
                    return
            upcoming = int(self._tags[self._index, 0])
            if epoch is None:
                epoch = upcoming
            elif upcoming != epoch:
                return
            yield next(self)

    def __len__(self) -> int:
        return self._links.length()

    # -- what was seen --------------------------------------------------------------------
    @property
    def last_meta(self) -> SampleMeta | None:
        """Epoch, position and server of the sample most recently yielded."""
        if self._index == 0 or self._tags is None:
            return self._last
        row = self._tags[self._index - 1]
        return SampleMeta(int(row[0]), int(row[1]), self._server_id)

    @property
    def last_epoch(self) -> int | None:
        """The server epoch of the sample most recently yielded (None before the first)."""
        meta = self.last_meta
        return None if meta is None else meta.epoch

    @property
    def last_position(self) -> int | None:
        """The position in its epoch of the sample most recently yielded."""
        meta = self.last_meta
        return None if meta is None else meta.position

    @property
    def server_ids(self) -> list[str]:
        """The id of each server, in address order ('' until it answered)."""
        return self._links.server_ids

    @property
    def epoch_size(self) -> int | None:
        """The total epoch size over all servers, once every one of them knows it."""
        return self._links.epoch_size

    def state_dict(self) -> dict[str, Any]:
        """Plain data: servers, the last (epoch, position, server) seen, messages received.

        The server is not rewound on restore (it serves a live stream, as tf.data
        service does); the state records where this trainer was so a resumed run
        can tell which epoch it is in.
        """
        meta = self.last_meta
        return {
            "addresses": list(self.addresses),
            "server_ids": self.server_ids,
            "last_epoch": None if meta is None else meta.epoch,
            "last_position": None if meta is None else meta.position,
            "last_server_id": None if meta is None else meta.server_id,
            "received_messages": dict(self._links.received),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (the last sample seen)."""
        missing = {"last_epoch", "last_position", "last_server_id"} - set(state)
        if missing:
            raise StreamValueError(
                f"RemoteLoader state lacks {sorted(missing)}; got keys {sorted(state)}"
            )
        if state["last_epoch"] is not None:
            self._last = SampleMeta(
                int(state["last_epoch"]), int(state["last_position"]),
                str(state["last_server_id"]),
            )
            if self._index == 0:
                self._tags = None

    # -- sockets --------------------------------------------------------------------------
    def _connect(self) -> None:
        if self._closed:
            raise TransportClosedError(f"this RemoteLoader of {self.addresses} is closed")
        if self._context is not None and self._pid == os.getpid():
            return
        # A fresh context in every process: a ZeroMQ context must never cross a fork.
        self._context = context = zmq.Context()
        self._pid = os.getpid()
        self._views = ShmViews() if self.shm else None
        self._data, self._data_sockets, self._control = _open_sockets(
            context, self._links, reliable=self.reliable, hwm=self.hwm,
            max_message_bytes=self.max_message_bytes, security=self._security,
        )
        sockets = [*([self._data] if self._data is not None else []), *self._data_sockets,
                   *self._control]
        self._poller = zmq.Poller()
        for socket in sockets:
            self._poller.register(socket, zmq.POLLIN)
        for index in range(len(self._data_sockets)):
            self._grant_credit(index)
        self._act(self._links.hello())
        self._finalizer = weakref.finalize(self, _close_sockets, self._pid, context, sockets)

    def _act(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                # If the server is away and the queue full, the next heartbeat will do.
                _send_or_drop(self._control[action.link], action.message)
            elif isinstance(action, Attach):
                if self._views is not None:
                    _attach(self._views, self._control[action.link], action.path,
                            self.client_id)
            else:  # a restarted server behind a reliable link
                if self._pending_ack is not None and self._pending_ack[0] == action.link:
                    self._pending_ack = None  # its sequence number means nothing now
                self._grant_credit(action.link)

    def _grant_credit(self, index: int) -> None:
        # If the queue towards an absent server is full, the next welcome grants again.
        _send_or_drop(self._data_sockets[index], Credit(credits=self.hwm, client_id=self.client_id))

    def _receive(self) -> None:
        """Block until the next data message is current (or raise / end the iteration)."""
        self._connect()
        assert self._poller is not None
        links = self._links
        waited_from = now = time.monotonic()
        while True:
            due = links.tick(now)
            if due:
                self._act(due)
            message = self._recv_data()
            if message is not None:
                self._take(message, now)
                for index in range(len(self._control)):
                    self._serve_control(index)
                return
            if links.finished:
                raise StopIteration from None
            wait = links.wait(waited_from, now)
            events = dict(self._poller.poll(max(1, int(wait * 1000))))
            for index, socket in enumerate(self._control):
                if socket in events:
                    self._serve_control(index)
            now = time.monotonic()

    def _recv_data(self) -> Data | None:
        """The next data message waiting on the data socket(s), or None."""
        if not self.reliable:
            try:
                frames = self._data.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            _, message = self._decode_data(frames)
            if not isinstance(message, Data):
                raise ProtocolError(
                    f"expected a data message on the data socket, got {type(message).__name__}"
                )
            return message
        if self._pending_ack is not None:
            # Every sample of the current message was handed out: acknowledge it.
            index, seq = self._pending_ack
            self._pending_ack = None
            # A dropped ack only means the server deals that message again.
            _send_or_drop(self._data_sockets[index], Ack(seqs=[seq], client_id=self.client_id))
        count = len(self._data_sockets)
        for offset in range(count):
            index = (self._turn + offset) % count
            socket = self._data_sockets[index]
            while readable(socket):
                seq, message = self._decode_data(socket.recv_multipart(copy=False), enveloped=True)
                if isinstance(message, Data):
                    self._turn = (index + 1) % count
                    if seq:
                        self._pending_ack = (index, seq)
                    return message
                if isinstance(message, EndOfStream):
                    self._links.data_end_of_stream(index, message.server_id)
        return None

    def _decode_data(self, frames: list[Any], *, enveloped: bool = False) -> tuple[int, Message]:
        """The sequence number (0 without an envelope) and the message of a data message."""
        seq = 0
        try:
            if enveloped:
                seq, frames = unpack_envelope(frames)
            if self._tune_malloc and len(frames) > 2 and len(frames[-1]) > LARGE_MESSAGE_BYTES:
                self._tune_malloc = False
                keep_freed_memory()
            message = decode(frames, resolve=self._views)
        except VersionMismatchError:
            raise
        except ProtocolError as error:
            raise ProtocolError(f"malformed data message from {self.addresses}: {error}") from error
        return seq, message

    def _take(self, message: Data, now: float) -> None:
        samples, tags, server_id = message.samples, message.tags, message.server_id
        count = len(samples)
        actions = self._links.data(server_id, int(tags[0, 0]) if count else 0, now=now)
        if actions:
            self._act(actions)
        self._samples, self._tags, self._server_id = samples, tags, server_id
        self._index, self._count = 0, count

    def _serve_control(self, index: int) -> None:
        socket = self._control[index]
        while readable(socket):
            self._act(self._links.control(index, decode(socket.recv_multipart(copy=False))))

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the sockets; iterating afterwards raises TransportClosedError."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()
        self._context = None

    def __enter__(self) -> RemoteLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteLoader({self.addresses!r}, timeout={self.timeout!r})"


def _endpoints(
    address: str | Sequence[str], control: str | Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """The data endpoints and one control endpoint per data endpoint, checked."""
    addresses = [address] if isinstance(address, str) else list(address)
    if not addresses or not all(isinstance(a, str) and a for a in addresses):
        raise ConfigurationError(
            f"expected a data endpoint or a non-empty list of them, got {address!r}"
        )
    if control is None:
        controls = [control_address_for(a) for a in addresses]
    else:
        controls = [control] if isinstance(control, str) else list(control)
    if len(controls) != len(addresses):
        raise ConfigurationError(
            f"expected one control endpoint per data endpoint ({len(addresses)}), "
            f"got {len(controls)}: {controls!r}"
        )
    return addresses, controls


def _check_settings(*, timeout: float | None, world_size: int, hwm: int) -> None:
    if timeout is not None and not timeout > 0:
        raise ConfigurationError(f"expected timeout None or > 0 seconds, got {timeout!r}")
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ConfigurationError(f"expected world_size an int >= 1, got {world_size!r}")
    if not (isinstance(hwm, int) and hwm >= 1):
        raise ConfigurationError(f"expected hwm an int >= 1, got {hwm!r}")


def _open_sockets(
    context: zmq.Context[Any],
    links: ServerLinks,
    *,
    reliable: bool,
    hwm: int,
    max_message_bytes: int,
    security: ClientCurve | None,
) -> tuple[Any, list[Any], list[Any]]:
    """Connected sockets: the plain PULL (None in reliable mode), the reliable data
    DEALERs (one per server, none in plain mode) and the control DEALERs."""
    data = None
    data_sockets: list[Any] = []
    if reliable:
        # Credit keeps these queues below their limit, so heartbeats are safe here.
        data_sockets = targets = [
            make_socket(context, zmq.DEALER, hwm=hwm + 16, max_message_bytes=max_message_bytes,
                        security=security)
            for _ in links.links
        ]
    else:
        data = make_socket(context, zmq.PULL, hwm=hwm, max_message_bytes=max_message_bytes,
                           heartbeats=False, security=security)
        targets = [data] * len(links.links)
    control = [
        make_socket(context, zmq.DEALER, hwm=100, max_message_bytes=1 << 20, security=security)
        for _ in links.links
    ]
    for target, control_socket, link in zip(targets, control, links.links, strict=True):
        target.connect(link.data_address)
        control_socket.connect(link.control_address)
    return data, data_sockets, control


def _attach(views: ShmViews, control: Any, path: str, client_id: str) -> None:
    """Map a server's pool; proving it by the token read there turns the shm path on."""
    try:
        token = views.attach(path)
    except OSError as error:  # another host, another container: the sockets it is
        log.info("not using the shared memory at %s: %s", path, error)
        return
    _send_or_drop(control, ShmAttach(token=token, client_id=client_id))


def _send_or_drop(socket: Any, message: Message) -> None:
    """Send without blocking; a message that finds the queue full is dropped."""
    try:
        send_message(socket, message, flags=zmq.NOBLOCK)
    except zmq.Again:
        pass


def _close_sockets(pid: int, context: zmq.Context[Any], sockets: list[Any]) -> None:
    if pid != os.getpid():
        return  # a forked child must not touch its parent's sockets
    for socket in sockets:
        socket.close(linger=0)
    context.term()


def fetch_stats(
    control_address: str,
    *,
    timeout: float = 2.0,
    curve_server_key: str | bytes | None = None,
    curve_certificate: str | None = None,
) -> dict[str, Any]:
    """Ask the server at ``control_address`` for its statistics.

    Raises :class:`~feedmux.errors.TransportTimeoutError` when it does not answer
    within ``timeout`` seconds. The ``curve_*`` arguments are those of
    :class:`RemoteLoader`.
    """
    from feedmux.protocol import Stats, StatsRequest

    security = (
        None if curve_server_key is None
        else ClientCurve.create(curve_server_key, curve_certificate)
    )
    context: zmq.Context[Any] = zmq.Context()
    socket = make_socket(context, zmq.DEALER, hwm=10, max_message_bytes=1 << 20,
                         security=security)
    try:
        socket.connect(control_address)
        send_message(socket, StatsRequest(client_id=f"stats-{os.getpid()}"))
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if not socket.poll(int(remaining * 1000) + 1):
                break
            message = decode(socket.recv_multipart(copy=False))
            if isinstance(message, Stats):
                return dict(message.values)
            if isinstance(message, Error):
                raise RemoteError(message.type, message.message, message.traceback,
                                  message.server_id or control_address)
        raise TransportTimeoutError(f"no answer from {control_address} within {timeout:g} s")
    finally:
        socket.close(linger=0)
        context.term()
