"""The half-open bound of a plain server's data connections, kept by the process itself.

Every feedmux TCP connection but a plain server's data connections has the kernel close
it once it has held data unacknowledged for ``HALF_OPEN_TIMEOUT`` (``TCP_USER_TIMEOUT``,
see :func:`~feedmux._plumbing.sockets.make_socket`). Those go without it because Linux
applies the same bound to a receive window that stays closed, which a live plain trainer
that only stops reading keeps closed (plain mode's back-pressure): its window probes are
answered, and the kernel cuts it off all the same. Without any bound, the data
connection to a trainer whose host vanished (no FIN or RST ever comes) holds its queue
and its send buffer for about 15 minutes (``net.ipv4.tcp_retries2``): it is not idle,
so keepalive never probes it.

:class:`HalfOpenSweep` keeps the bound that tells the two apart. Once a heartbeat it
looks at the connections accepted on the data endpoint and asks the kernel
(``TCP_INFO``) how long each peer has left unanswered what it owes an answer to: a
retransmission of data, or window or keepalive probes (:func:`unanswered`). A trainer
that only stops reading answers every probe (its kernel does, whatever the process
does); a host that is gone answers nothing. A connection whose peer has answered
nothing for the bound is aborted: ``SO_LINGER`` zero, then ``shutdown``, on a duplicate
of libzmq's descriptor. libzmq reads the end of its input, drops the connection with its
queue and closes its descriptor, and the kernel, closing with a linger of zero, resets
the connection and frees its buffers at once. The sweep never closes libzmq's
descriptor itself; a ``TCP_USER_TIMEOUT`` of a second, set with the rest, makes the
kernel abort the connection at its next retransmission should libzmq not look.

Why not when the control plane forgets the trainer? That needs to know which data
connection is the trainer's, and libzmq does not say: a plain trainer sends nothing on
the data socket (so no message carries its descriptor, ``ZMQ_SRCFD``), a socket
monitor's ``EVENT_ACCEPTED`` carries the descriptor but no routing id, and a socket has
one monitor, which the CURVE handshake logger holds. The peer's silence is the better
witness anyway: by the bound the control plane has long since stopped counting the
trainer (``TRAINER_TIMEOUT``, 3 s) and the kernel has closed its control connection
(``HALF_OPEN_TIMEOUT`` too), while a trainer in a long step keeps every connection (its
kernel answers the probes, its libzmq the ZMTP heartbeats). An outage shorter than the
bound stays a pause, as on every other connection; a trainer cut off for longer connects
again once its link is back (the server's kernel resets the old connection at the first
segment it sends there), without what was queued for it: plain delivery's bound.

The connections are found without libzmq's help: the process's descriptors
(``/proc/self/fd``) that are TCP sockets accepted at the data endpoint's address, each
looked at once (by its inode) and then only asked ``TCP_INFO``. Linux only (the layout
of ``struct tcp_info`` and ``/proc`` are Linux's); elsewhere the sweep does nothing and
the kernel's own limit stays. It costs a ``fstat`` per descriptor of the process and
four system calls per data connection, once a second (about 3 ms for 1000 descriptors).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import sys
from collections.abc import Iterator

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT, HEARTBEAT_INTERVAL

__all__ = ["HalfOpenSweep", "unanswered"]

log = logging.getLogger("feedmux.server")

#: ``struct tcp_info`` (linux/tcp.h) as far as it is read: 8 one-byte fields (state,
#: congestion state, retransmits, probes, backoff, options, window scales, flags), then
#: 32-bit ones from ``tcpi_rto`` to ``tcpi_pmtu`` (``tcpi_last_ack_recv``, in ms, is the
#: 13th).
_TCP_INFO = struct.Struct("=8B14I")
_STATE, _RETRANSMITS, _PROBES, _LAST_ACK_RECV = 0, 2, 3, 20
_ESTABLISHED = 1
#: Every local address of a wildcard bind.
_WILDCARDS = {"0.0.0.0", "::", "*"}


def unanswered(connection: socket.socket) -> float:
    """Seconds the peer of an established TCP ``connection`` has answered nothing it owes
    an answer to (0.0 when it owes none).

    The kernel's time since the peer's last acknowledgement (``tcpi_last_ack_recv``),
    counted while a retransmission of data is unanswered (``tcpi_retransmits``) or two
    probes in a row, window or keepalive, are (``tcpi_probes``); any acknowledgement
    resets both. The time since the last acknowledgement alone does not tell: a live peer
    whose window is closed may hold the kernel's window probe (one segment,
    unacknowledged: ``tcpi_unacked`` 1) and answers each probe, which the kernel backs
    off to 2 minutes apart while the window stays closed, so that time grows past any
    bound between two answered probes (53 s after 150 s of a closed window on loopback,
    with retransmits and probes 0 throughout). One probe out is only its round trip. An
    idle connection owes nothing, however long it has been quiet.
    """
    info = _TCP_INFO.unpack(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO,
                                                  _TCP_INFO.size))
    if info[_STATE] != _ESTABLISHED or not (info[_RETRANSMITS] or info[_PROBES] >= 2):
        return 0.0
    return float(info[_LAST_ACK_RECV]) / 1000


def _abort(connection: socket.socket) -> None:
    """Make the kernel reset ``connection`` when its last descriptor closes, and make
    libzmq close its own (see the module docstring)."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 1000)
    connection.shutdown(socket.SHUT_RDWR)


