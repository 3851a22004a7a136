"""A loader's data sockets: which server's data message comes next, and its decoding.

This module owns the reading side of a :class:`~feedmux.client.remote.RemoteLoader`:
one data DEALER per server, taken in turn; the credit it grants them, the envelope
of each message, the acknowledgement of the messages whose samples were all handed
out (several at once: see :class:`DataSockets`), and an end of stream that comes on
the data socket; the shared-memory pools of servers on this host (a reference frame
becomes a view of the pool: :mod:`feedmux._plumbing.shm`). It reports the link
number and sequence number of the message it returned (the acknowledging thread
needs them). It must never decide anything about the servers (that is the pure link
state's) and never look at single samples.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from feedmux._plumbing.shmtable import pid_namespace
from feedmux._plumbing.shmviews import ShmViews
from feedmux._plumbing.sockets import keep_freed_memory, readable, send_message
from feedmux.client._link import ServerLinks
from feedmux.errors import ProtocolError, VersionMismatchError
from feedmux.protocol import (
    Ack,
    Credit,
    Data,
    EndOfStream,
    Heartbeat,
    Message,
    ShmAttach,
    decode,
    unpack_envelope,
)

__all__ = ["LARGE_MESSAGE_BYTES", "DataSockets", "send_or_drop", "take_all"]

log = logging.getLogger("feedmux.client")

#: A frame larger than this makes the loader tune malloc (see ``tune_malloc``).
LARGE_MESSAGE_BYTES = 1 << 20


def send_or_drop(socket: Any, message: Message) -> None:
    """Send without blocking; a message that finds the queue full is dropped."""
    try:
        send_message(socket, message, flags=zmq.NOBLOCK)
    except zmq.Again:
        pass


def take_all(waiting: deque[Any]) -> list[Any]:
    """Empty ``waiting`` from the left; safe while another thread also takes from it."""
    taken = []
    while True:
        try:
            taken.append(waiting.popleft())
        except IndexError:
            return taken


class DataSockets:
    """The data DEALERs of one loader, one per server, read in turn.

    A message handed out whole waits in :attr:`finished` for the acknowledging
    thread (:class:`~feedmux.client._acks.HandOutAcks`), which takes it within
    a few ms (its mark in a later message acknowledges it as well), so a
    trainer that waits for data, or dies, holds back nothing for longer than it
    already did with its hand-out marks. The training thread sends nothing in
    the steady state: each send wakes both ends' I/O threads and gives the
    interpreter lock away, which cost small samples a quarter of their rate
    with an acknowledgement every four messages. Only when ``ack_batch``
    messages wait (the thread held back a whole credit's worth: a starved
    thread on a busy machine) does it send them itself, so credit never runs
    dry for want of the thread.
    """

    def __init__(self, sockets: Sequence[Any], *, client_id: str,
                 addresses: Sequence[str], tune_malloc: bool, ack_batch: int = 1,
                 shm: bool = False, credits: int = 0) -> None:
        self.sockets = list(sockets)
        self.client_id = client_id
        self.addresses = addresses
        self.tune_malloc = tune_malloc
        self.ack_batch = max(1, ack_batch)
        self.turn = 0
        #: (link number, server id, sequence number) of the message being handed out, when
        #: it wants an acknowledgement (a rank's messages do not: their marks release them).
        self.pending_ack: tuple[int, str, int] | None = None
        #: Per link: (server id, sequence number) of the messages handed out whole and not
        #: acknowledged yet. Two threads take from them (popleft is atomic):
        #: each sequence number is acknowledged by whoever takes it.
        self.finished: list[deque[tuple[str, int]]] = [deque() for _ in self.sockets]
        #: The link number and sequence number (0: no acknowledgement wanted) of the last
        #: message.
        self.link = self.seq = 0
        #: The pools of servers on this host, once mapped (None: shm=False).
        self.views = ShmViews() if shm else None
        #: The links this loader granted credit to: only those hear its goodbye (a loader
        #: refused for a client id in use never granted any; its goodbye, under the same
        #: data identity, would take the credit of the trainer that holds the id).
        self.granted: set[int] = set()
        if credits:  # the servers send as much as this grants
            self.grant_credit(credits)

    def views_held(self) -> tuple[int, int, int]:
        """The shared-memory views this trainer holds: (views, bytes, pool bytes)."""
        return (0, 0, 0) if self.views is None else self.views.held()

    def attach(self, link: int, control: Any, path: str) -> None:
        """Server ``link`` offers its pool at ``path``: map it and prove it by its token.

        A server on another host (or in a container without this ``/dev/shm``)
        names a file this trainer cannot open: it keeps sending over the sockets.
        """
        if self.views is None:
            return
        try:
            token = self.views.attach(path)
        except OSError as error:
            log.info("not using the shared memory of %s at %s: %s", self.addresses[link], path,
                     error)
            return
        send_or_drop(control, ShmAttach(token=token, client_id=self.client_id,
                                        pid_namespace=pid_namespace()))

    def grant_credit(self, credits: int, link: int | None = None) -> None:
        """Grant ``credits`` messages of credit to the server of ``link`` (None: every one).

        If the queue towards an absent server is full, the next welcome grants again.
        """
        for index in range(len(self.sockets)) if link is None else (link,):
            send_or_drop(self.sockets[index], Credit(credits=credits, client_id=self.client_id))
            if credits > 0:
                self.granted.add(index)

    def goodbye(self, mark: tuple[int, int, int, int] | None, used_up: bool,
                linger_ms: int = 200) -> None:
        """The loader closes: on each data socket, what it handed out (every message
        waiting, the current one if ``used_up``, else ``mark``: (link, sequence number,
        epoch, position) in it), then a grant of no credit, so that the server deals
        what this trainer held to the others at once; then the data sockets close,
        ``linger_ms`` at most to carry that out. In that order on one socket: the
        server never takes the goodbye before the acknowledgements."""
        if used_up:
            self.finish_pending()
        self.pending_ack = None  # (not handed out whole: the mark says how far)
        for link, socket in enumerate(self.sockets):
            if link not in self.granted:
                socket.close(linger=0)  # it was never dealt anything: nothing to say
                continue
            self._acknowledge(link)
            if mark is not None and mark[0] == link and mark[1]:
                send_or_drop(socket, Ack(seqs=(mark[1],), client_id=self.client_id,
                                         epoch=mark[2], position=mark[3]))
            send_or_drop(socket, Credit(credits=0, client_id=self.client_id))
            socket.close(linger=linger_ms)

    def forget_ack(self, link: int) -> None:
        """Link ``link`` talks to a new server: the sequence numbers waiting mean nothing."""
        if self.pending_ack is not None and self.pending_ack[0] == link:
            self.pending_ack = None
        self.finished[link].clear()

    def finish_pending(self) -> None:
        """The message being handed out is done (the loader asks for the next)."""
        if self.pending_ack is not None:
            self._finished()

    def _finished(self) -> None:
        """Every sample of the pending message was handed out: it waits for the
        acknowledging thread (or, a whole credit waiting, is acknowledged here)."""
        assert self.pending_ack is not None
        link, server_id, seq = self.pending_ack
        self.pending_ack = None
        finished = self.finished[link]
        finished.append((server_id, seq))
        if len(finished) >= self.ack_batch:
            self._acknowledge(link)

    def _acknowledge(self, link: int) -> None:
        """Acknowledge the messages of ``link`` handed out whole that wait, each server
        process's under its id: sequence numbers start again in a restarted process, so
        an old process's number must not acknowledge the new one's message of that
        number (the new process would think it handed out and never deal it again). A
        dropped ack only means the server deals those messages again."""
        by_server: dict[str, list[int]] = {}
        for server_id, seq in take_all(self.finished[link]):
            by_server.setdefault(server_id, []).append(seq)
        for server_id, seqs in by_server.items():
            send_or_drop(self.sockets[link], Ack(seqs=seqs, client_id=self.client_id,
                                                 server_id=server_id))

    def receive(self, links: ServerLinks) -> Data | None:
        """The next data message waiting on the data socket(s), or None."""
        if self.pending_ack is not None:
            self._finished()
        count = len(self.sockets)
        for offset in range(count):
            index = (self.turn + offset) % count
            socket = self.sockets[index]
            while readable(socket):
                seq, message = self._decode(socket.recv_multipart(copy=False))
                if isinstance(message, Data):
                    self.turn = (index + 1) % count
                    self.link, self.seq = index, seq
                    if seq:
                        self.pending_ack = (index, message.server_id, seq)
                    return message
                if isinstance(message, EndOfStream):
                    links.data_end_of_stream(index, message.server_id)
                elif (isinstance(message, Heartbeat) and message.handed_below
                      and message.sender_id not in links.links[index].stale):
                    # (an old process's summary, still queued, is of a run that is over)
                    links.summarized(index, message.handed_below)
        return None

    def _decode(self, frames: list[Any]) -> tuple[int, Message]:
        """The sequence number (0: no acknowledgement wanted) and the message of a data
        message, after its envelope."""
        try:
            seq, frames = unpack_envelope(frames)
            if self.tune_malloc and len(frames) > 2 and len(frames[-1]) > LARGE_MESSAGE_BYTES:
                self.tune_malloc = False
                keep_freed_memory()
            message = decode(frames, resolve=self.views)
        except VersionMismatchError:
            raise
        except ProtocolError as error:
            raise ProtocolError(f"malformed data message from {self.addresses}: {error}") from error
        return seq, message
