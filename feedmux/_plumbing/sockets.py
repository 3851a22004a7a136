"""ZeroMQ plumbing shared by the server and the client.

This module owns socket options, address arithmetic and the translation of
``zmq.ZMQError`` into :mod:`feedmux.errors`. It knows nothing of the wire
format beyond handing a message to :func:`feedmux.protocol.encode` in
:func:`send_message` (``decode`` takes zmq frames as they come), and apart
from a once-per-process allocator setting it holds no state of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Iterator, Sequence
from typing import Any

import zmq

from feedmux.errors import TransportError
from feedmux.protocol import Message, encode

__all__ = [
    "CONTROL_FRAME_BYTES",
    "CONTROL_INBOUND_FRAME_BYTES",
    "DATA_INBOUND_FRAME_BYTES",
    "DATA_RCVHWM",
    "DEFAULT_BIND",
    "DEFAULT_HWM",
    "HALF_OPEN_TIMEOUT",
    "HEARTBEAT_INTERVAL",
    "UNLIMITED",
    "check_port",
    "bind",
    "bound_address",
    "control_address_for",
    "make_socket",
    "keep_freed_memory",
    "mapped_zmq_errors",
    "readable",
    "send_message",
]

#: Where ``feedmux serve`` binds its data socket unless told otherwise: loopback only.
DEFAULT_BIND = "tcp://127.0.0.1:5555"
#: Messages queued per peer on each side. With transport batching one message holds
#: up to a few MiB, so this bounds the memory a stalled trainer can pin on the server.
DEFAULT_HWM = 8
#: A receive limit of none (libzmq's 0): for sockets whose peer bounds what it sends.
UNLIMITED = 0
#: Seconds between application heartbeats (trainer -> server) and between ZMTP pings.
HEARTBEAT_INTERVAL = 1.0
#: Seconds a TCP connection may hold data its peer has not acknowledged before the kernel
#: closes it (``TCP_USER_TIMEOUT``, libzmq's ``ZMQ_TCP_MAXRT``). A peer host that vanished
#: (crashed, or behind a link that went down for good) sends no FIN or RST: without a bound
#: the kernel retransmits for about 15 minutes (``net.ipv4.tcp_retries2``), and TCP
#: keepalive does not help, it waits for an idle connection. Longer than a short outage
#: plus the retransmission back-off after it (on a fast link retries go 0.2, 0.6, 1.4, 3,
#: 6.2 and 12.6 s after the first send: an outage of up to about 12 s stays a pause). The
#: server's ``SILENCE_GRACE`` for a free trainer is this same time: a silent trainer and a
#: half-open connection are given as long.
HALF_OPEN_TIMEOUT = 15.0

#: Largest frame a loader's control socket accepts (libzmq's ``MAXMSGSIZE`` is per
#: frame and drops the connection of a peer that exceeds it before anything reaches
#: Python): a server's Error carries a traceback of a few KiB at most (the server cuts
#: it to fit, see ``error_message``), its statistics a few KiB.
CONTROL_FRAME_BYTES = 64 * 1024
#: Largest frame the server's control socket accepts: heartbeat, statistics request and
#: acknowledgement are a few hundred bytes (a client id is at most ``MAX_CLIENT_ID``
#: characters); a free trainer's hello to a restarted server carries what it handed out
#: lately (up to ``HANDED_RANGES`` ranges: a trainer of length-bucketed batches hands out
#: scattered positions, a range each) and the old server's last summary (up to
#: ``MAX_SUMMARY_RUNS`` runs): up to about 40 KiB.
CONTROL_INBOUND_FRAME_BYTES = 64 * 1024
#: Largest frame the server's data socket accepts: trainers send only credit and
#: acknowledgements there, each well under a KiB.
DATA_INBOUND_FRAME_BYTES = 16 * 1024
#: Messages queued per trainer on the server's data socket: a trainer sends
#: at most one acknowledgement per message it was granted (at most ``MAX_CREDIT``,
#: 256) and a credit grant now and then before the server reads them (5 MiB a
#: connection at most, with the frame limit).
DATA_RCVHWM = 320
#: Longest client id a loader may use (it travels in every hello and acknowledgement).
MAX_CLIENT_ID = 1024

_TCP = re.compile(r"^tcp://(?P<host>.+):(?P<port>\d+)$")


def control_address_for(data_address: str) -> str:
    """Return the default control endpoint of a data endpoint: the same host, port + 1.

    Port 0 (any free port) stays 0: each socket then gets its own free port, and
    the server reports both (:func:`bound_address`).

    Examples
    --------
    >>> control_address_for("tcp://127.0.0.1:5555")
    'tcp://127.0.0.1:5556'
    >>> control_address_for("tcp://127.0.0.1:0")
    'tcp://127.0.0.1:0'
    >>> control_address_for("ipc:///tmp/feed")
    'ipc:///tmp/feed.control'
    """
    match = _TCP.match(data_address)
    if match:
        port = check_port(data_address)
        if port == 65535:
            raise TransportError(
                f"the data endpoint {data_address!r} uses port 65535, so the default control "
                "port (data port + 1) does not exist; pass the control endpoint explicitly"
            )
        return f"tcp://{match['host']}:{port + 1 if port else 0}"
    if data_address.startswith(("ipc://", "inproc://")):
        return data_address + ".control"
    raise TransportError(
        f"cannot derive a control endpoint from {data_address!r}: expected tcp://HOST:PORT, "
        "ipc://PATH or inproc://NAME; pass the control endpoint explicitly"
    )


def check_port(address: str) -> int:
    """The port of a ``tcp://`` endpoint, checked to be in ``[0, 65535]`` (-1 for other transports).

    libzmq takes a port such as 99999 modulo 65536 and listens elsewhere than asked.

    Examples
    --------
    >>> check_port("tcp://127.0.0.1:5555")
    5555
    >>> check_port("tcp://127.0.0.1:99999")
    Traceback (most recent call last):
    ...
    feedmux.errors.TransportError: expected a port in [0, 65535], got 99999 in 'tcp://127.0.0.1:99999'
    """
    match = _TCP.match(address)
    if not match:
        return -1
    port = int(match["port"])
    if port > 65535:
        raise TransportError(f"expected a port in [0, 65535], got {port} in {address!r}")
    return port


@contextlib.contextmanager
def mapped_zmq_errors(action: str, address: str = "") -> Iterator[None]:
    """Translate ``zmq.ZMQError`` raised inside the block into :class:`TransportError`."""
    try:
        yield
    except zmq.ZMQError as error:
        where = f" {address}" if address else ""
        raise TransportError(f"cannot {action}{where}: {error.strerror}") from error


def make_socket(
    context: zmq.Context[Any],
    kind: int,
    *,
    hwm: int = DEFAULT_HWM,
    rcvhwm: int | None = None,
    max_message_bytes: int = -1,
    heartbeats: bool = True,
    half_open_bound: bool = True,
    security: Any = None,
) -> zmq.Socket[Any]:
    """A socket with feedmux's options: bounded queues, linger 0, dead-peer detection.

    ``heartbeats`` turns on ZMTP heartbeats, which make a frozen peer (e.g.
    SIGSTOP) visible as a dropped connection instead of a silent stall. Use
    them only where the receive queue cannot fill: on a socket whose receive
    queue fills up (a data socket under back-pressure, a trainer in a long
    step that reads nothing) libzmq 4.3 stops reading the connection, misses
    the peer's pings, drops a healthy connection with its queued messages, and
    can then abort on an assertion (``_input_stopped``, libzmq issue 3937; or
    ``!_io_error`` at its next ping once the peer has gone, issue 4364).
    Every socket with heartbeats therefore takes ``rcvhwm=UNLIMITED`` (the
    default is ``hwm``): a trainer's, bounded instead by what its server sends
    unasked (credit, answers, a heartbeat a second), and the server's control
    socket, bounded by what its trainers send (a heartbeat a second, an
    acknowledgement per message handed out). Every socket gets TCP
    keepalive too, which the kernel answers whatever the queues hold: an idle
    connection whose peer is gone is closed after 10 s and 3 probes 5 s apart
    (25 s), or at the first probe past :data:`HALF_OPEN_TIMEOUT` (15 s) with
    ``half_open_bound``.

    ``half_open_bound`` closes a connection whose data has gone unacknowledged
    for :data:`HALF_OPEN_TIMEOUT` (``TCP_USER_TIMEOUT``; libzmq passes it on
    Linux and Windows, elsewhere the kernel's own limit stays): what a peer
    host that vanished leaves, a half-open connection that keepalive never
    probes because it is not idle. Linux applies the same bound to a receive
    window that stays closed (tcp(7)): a peer alive but reading nothing at the
    TCP level for that long is cut off too. So the bound belongs where the
    peer's libzmq keeps reading (a receive queue without limit, or a reader
    that never pauses for long): a trainer's data socket has no receive limit
    (credit bounds what comes), so a trainer in a long step keeps its
    connection. (It could be turned off for the data socket of the
    at-most-once plain delivery, gone since, whose trainers' full queues
    closed their windows by design.)

    What a user sees when a trainer's host vanishes: the statistics stop
    counting it after ``TRAINER_TIMEOUT`` (3 s without its heartbeats); the
    server deals what it held to the others within ``SILENCE_GRACE`` and a
    heartbeat (16 s), and its kernel closes every connection to it within
    about as long.

    ``max_message_bytes`` caps what a receiving socket accepts before any of
    it reaches Python. ``security`` (a ``ServerCurve`` or ``ClientCurve``)
    turns on CURVE before the socket binds or connects.
    """
    socket: zmq.Socket[Any] = context.socket(kind)
    socket.linger = 0
    socket.sndhwm = hwm
    socket.rcvhwm = hwm if rcvhwm is None else rcvhwm
    if max_message_bytes > 0:
        socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if heartbeats:
        interval_ms = int(HEARTBEAT_INTERVAL * 1000)
        socket.setsockopt(zmq.HEARTBEAT_IVL, interval_ms)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * interval_ms)
        socket.setsockopt(zmq.HEARTBEAT_TTL, 3 * interval_ms)
    socket.setsockopt(zmq.TCP_KEEPALIVE, 1)
    socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 10)
    socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
    socket.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)
    if half_open_bound:
        socket.setsockopt(zmq.TCP_MAXRT, int(HALF_OPEN_TIMEOUT * 1000))
    socket.setsockopt(zmq.RECONNECT_IVL, 100)
    socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    if security is not None:
        security.apply(socket)
    return socket


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_memory_kept = False


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed large buffers for reuse (once per process).

    ZeroMQ allocates every received message afresh. glibc serves allocations
    above its mmap threshold with new pages and hands them back on free, so a
    trainer receiving 16 MiB messages faults in ~1000 fresh pages per message
    (about 2 µs each): measured here, 1000-1700 page faults and 3.9-5.1 ms of
    trainer CPU per 16 MiB sample, at 2.5-3.1 GiB/s. Raising the mmap threshold
    to its 32 MiB maximum and the trim threshold to 1 GiB lets freed buffers be
    reused instead. The price: freed heap stays in the process. The trim
    threshold governs only the top of the heap, so what is kept is not bounded
    by it: whatever lies below a chunk still in use stays, up to the process's
    peak heap use (measured: 40 buffers of 16 MiB allocated, all but the last
    freed, RSS 670 MiB kept, against 46 MiB untuned). Returns whether the
    setting took (False where there is no glibc).
    """
    global _memory_kept
    if _memory_kept:
        return True
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    _memory_kept = ok
    return ok


