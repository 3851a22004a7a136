"""The shared-memory pool's slot table: its rows, a run's claims, the reference frame.

This module owns the layout of one row of the slot table of a pool's segment
(:mod:`feedmux._plumbing.shm` maps the segment and allocates; the trainer's side
is :mod:`feedmux._plumbing.shmviews`), the reference frame that names a run, and
the accounting of who holds a run now. It never maps a segment, never imports
zmq and never decides where a message goes.

A row is :data:`ROW_WIDTH` int64 per granule (only a run's head granule's row
is used): ``state``, ``generation`` (bumped at each allocation, so a late
release of an old use frees nothing), ``owner`` (the pid of the trainer that
claimed it; 0 while in flight) and ``stamp`` (when it was sent, in ms of the
monotonic clock), then :data:`CLAIMS` *claim cells* of (state, owner, stamp).

One claim is the common case (a message to one trainer): the first four
fields are its cell, claim 0. A message that several trainers in different
processes receive — the same buffered message to one member of each consumer
group — is *shared*: the server sets the row's state to SHARED while it may
still send the message (it is in the groups' buffer), and each trainer it is
sent to gets a cell of its own (claim 1, 2, …, written in the reference frame's
granule field above bit 32). Every cell has a single writer at a time — the
server until it sends the message, then the trainer, whose claim writes its pid
and whose release writes FREE — so the accounting needs no lock and no atomic
counter, and it stays exact across processes. A run is free once its row and
every cell say FREE (:func:`idle`); a trainer that dies gives back its cells
only (:func:`reclaim_dead`: its pid is gone, or its cell stayed unclaimed for the
orphan timeout), so the other trainers' views stay valid. A message handed to
more than :data:`CLAIMS` trainers goes to the rest whole, over the socket.
"""

from __future__ import annotations

import collections
import os
import struct
import time
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: shm imports this module
    from feedmux._plumbing.shm import Placement, Segment

__all__ = [
    "CLAIMS",
    "MAGIC",
    "REF",
    "REF_SIZE",
    "ROW_WIDTH",
    "STATE_COLUMNS",
    "SharedRuns",
    "Transit",
    "cell_columns",
    "held",
    "idle",
    "is_ref",
    "reclaim_dead",
    "release_run",
    "split_count",
    "unclaimed",
]

MAGIC = b"feedmxSM"
# magic, segment id, head granule, granules (| claim << 32), nbytes, generation, creator pid
REF = struct.Struct("<8sQQQQQQ")
#: Bytes of a reference frame: what replaces an array frame that travels through the pool.
REF_SIZE = REF.size
#: Where the granule field of a reference frame starts, and the bit its claim cell starts at.
_COUNT_OFFSET, CLAIM_SHIFT = 24, 32

#: A run's states: free, sent to a trainer, lent out by ``shared_empty`` (or an owned copy),
#: forwarded by a sampling worker to the server, shared by several trainers (its claims').
FREE, SENT, HELD, FORWARDED, SHARED = 0, 1, 2, 3, 4
ROW_STATE, ROW_GEN, ROW_OWNER, ROW_STAMP = 0, 1, 2, 3
#: Claim cells of a row (after claim 0, the row's own fields), and the int64 of one.
CLAIMS, _CELL, _FIRST_CELL = 8, 3, 4
#: int64 per row: the four fields, then the claim cells.
ROW_WIDTH = _FIRST_CELL + CLAIMS * _CELL
#: The state column of every claim, claim 0 (the row's own) first.
STATE_COLUMNS = [ROW_STATE] + [_FIRST_CELL + _CELL * cell for cell in range(CLAIMS)]


def cell_columns(claim: int) -> tuple[int, int, int]:
    """(state, owner, stamp) columns of claim ``claim`` (0: the row's own fields)."""
    if claim == 0:
        return ROW_STATE, ROW_OWNER, ROW_STAMP
    base = _FIRST_CELL + _CELL * (claim - 1)
    return base, base + 1, base + 2