def _local_end(endpoint: str) -> tuple[str, int] | None:
    """``(host, port)`` of a bound ``tcp://`` endpoint (None: another transport)."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    return host.strip("[]"), int(port)


class HalfOpenSweep:
    """The connections accepted at ``endpoint`` (as bound, ``tcp://HOST:PORT``) by this
    process, each aborted once its peer has answered nothing for ``bound`` seconds;
    looked at every ``interval`` seconds (:meth:`sweep`). Does nothing for other
    transports or off Linux."""

    def __init__(self, endpoint: str, bound: float = HALF_OPEN_TIMEOUT,
                 interval: float = HEARTBEAT_INTERVAL) -> None:
        self.local = _local_end(endpoint) if sys.platform == "linux" else None
        self.bound = bound
        self.interval = interval
        #: Connections aborted so far.
        self.aborted = 0
        self._next = 0.0
        #: Whether each socket seen, by (device, inode), is a connection accepted at the
        #: endpoint.
        self._accepted: dict[tuple[int, int], bool] = {}

    def sweep(self, now: float) -> int:
        """Abort the connections found half-open, if a look is due at ``now``; how many."""
        if self.local is None or now < self._next:
            return 0
        self._next = now + self.interval
        aborted = 0
        for connection in self._connections():
            with connection:
                try:
                    silent = unanswered(connection)
                    if silent < self.bound:
                        continue
                    host, port = connection.getpeername()[:2]
                    _abort(connection)
                except OSError:
                    continue  # closed meanwhile (the peer reset it, libzmq dropped it)
            aborted += 1
            log.warning("closed the data connection from %s:%d: its peer answered nothing "
                        "for %.0f s (its host is gone, or cut off)", host, port, silent)
        self.aborted += aborted
        return aborted

    def _connections(self) -> Iterator[socket.socket]:
        """A duplicate of each connection accepted at the endpoint (the caller closes it)."""
        try:
            names = [int(name) for name in os.listdir("/proc/self/fd")]
        except (OSError, ValueError):
            return
        seen: dict[tuple[int, int], bool] = {}
        for descriptor in names:
            try:
                status = os.fstat(descriptor)
            except OSError:
                continue  # closed since the listing
            key = (status.st_dev, status.st_ino)
            if not stat.S_ISSOCK(status.st_mode) or key in seen or self._accepted.get(
                    key) is False:
                seen.setdefault(key, False)
                continue
            connection = self._duplicate(descriptor, key)
            seen[key] = connection is not None
            if connection is not None:
                yield connection
        self._accepted = seen  # the sockets closed since the last look are forgotten

    def _duplicate(self, descriptor: int, key: tuple[int, int]) -> socket.socket | None:
        """A duplicate of ``descriptor`` if it still is the socket ``key`` and a connection
        accepted at the endpoint, else None."""
        try:
            duplicate = os.dup(descriptor)
        except OSError:
            return None
        try:
            status = os.fstat(duplicate)
            if (status.st_dev, status.st_ino) != key:
                raise OSError("another socket took the descriptor")
            connection = socket.socket(fileno=duplicate)
        except OSError:
            os.close(duplicate)
            return None
        if self._accepted.get(key) or self._accepted_here(connection):
            return connection
        connection.close()
        return None

    def _accepted_here(self, connection: socket.socket) -> bool:
        """Whether ``connection`` is TCP, connected, and local to the endpoint's address."""
        assert self.local is not None
        if (connection.family not in (socket.AF_INET, socket.AF_INET6)
                or connection.type != socket.SOCK_STREAM):
            return False
        try:
            connection.getpeername()  # a listening socket has none
            host, port = connection.getsockname()[:2]
        except OSError:
            return False
        want_host, want_port = self.local
        return port == want_port and (want_host in _WILDCARDS
                                      or host in (want_host, f"::ffff:{want_host}"))
