"""RemoteLoader: the trainer's end of the wire, an iterable of decoded samples.

This module owns the trainer's sockets: one PULL socket connected to every
server's data endpoint and one DEALER per server's control endpoint (hello,
heartbeats, the end-of-stream handshake, remote errors). It never imports the
server package. Every blocking wait is bounded: by the user's ``timeout``, or
by a short poll interval when no timeout is asked for (then it waits for data
as long as it takes, by the user's choice).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import zmq

from feedmux._security import ClientCurve
from feedmux._transport import (
    DEFAULT_HWM,
    HEARTBEAT_INTERVAL,
    control_address_for,
    keep_freed_memory,
    make_socket,
    readable,
    send_message,
)
from feedmux.errors import (
    ConfigurationError,
    ProtocolError,
    RemoteError,
    StreamValueError,
    TransportClosedError,
    TransportError,
    TransportTimeoutError,
    VersionMismatchError,
)
from feedmux.protocol import (
    Ack,
    Credit,
    Data,
    Drain,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Message,
    Welcome,
    decode,
)

__all__ = ["RemoteLoader", "SampleMeta", "fetch_stats"]

log = logging.getLogger("feedmux.client")

#: Seconds of data without any answer on a control endpoint before a warning.
CONTROL_SILENCE_WARNING = 5.0
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


@dataclass
class _ServerLink:
    """What this trainer knows about one server (one control endpoint)."""

    data_address: str
    control_address: str
    socket: Any = None
    data_socket: Any = None  # reliable mode: this server's own data DEALER
    server_id: str = ""
    epoch_size: int | None = None
    finished: bool = False


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
    ) -> None:
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
        if timeout is not None and not timeout > 0:
            raise ConfigurationError(f"expected timeout None or > 0 seconds, got {timeout!r}")
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ConfigurationError(f"expected world_size an int >= 1, got {world_size!r}")
        if not (isinstance(hwm, int) and hwm >= 1):
            raise ConfigurationError(f"expected hwm an int >= 1, got {hwm!r}")
        self.addresses = addresses
        self.timeout = timeout
        self.hwm = hwm
        self.world_size = world_size
        self.with_meta = with_meta
        self.max_message_bytes = max_message_bytes
        self.reliable = reliable
        self._tune_malloc = tune_malloc
        self._security = (
            None if curve_server_key is None
            else ClientCurve.create(curve_server_key, curve_certificate)
        )
        self._pending_ack: tuple[_ServerLink, int] | None = None
        # Set at the first data message until every control endpoint has answered.
        self._silent_since: float | None = None
        self._first_data = True
        self._turn = 0
        self.client_id = client_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._links = [_ServerLink(a, c) for a, c in zip(addresses, controls, strict=True)]
        self._context: zmq.Context[Any] | None = None
        self._pid = 0
        self._data: Any = None
        self._poller: zmq.Poller | None = None
        self._closed = False
        # The current data message: its samples, tags and the next index to hand out.
        self._samples: Sequence[Any] = ()
        self._tags: Any = None
        self._server_id = ""
        self._index = 0
        self._count = 0
        self._received: dict[str, int] = {}
        self._last_heartbeat = 0.0
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
        sizes = [link.epoch_size for link in self._links]
        if not self._links or any(size is None for size in sizes):
            raise TypeError(
                "the epoch size is not known yet: the server learns it after its first epoch "
                "(or declare it with --epoch-size)"
            )
        return max(1, sum(size for size in sizes if size is not None) // self.world_size)

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
        return [link.server_id for link in self._links]

    @property
    def epoch_size(self) -> int | None:
        """The total epoch size over all servers, once every one of them knows it."""
        sizes = [link.epoch_size for link in self._links]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)

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
            "received_messages": dict(self._received),
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
        self._context = zmq.Context()
        self._pid = os.getpid()
        self._poller = zmq.Poller()
        sockets = []
        if not self.reliable:
            self._data = make_socket(
                self._context, zmq.PULL, hwm=self.hwm, max_message_bytes=self.max_message_bytes,
                heartbeats=False, security=self._security,
            )
            self._poller.register(self._data, zmq.POLLIN)
            sockets.append(self._data)
        for link in self._links:
            if self.reliable:
                # Credit keeps this queue below its limit, so heartbeats are safe here.
                link.data_socket = make_socket(
                    self._context, zmq.DEALER, hwm=self.hwm + 16,
                    max_message_bytes=self.max_message_bytes, security=self._security,
                )
                link.data_socket.connect(link.data_address)
                self._poller.register(link.data_socket, zmq.POLLIN)
                sockets.append(link.data_socket)
                self._grant_credit(link)
            else:
                self._data.connect(link.data_address)
            link.socket = make_socket(self._context, zmq.DEALER, hwm=100,
                                      max_message_bytes=1 << 20, security=self._security)
            link.socket.connect(link.control_address)
            self._poller.register(link.socket, zmq.POLLIN)
            sockets.append(link.socket)
            self._send(link, Hello(client_id=self.client_id, world_size=self.world_size))
        self._finalizer = weakref.finalize(
            self, _close_sockets, self._pid, self._context, sockets
        )

    def _grant_credit(self, link: _ServerLink) -> None:
        try:
            send_message(link.data_socket, Credit(credits=self.hwm, client_id=self.client_id),
                         flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the queue towards an absent server is full: the next welcome grants again

    def _send(self, link: _ServerLink, message: Message) -> None:
        try:
            send_message(link.socket, message, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the server is away and the queue is full: the next heartbeat will do

    def _receive(self) -> None:
        """Block until the next data message is current (or raise / end the iteration)."""
        self._connect()
        assert self._poller is not None
        waited_from = time.monotonic()
        while True:
            self._heartbeat_if_due()
            message = self._recv_data()
            if message is None:
                if self._all_finished():
                    raise StopIteration from None
                now = time.monotonic()
                if self.timeout is not None and now - waited_from >= self.timeout:
                    raise TransportTimeoutError(
                        f"no data from {', '.join(self.addresses)} for {self.timeout:g} s "
                        f"(servers: {self._describe_servers()})"
                    ) from None
                remaining = HEARTBEAT_INTERVAL
                if self.timeout is not None:
                    remaining = min(remaining, self.timeout - (now - waited_from))
                events = dict(self._poller.poll(max(1, int(remaining * 1000))))
                for link in self._links:
                    if link.socket in events:
                        self._serve_control(link)
                continue
            self._take(message)
            for link in self._links:
                if readable(link.socket):
                    self._serve_control(link)
            if self._silent_since is not None:
                self._check_control_answers()
            return

    def _check_control_answers(self) -> None:
        """Warn once when data flows but a control endpoint never answered (a wrong address)."""
        silent = [link.control_address for link in self._links if not link.server_id]
        if not silent:
            self._silent_since = None
            return
        assert self._silent_since is not None
        if time.monotonic() - self._silent_since > CONTROL_SILENCE_WARNING:
            log.warning(
                "data is arriving but the control endpoint(s) %s never answered in %g s: "
                "is the control address right? (default: data port + 1) Without it this "
                "loader learns no epoch size, no end of stream and no remote errors",
                ", ".join(silent), CONTROL_SILENCE_WARNING,
            )
            self._silent_since = None

    def _recv_data(self) -> Data | None:
        """The next data message waiting on the data socket(s), or None."""
        if not self.reliable:
            try:
                frames = self._data.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            message = self._decode_data(frames)
            if not isinstance(message, Data):
                raise ProtocolError(
                    f"expected a data message on the data socket, got {type(message).__name__}"
                )
            return message
        if self._pending_ack is not None:
            # Every sample of the current message was handed out: acknowledge it.
            link, seq = self._pending_ack
            self._pending_ack = None
            try:
                send_message(link.data_socket, Ack(seqs=[seq], client_id=self.client_id),
                             flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
        links = self._links
        for offset in range(len(links)):
            link = links[(self._turn + offset) % len(links)]
            while readable(link.data_socket):
                frames = link.data_socket.recv_multipart(copy=False)
                seq = int.from_bytes(frames[0].bytes, "little")
                message = self._decode_data(frames[1:])
                if isinstance(message, Data):
                    self._turn = (self._turn + offset + 1) % len(links)
                    if seq:
                        self._pending_ack = (link, seq)
                    return message
                if isinstance(message, EndOfStream) and message.server_id in ("", link.server_id):
                    link.finished = True
        return None

    def _decode_data(self, frames: list[Any]) -> Message:
        if self._tune_malloc and len(frames) > 2 and len(frames[-1]) > LARGE_MESSAGE_BYTES:
            self._tune_malloc = False
            keep_freed_memory()
        try:
            return decode(frames)
        except VersionMismatchError:
            raise
        except ProtocolError as error:
            raise ProtocolError(f"malformed data message from {self.addresses}: {error}") from error

    def _take(self, message: Data) -> None:
        if self._first_data:
            self._first_data = False
            self._silent_since = time.monotonic()
        server_id = message.server_id
        if server_id not in self._received:
            self._on_new_server(server_id)
        self._received[server_id] = self._received.get(server_id, 0) + 1
        self._samples, self._tags, self._server_id = message.samples, message.tags, server_id
        self._index, self._count = 0, len(message.samples)
        if self._count and self._tags[0, 0] > 1 and self.epoch_size is None:
            # An epoch has ended, so the server knows its size: ask now, not at the next beat.
            self._last_heartbeat = 0.0

    def _on_new_server(self, server_id: str) -> None:
        known = {link.server_id for link in self._links}
        if server_id not in known:
            # A restarted server (or a first message racing its welcome): say hello again.
            for link in self._links:
                self._send(link, Hello(client_id=self.client_id, world_size=self.world_size))
        self._received[server_id] = 0

    def _serve_control(self, link: _ServerLink) -> None:
        while readable(link.socket):
            frames = link.socket.recv_multipart(copy=False)
            message = decode(frames)
            if isinstance(message, Welcome):
                if message.reliable != self.reliable:
                    raise TransportError(
                        f"the server at {link.control_address} "
                        f"{'uses' if message.reliable else 'does not use'} reliable delivery: "
                        f"expected RemoteLoader(..., reliable={message.reliable}), "
                        f"got reliable={self.reliable}"
                    )
                if link.server_id and link.server_id != message.server_id:
                    log.warning(
                        "server at %s restarted: server id %s, before %s; continuing",
                        link.control_address, message.server_id, link.server_id,
                    )
                    link.finished = False
                    if self.reliable:
                        if self._pending_ack is not None and self._pending_ack[0] is link:
                            self._pending_ack = None  # its sequence number means nothing now
                        self._grant_credit(link)
                link.server_id = message.server_id
                link.epoch_size = message.epoch_size
            elif isinstance(message, Drain):
                self._send(link, Heartbeat(
                    sender_id=self.client_id,
                    received_messages=self._received.get(message.server_id, 0),
                ))
            elif isinstance(message, EndOfStream):
                if message.server_id == link.server_id or not link.server_id:
                    link.finished = True
            elif isinstance(message, Error):
                if message.type.rsplit(".", 1)[-1] == "VersionMismatchError":
                    raise VersionMismatchError(f"{message.message} (server {link.control_address})")
                raise RemoteError(message.type, message.message, message.traceback,
                                  message.server_id or link.control_address)

    def _heartbeat_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < HEARTBEAT_INTERVAL:
            return
        self._last_heartbeat = now
        for link in self._links:
            self._send(link, Heartbeat(
                sender_id=self.client_id, received_messages=self._received.get(link.server_id, 0)
            ))

    def _all_finished(self) -> bool:
        return all(link.finished for link in self._links)

    def _describe_servers(self) -> str:
        return ", ".join(
            f"{link.control_address}={link.server_id or 'never answered'}" for link in self._links
        )

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