def split_count(count: int) -> tuple[int, int]:
    """(granules, claim) from a reference frame's granule field."""
    return count & ((1 << CLAIM_SHIFT) - 1), count >> CLAIM_SHIFT


def is_ref(frame: Any) -> bool:
    """Whether ``frame`` (a bytes-like of any length) is a reference frame."""
    return len(frame) == REF_SIZE and memoryview(frame)[:8] == MAGIC


def pid_namespace() -> int:
    """This process's PID namespace: the inode of ``/proc/self/ns/pid`` (0 if unreadable).

    Two processes with the same figure see the same pids; the pool names its
    trainers and its servers by pid, so only then may one judge the other's pid.
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_run(slots: memoryview, row: int, generation: int, state: int,
                column: int = ROW_STATE) -> None:
    """Free claim ``column`` (a state column) of table row ``row`` if it is still in
    ``state`` at ``generation`` (the finalizer of its memory, in the server or a trainer)."""
    if slots[row + ROW_GEN] == generation and slots[row + column] == state:
        slots[row + column] = FREE


def idle(table: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Per run of ``heads``: whether its row and every claim cell say FREE."""
    states: np.ndarray = (table[heads][:, STATE_COLUMNS] == FREE).all(axis=1)
    return states


def held(table: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Per run of ``heads``: whether something alive holds it — its row is not FREE, or a
    claim cell is on its way (unclaimed) or claimed by a trainer whose pid still exists.

    It reads and never writes (the statistics call it from another thread): what a
    dead trainer holds counts as free here before :func:`reclaim_dead` takes it back.
    """
    rows = table[heads]
    busy: np.ndarray = rows[:, ROW_STATE] != FREE
    alive: dict[int, bool] = {}
    for claim, column in enumerate(STATE_COLUMNS):
        owner = cell_columns(claim)[1]
        for index in np.flatnonzero(rows[:, column] == SENT).tolist():
            pid = int(rows[index, owner])
            if pid and pid not in alive:
                alive[pid] = pid_alive(pid)
            busy[index] |= not pid or alive[pid]
    return busy


def unclaimed(table: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Per run of ``heads``: whether a claim cell of it is on its way (sent, no trainer's
    pid yet: the message is still in the socket queues). It reads and never writes."""
    rows = table[heads]
    waiting: np.ndarray = np.zeros(len(heads), bool)
    for claim, column in enumerate(STATE_COLUMNS):
        owner = cell_columns(claim)[1]
        waiting |= (rows[:, column] == SENT) & (rows[:, owner] == 0)
    return waiting


def reclaim_dead(table: np.ndarray, heads: np.ndarray, orphan_ms: float) -> list[int]:
    """Free every claim of ``heads`` whose trainer is gone (its pid) or that stayed
    unclaimed for ``orphan_ms``; the runs that are idle now (:func:`idle`).

    Claim 0 (one trainer's run) also gets a new generation, so that a late claim of
    it fails; a shared run's other claims stay, and their views stay valid.
    """
    if not len(heads):
        return []
    rows = table[heads]
    now = int(time.monotonic() * 1000)
    alive: dict[int, bool] = {}
    for claim, column in enumerate(STATE_COLUMNS):
        state, owner, stamp = cell_columns(claim)
        for index in np.flatnonzero(rows[:, column] == SENT).tolist():
            pid = int(rows[index, owner])
            if pid and pid not in alive:
                alive[pid] = pid_alive(pid)
            if (pid and not alive[pid]) or (not pid and now - rows[index, stamp] > orphan_ms):
                head = int(heads[index])
                if claim == 0:
                    table[head, ROW_GEN] += 1
                table[head, state] = FREE
    freed: list[int] = heads[idle(table, heads)].tolist()
    return freed


class Transit:
    """The messages sent to each trainer as references that it has not received yet."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        #: Per trainer (data identity): (first run, generation, claim) of each message sent
        #: to it as references and not yet claimed, oldest first.
        self._transit: dict[bytes, collections.deque[tuple[int, int, int]]] = {}

    def delivered(self, trainer: bytes, placed: Placement, claim: int = 0) -> None:
        """``placed`` went to ``trainer`` as references (as claim ``claim``): the message
        is in transit until the trainer claims it (:meth:`count`)."""
        head = placed.first()
        if head >= 0:
            queue = self._transit.setdefault(trainer, collections.deque())
            queue.append((head, int(self.segment.table[head, ROW_GEN]), claim))

    def count(self, trainer: bytes) -> int:
        """Messages sent to ``trainer`` as references that it has not received yet.

        A trainer claims a run (writes its pid) when it decodes the message, so
        what is unclaimed is still in the socket queues: bounding it keeps the
        references in flight to what ``--hwm`` bounds for messages sent whole,
        while the views a trainer keeps are bounded by the pool alone.
        """
        queue = self._transit.get(trainer)
        if queue is None:
            return 0
        slots = self.segment.slots
        while queue:
            head, generation, claim = queue[0]
            row = head * ROW_WIDTH
            state, owner, _ = cell_columns(claim)
            if (slots[row + ROW_GEN] == generation and slots[row + state] == SENT
                    and slots[row + owner] == 0):
                break  # the oldest is still on its way: so are the later ones
            queue.popleft()
        if not queue:
            del self._transit[trainer]  # nothing on its way: a trainer that left leaves nothing
        return len(queue)


class SharedRuns:
    """The server's side of shared messages: a claim cell per trainer a message goes to.

    A shared placement (``ShmPool.place(frames, state=SHARED)``) keeps its runs
    SHARED while the server may still send it; :meth:`hand` gives the next
    trainer its own cell and frames that name it, :meth:`delivered` records that
    they went, and :meth:`unshare` (the server will send it no more) lets the
    runs go once every claim released them.
    """

    def __init__(self, segment: Segment, transit: Transit) -> None:
        self.segment = segment
        self.transit = transit

    def hand(self, placed: Placement) -> list[Any] | None:
        """The frames for the next claim of ``placed`` (its cell written SENT, unclaimed),
        or None: every cell is taken (the trainer gets the message whole)."""
        claim = placed.claims + 1
        if claim > CLAIMS:
            return None
        table = self.segment.table
        state, owner, stamp = cell_columns(claim)
        heads = placed.taken + placed.held + placed.forwarded
        table[heads, owner] = 0
        table[heads, stamp] = int(time.monotonic() * 1000)
        table[heads, state] = SENT  # last: a trainer's claim checks it
        frames = list(placed.frames)
        for index in range(2, len(frames)):
            if is_ref(frames[index]):
                ref = bytearray(frames[index])
                granules = int.from_bytes(ref[_COUNT_OFFSET:_COUNT_OFFSET + 8], "little")
                struct.pack_into("<Q", ref, _COUNT_OFFSET,
                                 split_count(granules)[0] | claim << CLAIM_SHIFT)
                frames[index] = bytes(ref)
        placed.handed = frames
        return frames

    def delivered(self, trainer: bytes, placed: Placement) -> None:
        """The frames of the last :meth:`hand` went to ``trainer``: its cell is its own."""
        placed.claims += 1
        placed.handed = None
        self.transit.delivered(trainer, placed, placed.claims)

    def unshare(self, placed: Placement) -> None:
        """The server sends ``placed`` to nobody more: its runs are free once every claim
        released them (a cell handed but never sent is free at once)."""
        table = self.segment.table
        heads = placed.taken + placed.held + placed.forwarded
        if placed.handed is not None:
            state, owner, _ = cell_columns(placed.claims + 1)
            unclaimed = [head for head in heads if table[head, owner] == 0]
            table[unclaimed, state] = FREE
            placed.handed = None
        table[heads, ROW_STATE] = FREE
        placed.taken, placed.held, placed.forwarded = [], [], []