def bind(socket: zmq.Socket[Any], address: str, what: str) -> str:
    """Bind ``socket`` to ``address`` (port range checked); return the endpoint as bound."""
    check_port(address)
    with mapped_zmq_errors(f"bind the {what} endpoint", address):
        socket.bind(address)
    return bound_address(socket)


def bound_address(socket: zmq.Socket[Any]) -> str:
    """The endpoint ``socket`` last bound, as the system chose it (a real port for port 0)."""
    return str(socket.getsockopt_string(zmq.LAST_ENDPOINT))


#: ``zmq.EVENTS`` and ``zmq.POLLIN`` as plain ints: asked once or more per data message,
#: where an enum member's lookup and its ``&`` cost more than the question itself.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


def readable(socket: zmq.Socket[Any]) -> bool:
    """Whether a message is waiting on ``socket`` (without a system call to poll)."""
    return bool(socket.getsockopt(_EVENTS) & _POLLIN)  # type: ignore[operator]  # an int


def send_message(
    socket: zmq.Socket[Any],
    message: Message,
    *,
    prefix: Sequence[bytes] = (),
    flags: int = 0,
) -> None:
    """Encode ``message`` and send it as one multipart message (after ``prefix`` frames)."""
    frames: list[Any] = [*prefix, *encode(message)]
    socket.send_multipart(frames, flags=flags, copy=False)
