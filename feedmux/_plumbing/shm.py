"""The same-host shared-memory pool: one segment, its slot table, both ends' views of it.

This module owns the segment a server shares with the trainers on its host: its
layout (a header with a random token, a slot table, then the data area cut in
granules), the server's allocator (:class:`ShmPool`: places large array frames
in runs of granules, takes back released runs, back-pressures when full), the
reference frame that replaces an array frame on the wire, the rows of the slot
table that a trainer's side (:mod:`feedmux._plumbing.shmviews`) claims and
releases, and :func:`shared_empty`. It never imports zmq and never sends anything: releases
are a store into the slot table, made by a ``weakref.finalize`` when the last
view of a run dies, so the hot path has no release messages at all.

Slot table (a row per granule, :mod:`feedmux._plumbing.shmtable`; only a run's
first granule's row is used): ``state`` (FREE, SENT, HELD by ``shared_empty`` or
an owned copy, FORWARDED by a sampling worker to the server, SHARED by the
consumer groups' buffer), ``generation`` (bumped at each allocation, so a late
release of an old use frees nothing), ``owner`` (the pid of the trainer that
received it; 0 while in flight), the time it was sent, then a claim cell for
each trainer a shared message went to. The server takes a run back when its row
and every claim are FREE; a claim whose pid no longer exists (a trainer that
died), or that stayed unclaimed for ``orphan_timeout`` seconds (a message lost
with a dead trainer's queue), is FREE again first.

With ``--workers N`` the pool is created before the workers fork, and each process
allocates in a region of its own (:mod:`feedmux._plumbing.shmruns`): no lock, no
message, a region has one writer. A worker writes each large drawn array into its
region (its owned copy, or :func:`shared_empty`) and sends the server 56-byte
references (state FORWARDED) instead of the bytes; the server sends them on to a
trainer that maps the pool (SENT: the trainer's to release, into the worker's books,
which the worker reads when it allocates), or copies the bytes out for a trainer
that does not, and frees the run. A worker that dies leaves its books in shared
memory: the server adopts them (:meth:`ShmPool.adopt`) and frees every run of them
that nothing refers to: one the worker lent out, or forwarded (the state it writes
before it sends) without the server having taken the message (the server records the
runs of each message it takes, :meth:`ForwardedRuns.receive`); what the server took,
and what a trainer holds, come back as a live worker's would. A run whose memory an
object of the allocating process still holds (a ranked message kept for a successor)
is pinned and not reused, whatever a trainer's release says, until that object is
gone; so is a worker's run that the server reads in place (:class:`ForwardedRuns`:
it decoded the worker's message to deal it to ranks or to cut batches), whose array
the server sends on as a reference to the same run when it starts at the run's first
byte. The trainer's side of the segment is :mod:`feedmux._plumbing.shmviews`.

Cleanup: the segment is a file named ``feedmux-<server pid>-<token>`` in
``/dev/shm`` (a file, not an anonymous memfd, so that a trainer in another
container sharing ``/dev/shm`` can map it). The server unlinks it when it
closes. For the exits that run no code (SIGKILL, the OOM killer) a reaper
process is started with the pool: a shell that waits for end of file on a pipe
only the server's processes hold, then removes the file, so the segment goes
within moments of the server, however it ended. Should even the reaper have been
killed, the next server started on the host removes every such file whose pid is
gone (:func:`sweep`). Trainers keep their mapping after the unlink; the memory
is freed when the last of them lets go.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import mmap
import os
import secrets
import struct
import subprocess
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import numpy as np

from feedmux._plumbing.shmruns import RunBooks
from feedmux._plumbing.shmtable import (
    FORWARDED,
    FREE,
    HELD,
    MAGIC,
    REF,
    REF_SIZE,
    ROW_GEN,
    ROW_OWNER,
    ROW_STAMP,
    ROW_STATE,
    ROW_WIDTH,
    SENT,
    SHARED,
    SharedRuns,
    Transit,
    held,
    idle,
    is_ref,
    pid_alive,
    pid_namespace,
    reclaim_dead,
    release_run,
    unclaimed,
)

__all__ = [
    "DEFAULT_SHM_SIZE",
    "Placement",
    "REF_SIZE",
    "SHM_THRESHOLD",
    "ForwardedRuns",
    "ShmPool",
    "carried_bytes",
    "drawing_into",
    "has_refs",
    "is_ref",
    "owned_copy",
    "orphaned_segments",
    "shared_empty",
    "sweep",
]

log = logging.getLogger("feedmux.shm")

#: Where segments live; a tmpfs on Linux.
SHM_DIR = "/dev/shm"
#: Default pool size: a few dozen 16 MiB messages. tmpfs pages are only used once written.
DEFAULT_SHM_SIZE = 512 * 1024 * 1024
#: Arrays of at least this many bytes travel through the pool; smaller ones by socket.
SHM_THRESHOLD = 256 * 1024
#: The allocation unit of the data area.
GRANULE = 256 * 1024
#: An unclaimed run (its message lost with a dead trainer) is taken back after this.
ORPHAN_TIMEOUT = 60.0
#: Seconds a new pool waits for the shell that starts its reaper.
REAPER_EXIT = 2.0
#: Seconds a worker's owned copy waits for room in its full region (then: plain memory).
WORKER_PATIENCE = 1.0
#: Seconds between two looks for dead trainers' runs while the pool is full.
OWNER_CHECK = 0.25

_HEADER = struct.Struct("<8s16sQQQ")  # magic, token, granules, granule size, data offset
#: After the header: the creating server's PID namespace (0 in a segment of an older
#: feedmux): a server judges only the segments of servers whose pids it sees.
_NAMESPACE = struct.Struct("<Q")
SEGMENT_PREFIX = "feedmux-"


def has_refs(frames: Sequence[Any]) -> bool:
    """Whether a message's array frames include a reference (a sampling worker's)."""
    return any(is_ref(frame) for frame in frames[2:])


def carried_bytes(frames: Sequence[Any]) -> int:
    """The bytes a message carries, the arrays its references name counted whole."""
    return sum(REF.unpack(frame)[4] if is_ref(frame) else len(frame) for frame in frames)


def _layout(size: int, granule: int) -> tuple[int, int]:
    """(granules, data offset) of a segment of about ``size`` bytes."""
    granules = max(1, size // granule)
    table_end = 4096 + granules * ROW_WIDTH * 8
    return granules, -(-table_end // 4096) * 4096


def orphaned_segments(directory: str = SHM_DIR) -> list[str]:
    """The names of the segments in ``directory`` whose server is gone."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    gone = []
    for name in names:
        prefixed = name.startswith(SEGMENT_PREFIX)
        pid_text = name[len(SEGMENT_PREFIX):].split("-", 1)[0] if prefixed else ""
        if (pid_text.isdigit() and not pid_alive(int(pid_text))
                and _creator_namespace(os.path.join(directory, name)) in (0, pid_namespace())):
            gone.append(name)
    return gone


def _creator_namespace(path: str) -> int:
    """The PID namespace of the server that made the segment at ``path`` (0: unknown).

    A server in another PID namespace (a container that shares this ``/dev/shm``
    but not the host's pids) has a pid this process cannot see: its segment is
    alive for all this process knows, and is left alone.
    """
    try:
        with open(path, "rb") as segment:
            head = segment.read(_HEADER.size + _NAMESPACE.size)
    except OSError:
        return 0
    if len(head) < _HEADER.size + _NAMESPACE.size or head[:8] != MAGIC:
        return 0
    namespace: int = _NAMESPACE.unpack_from(head, _HEADER.size)[0]
    return namespace


def sweep(directory: str = SHM_DIR) -> list[str]:
    """Remove the segments of servers that are gone (killed); return their paths."""
    removed: list[str] = []
    for name in orphaned_segments(directory):
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


class Segment:
    """A mapped segment file: the header fields, the slot table and the data area."""

    def __init__(self, fd: int, size: int) -> None:
        self.map = mmap.mmap(fd, size)
        magic, token, granules, granule, offset = _HEADER.unpack_from(self.map, 0)
        if magic != MAGIC or offset + granules * granule > size:
            raise ValueError("not a feedmux shared-memory segment")
        self.token: bytes = token
        self.segment_id: int = int.from_bytes(token[:8], "little")
        self.granules, self.granule, self.offset = int(granules), int(granule), int(offset)
        whole = np.frombuffer(self.map, np.uint8)
        table_end = 4096 + self.granules * ROW_WIDTH * 8
        self.table: np.ndarray = whole[4096:table_end].view(np.int64).reshape(
            self.granules, ROW_WIDTH)
        self.data: np.ndarray = whole[self.offset : self.offset + self.granules * self.granule]
        self.base = int(self.data.ctypes.data)
        self._bytes = memoryview(self.map)
        #: The slot table again, as plain int64 items (a row per granule): a trainer reads
        #: and writes a row per message through it, cheaper than numpy's scalars.
        self.slots = self._bytes[4096:table_end].cast("q")

    def run_memory(self, head: int, nbytes: int) -> np.ndarray:
        """``nbytes`` of the run at ``head``, as the array whose life is the run's use.

        Made from a memoryview, not sliced from :attr:`data`: numpy points every
        view of a view at the array that has the memory, so a finalizer on a slice
        of ``data`` would run while views of it live on (and the run be reused
        under them). An array over a memoryview is where that chain stops: every
        view made from it keeps it alive, and its finalizer runs after the last.
        """
        start = self.offset + head * self.granule
        memory: np.ndarray = np.frombuffer(self._bytes[start : start + nbytes], np.uint8)
        return memory


class Placement:
    """A message's frames with its large arrays in the pool: what :meth:`ShmPool.place`
    returns (``frames``, what goes on the socket), with the runs it copied into
    (``taken``), the :func:`shared_empty` runs it sends in place (``held``) and the runs
    of a sampling worker it sends on (``forwarded``), for :meth:`ShmPool.cancel`."""

    def __init__(self, frames: Sequence[Any]) -> None:
        self.frames: list[Any] = list(frames)
        self.taken: list[int] = []
        self.held: list[int] = []
        #: Runs a sampling worker placed and forwarded (its references, sent on as they are).
        self.forwarded: list[int] = []
        #: The data identities of the trainers it is for (those that map the pool).
        self.trainers: frozenset[bytes] = frozenset()
        #: Whether its socket form still holds a worker's references (no trainer that
        #: does not map the pool may take it).
        self.refs_only = False
        #: Whether a trainer maps the pool now (it may have attached since the placement).
        self.maps: Callable[[bytes], bool] | None = None
        #: A shared placement (placed SHARED: one message to several trainers): the claim
        #: cells taken so far, and the frames of the last one handed out and not sent yet.
        self.shared = False
        self.claims = 0
        self.handed: list[Any] | None = None

    def address(self, trainers: Collection[bytes], *,
                maps: Callable[[bytes], bool] | None = None) -> None:
        """Say which trainers (those that map the pool) it is for; ``maps``: its socket
        form holds a worker's references only (only a trainer that maps the pool may take
        it), and whether a trainer maps it now (it may attach while the message waits)."""
        self.trainers = frozenset(trainers)
        if maps is not None:
            self.refs_only, self.maps = True, maps

    def also_for(self, target: bytes) -> None:
        """``target`` mapped the pool while the message waited: it is for it too."""
        self.trainers |= {target}

    def delivered(self) -> None:
        """Sent as references: its runs are the trainer's to release, not ours to cancel."""
        self.taken, self.held, self.forwarded = [], [], []

    def first(self) -> int:
        """The first run the message refers to (-1: none): the trainer claims it first."""
        runs = self.taken + self.held + self.forwarded
        return min(runs) if runs else -1


class ForwardedRuns:
    """The server's side of its sampling workers' references: checked, viewed, copied out.

    A worker's run arrives FORWARDED (:meth:`head` checks that a reference names
    one). The server reads it without a copy through :meth:`view`, the resolver
    its decoder is given: the array is the run's memory, and while any view of it
    lives the run is *kept* (a count per run in the shared books, written by the
    server alone and read by the worker that allocated it, which reuses no kept
    run whatever a trainer's release says). A frame of a message the server
    encodes again from such a view (a rank's share, a batch of one sample) that
    starts at the run's first byte is sent on as a reference to the same run
    (:meth:`viewed_head`): the worker's copy is the only one. Once its last view
    is gone, a run that was never sent on is free again.
    """

    def __init__(self, segment: Segment, books: RunBooks) -> None:
        self.segment = segment
        self.books = books
        #: Per head granule: the generation of the run when the server took a message that
        #: refers to it (:meth:`receive`; this process's record, never shared). A FORWARDED
        #: run whose generation is recorded here is the server's: a message it holds, or
        #: held and sends on, refers to it; the others of a dead worker go nowhere.
        self.received = np.zeros(segment.granules, np.int64)

    def head(self, ref: Any) -> int:
        """The run a worker's reference names (checked: this pool's, forwarded, current)."""
        _, segment_id, head, _, _, generation, _ = REF.unpack(ref)
        table = self.segment.table
        if (segment_id != self.segment.segment_id or not 0 <= head < self.segment.granules
                or table[head, ROW_GEN] != generation or table[head, ROW_STATE] != FORWARDED):
            raise ValueError(f"a sampling worker's reference to run {head} of segment "
                             f"{segment_id:x} is not a run it forwarded to this pool")
        return int(head)

    def receive(self, frames: Sequence[Any]) -> None:
        """Record that the server took ``frames`` (a worker's message, into its merge): the
        runs its references name are the server's until it sends them on or frees them."""
        for frame in frames[2:]:
            if is_ref(frame):
                head = self.head(frame)
                self.received[head] = self.segment.table[head, ROW_GEN]

    def holds(self, head: int) -> bool:
        """Whether the server holds forwarded run ``head``: it took a message that refers to
        it (:meth:`receive`, same generation) or reads it in place (kept)."""
        return (int(self.received[head]) == int(self.segment.table[head, ROW_GEN])
                or bool(self.books.kept[head]))

    def view(self, frame: Any, nbytes: int) -> Any:
        """The memory a worker's reference frame names, kept while a view of it lives (the
        server's decoder's resolver); any other frame as it is."""
        if not is_ref(frame):
            return frame
        head = self.head(frame)
        size = REF.unpack(frame)[4]
        if size != nbytes:
            raise ValueError(f"a sampling worker's reference to {size} bytes does not fit an "
                             f"array of {nbytes} bytes")
        memory = self.segment.run_memory(head, size)
        kept = self.books.kept
        kept[head] += 1
        weakref.finalize(memory, _unkeep, kept, self.segment.slots, head,
                         int(self.segment.table[head, ROW_GEN]))
        return memory

    def viewed_head(self, array: np.ndarray) -> int:
        """The forwarded run a view (:meth:`view`) of ``array`` starts at, not sent on yet
        (-1: none, or ``array`` is not from the start of a run)."""
        segment = self.segment
        offset = int(array.ctypes.data) - segment.base if array.size else -1
        head = offset // segment.granule
        if (0 <= offset < len(segment.data) and offset % segment.granule == 0
                and array.flags.c_contiguous and self.books.kept[head] > 0
                and array.nbytes <= int(self.books.lengths[head]) * segment.granule
                and int(segment.table[head, ROW_STATE]) == FORWARDED):
            return head
        return -1

    def copied_out(self, frames: Sequence[Any]) -> list[Any]:
        """``frames`` with every reference to this pool replaced by a copy of its bytes
        (the message goes whole: to a trainer on another host, or to every group)."""
        data, granule = self.segment.data, self.segment.granule
        out = list(frames)
        for index in range(2, len(out)):
            if is_ref(out[index]):
                _, _, head, _, nbytes, _, _ = REF.unpack(out[index])
                out[index] = data[head * granule : head * granule + nbytes].copy()
        return out


class ShmPool:
    """The server's side: creates the segment, places frames in it, takes runs back.

    Use :meth:`create`, which returns None (and says why) where shared memory is
    not available, so that the server falls back to sockets. A pool created
    before the sampling workers fork is theirs too: :meth:`split` before the fork
    gives each its region, :meth:`enter_worker` after it (see :mod:`.shmruns`).
    """

    def __init__(self, path: str, segment: Segment) -> None:
        self.path = path
        self.segment = segment
        self.creator = os.getpid()
        #: The process that allocates here (the server, or the worker after the fork).
        self.allocator = self.creator
        self.books = RunBooks(segment.granules)
        self.stalls = 0
        self.messages = 0
        #: Bytes the server copied into the pool (not written there by their sampler).
        self.copied = 0
        self.orphan_timeout = ORPHAN_TIMEOUT
        #: Seconds an owned copy waits for room in a full region before it is made in
        #: plain memory (a worker: it only samples, so waiting is its back-pressure).
        self.patience = 0.0
        self.stopping: Callable[[], bool] = bool
        self._owners_checked = 0.0
        self.transit = Transit(segment)
        #: The claim cells of the messages sent to several trainers (consumer groups).
        self.shared = SharedRuns(segment, self.transit)
        #: The workers' references: what the server reads of them, sends on or copies out.
        self.forwarded = ForwardedRuns(segment, self.books)
        #: The process that removes the segment once this server is gone (see the module).
        self.reaper: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(cls, size: int = DEFAULT_SHM_SIZE, directory: str = SHM_DIR,
               granule: int = GRANULE) -> ShmPool | None:
        removed = sweep(directory)
        if removed:
            log.info("removed %d shared-memory segment(s) of killed servers", len(removed))
        granules, offset = _layout(size, granule)
        total = offset + granules * granule
        try:
            free = os.statvfs(directory)
            if free.f_bavail * free.f_frsize < total:
                log.warning("shared memory off: %s has %d bytes free, the pool needs %d "
                            "(--shm-size)", directory, free.f_bavail * free.f_frsize, total)
                return None
            token = secrets.token_bytes(16)
            path = os.path.join(directory, f"{SEGMENT_PREFIX}{os.getpid()}-{token[:6].hex()}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            log.warning("shared memory off: %s", error)
            return None
        try:
            os.ftruncate(fd, total)
            header = _HEADER.pack(MAGIC, token, granules, granule, offset)
            os.pwrite(fd, header + _NAMESPACE.pack(pid_namespace()), 0)
            segment = Segment(fd, total)
        except (OSError, ValueError) as error:
            os.unlink(path)
            log.warning("shared memory off: %s", error)
            return None
        finally:
            os.close(fd)
        pool = cls(path, segment)
        pool.reaper = _start_reaper(path)
        return pool

    @property
    def token(self) -> str:
        return self.segment.token.hex()

    @property
    def wanted(self) -> bool:
        """Whether the server sends through the pool now (every free trainer maps it):
        :func:`owned_copy` writes large drawn arrays here only then (in every process)."""
        return self.books.wanted

    def want(self, wanted: bool) -> None:
        """Say whether the server sends through the pool now (:attr:`wanted`)."""
        self.books.wanted = wanted

    def stalled(self) -> None:
        """Count a message that found the pool full (``shm_stalls``)."""
        self.stalls += 1

    # -- the sampling workers -----------------------------------------------------------------
    def split(self, workers: int) -> None:
        """Give the server and each of ``workers`` workers a region (before they fork)."""
        self.books.split(workers)

    def enter_worker(self, index: int, stopping: Callable[[], bool]) -> None:
        """This process is worker ``index`` (from 0), forked with the pool: it allocates
        in its own region and waits a little for room there when it is full (not once
        ``stopping()``)."""
        self.books.enter(index + 1)
        self.allocator = os.getpid()
        self.patience, self.stopping = WORKER_PATIENCE, stopping
        self.transit = Transit(self.segment)
        self.shared = SharedRuns(self.segment, self.transit)

    def forward(self, frames: Sequence[Any]) -> Placement | None:
        """A worker's message for the server with its large arrays as references to this
        pool (the runs its owned copies are in, or a copy when they are not), or None:
        no trainer maps the pool, or the region has no room. Once sent, the runs are the
        server's (:meth:`Placement.delivered`); a message not sent is given back
        (:meth:`cancel`)."""
        return self.place(frames, state=FORWARDED) if self.wanted else None

    def adopt(self, worker: int, keep_received: bool = True) -> int:
        """Take back the runs of worker ``worker`` (from 0; it died): they are this
        process's from now on, and every one that nothing refers to is free again.
        Returns the runs freed.

        The rule: a run the worker lent out (HELD: a ``shared_empty`` array or an owned
        copy not sent yet) or forwarded (FORWARDED, its state written before the send)
        that the server did not take a message of (:meth:`ForwardedRuns.holds`) is free
        at once, with a new generation: its message was never sent, or died in the
        worker's queue, or is still on its way and will be dropped (the caller takes
        nothing more of this worker's socket and gives its shards new tickets). A
        FORWARDED run the server took is the server's (in its merge, or read in place):
        it comes back when the server sends it on or frees it, as a live worker's. A run
        sent to a trainer (SENT, SHARED) is the trainer's until released (or its pid is
        gone). With ``keep_received`` False (the run fails: nothing the server holds will
        be sent), every FORWARDED run is freed."""
        table, forwarded = self.segment.table, self.forwarded
        for head in self.books.adopt(worker + 1):
            state = int(table[head, ROW_STATE])
            if state == HELD or (state == FORWARDED
                                 and not (keep_received and forwarded.holds(head))):
                table[head, ROW_GEN] += 1
                table[head, ROW_STATE] = FREE
        return self.reclaim()

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, nbytes: int, state: int = SENT) -> int:
        """The head of a run of at least ``nbytes`` (state set), or -1 when full.

        First fit in this process's region (:meth:`RunBooks.find`): the pool's memory
        is a tmpfs file, whose pages cost RAM once written; reusing the lowest free
        runs keeps what a server touches to what is in flight at its peak.
        """
        segment, books = self.segment, self.books
        count = max(1, -(-nbytes // segment.granule))
        # Released runs first (a look at the table rows of the runs out), and a few times a
        # second dead trainers' (their holds come back even while the pool has room):
        # first fit then finds the lowest, so the pages in use stay those of what is in
        # flight.
        self.reclaim(self.owners_due())
        head = books.find(count)
        if head < 0:
            return -1
        books.take(head, count)
        row = segment.table[head]
        row[ROW_GEN] += 1
        row[ROW_OWNER] = 0
        row[ROW_STAMP] = int(time.monotonic() * 1000)
        row[ROW_STAMP + 1 :] = 0  # every claim cell free
        row[ROW_STATE] = state
        return head

    def owners_due(self) -> bool:
        """Whether it is time to look for dead trainers again (a system call per owner:
        at most every ``OWNER_CHECK`` seconds, not at every look at a full pool)."""
        now = time.monotonic()
        if now - self._owners_checked < OWNER_CHECK:
            return False
        self._owners_checked = now
        return True

    def reclaim(self, dead_owners: bool = True) -> int:
        """Take back released runs (and those of dead trainers, and orphans); return how many.

        A pinned run (its memory still held here) is not taken back yet, whatever its
        row says: it is once the object that holds it is gone.
        """
        books = self.books
        runs = books.runs
        if not runs:
            return 0
        table = self.segment.table
        heads = np.fromiter(runs, np.int64, len(runs))
        free = idle(table, heads)
        freed = 0
        for head in heads[free].tolist():
            if not books.is_pinned(head):
                books.free(head)
                freed += 1
        if dead_owners:
            for head in reclaim_dead(table, heads[~free], self.orphan_timeout * 1000):
                if not books.is_pinned(head):
                    books.free(head)
                    freed += 1
        return freed

    def place(self, frames: Sequence[Any], threshold: int = SHM_THRESHOLD,
              state: int = SENT) -> Placement | None:
        """``frames`` with every large array frame moved into the pool and replaced by a ref.

        Returns None when the pool has no room for them now (nothing is placed
        then); the caller waits for releases and asks again. A frame that is
        already in the pool (:func:`shared_empty`, an owned copy, a worker's
        reference, or the server's view of one: :meth:`ForwardedRuns.viewed_head`) is
        referred to without a copy. A placement that is not sent after all is given
        back with :meth:`cancel`. ``state`` FORWARDED: a worker places its message for
        the server, which sends it on.
        """
        segment, table = self.segment, self.segment.table
        placed = Placement(frames)
        out = placed.frames
        for index in range(2, len(out)):
            frame = out[index]
            if is_ref(frame):
                head = self.forwarded.head(frame)
                table[head, ROW_STAMP] = int(time.monotonic() * 1000)
                table[head, ROW_STATE] = state
                placed.forwarded.append(head)
                continue
            nbytes = len(frame)
            if nbytes < threshold:
                continue
            source = np.frombuffer(frame, np.uint8)
            head = self._lent_head(source)
            if head >= 0:
                table[head, ROW_STAMP] = int(time.monotonic() * 1000)
                table[head, ROW_STATE] = state
                placed.held.append(head)
            elif (head := self.forwarded.viewed_head(source)) >= 0:
                table[head, ROW_STAMP] = int(time.monotonic() * 1000)
                table[head, ROW_STATE] = state
                placed.forwarded.append(head)
            else:
                head = self.allocate(nbytes, state)
                if head < 0:
                    self._undo(placed, FORWARDED)
                    return None
                placed.taken.append(head)
                self.copied += nbytes
                start = head * segment.granule
                segment.data[start : start + nbytes] = source
            out[index] = REF.pack(MAGIC, segment.segment_id, head,
                                  int(self.books.lengths[head]), nbytes,
                                  int(table[head, ROW_GEN]), self.creator)
        self.messages += state in (SENT, SHARED)
        placed.shared = state == SHARED
        return placed

    def delivered(self, trainer: bytes, placed: Placement) -> None:
        """``placed`` went to ``trainer`` as references (see :meth:`Transit.delivered`): its
        runs are the trainer's now (a shared placement's: its claim cell)."""
        if placed.shared:
            self.shared.delivered(trainer, placed)
        else:
            self.transit.delivered(trainer, placed)
            placed.delivered()

    def in_transit(self, trainer: bytes) -> int:
        """References sent to ``trainer`` not received yet: see :meth:`Transit.count`."""
        return self.transit.count(trainer)

    def cancel(self, placed: Placement) -> None:
        """Give back what :meth:`place` took for a message that was not sent as references:
        the runs it copied into, and those a worker forwarded (the message went whole, or
        nowhere), are free again; the :func:`shared_empty` arrays held again."""
        self._undo(placed, FREE)

    def _undo(self, placed: Placement, forwarded: int) -> None:
        table = self.segment.table
        for head in placed.taken:
            table[head, ROW_STATE] = FREE
            self.books.free(head)
        table[placed.held, ROW_STATE] = HELD
        table[placed.forwarded, ROW_STATE] = forwarded
        placed.delivered()

    def drop(self, frames: Sequence[Any]) -> None:
        """Free the runs a worker's message refers to (the server sends it no further)."""
        placed = Placement(frames)
        placed.forwarded = [self.forwarded.head(frame) for frame in frames[2:] if is_ref(frame)]
        self.cancel(placed)

    def empty(self, shape: Any, dtype: Any) -> np.ndarray | None:
        """An array in the pool (HELD until sent, pinned while it lives), or None when the
        pool has no room (after waiting up to :attr:`patience` seconds for some)."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if dtype.hasobject or nbytes < SHM_THRESHOLD:
            return None
        head = self.allocate(nbytes, HELD)
        deadline, pause = time.monotonic() + self.patience, 0.0002
        while head < 0 and time.monotonic() < deadline and not self.stopping():
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
            head = self.allocate(nbytes, HELD)
        if head < 0:
            return None
        segment = self.segment
        memory = segment.run_memory(head, nbytes)
        self.books.pinned.add(head)
        # Not sent (or sent over a socket): the run comes back when no view of it is left.
        weakref.finalize(memory, _let_go, self.books.pinned, segment.slots, head,
                         int(segment.table[head, ROW_GEN]))
        array: np.ndarray = memory.view(dtype).reshape(shape)
        return array

    def lent(self, array: np.ndarray) -> bool:
        """Whether ``array`` is a whole run :meth:`empty` lent out (and not sent yet)."""
        return self._lent_head(array) >= 0

    def _lent_head(self, array: np.ndarray) -> int:
        """The run :meth:`empty` lent out that ``array`` covers from its start (-1: none)."""
        segment, runs = self.segment, self.books.runs
        offset = int(array.ctypes.data) - segment.base if array.size else -1
        head = offset // segment.granule
        if (0 <= offset < len(segment.data) and offset % segment.granule == 0
                and array.flags.c_contiguous and head in runs
                and array.nbytes <= runs[head] * segment.granule
                and int(segment.table[head, ROW_STATE]) == HELD):
            return head
        return -1

    def in_use(self, in_transit: bool = False) -> int:
        """Granules of the runs not free now, in every region: what trainers hold, what is
        on its way, what a process lent out or keeps (released runs, and a dead trainer's
        holds, count as free at once, before their allocator takes them back).
        ``in_transit``: only those of the runs still on their way to a trainer (sent as
        references that no trainer has decoded yet), a part of the former."""
        # A copy first: the workers write their regions' books meanwhile, and numpy's
        # nonzero fails on an array whose count changes under it (the stats then crashed
        # the server). A torn copy is a figure a moment old, right for the statistics.
        lengths = self.books.lengths.copy()
        heads = np.flatnonzero(lengths)
        busy = held(self.segment.table, heads)
        busy |= np.isin(heads, list(self.books.pinned)) | (self.books.kept[heads] > 0)
        if in_transit:
            busy &= unclaimed(self.segment.table, heads)
        return int(lengths[heads[busy]].sum())

    def stats(self) -> dict[str, int]:
        return {
            "shm_messages": self.messages,
            "shm_stalls": self.stalls,
            "shm_bytes_copied": self.copied,
            "shm_bytes_in_use": self.in_use() * self.segment.granule,
            "shm_bytes_in_transit": self.in_use(in_transit=True) * self.segment.granule,
            "shm_bytes": len(self.segment.data),
        }

    def close(self) -> None:
        """Unlink the segment (only the process that created it does)."""
        if os.getpid() != self.creator:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if self.reaper is not None and self.reaper.stdin is not None:
            self.reaper.stdin.close()  # its pipe closes: it removes nothing more and exits
            self.reaper = None


def _start_reaper(path: str) -> subprocess.Popen[bytes] | None:
    """A shell that removes ``path`` once every holder of its pipe is gone.

    The shell that is started hands the pipe to a background shell and exits at
    once (reaped here): the reaper is nobody's child then, so a supervisor that
    kills the server and its children (or its process group) does not take the
    reaper with it before it did its work. None (and the next start's
    :func:`sweep` does the job) where no shell can be started.
    """
    try:
        starter = subprocess.Popen(
            ["sh", "-c", 'exec 3<&0; (read -r _ <&3; rm -f -- "$1") & exit 0',
             "feedmux-shm-reaper", path],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True)
        starter.wait(REAPER_EXIT)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.info("no reaper for the shared-memory pool (%s): a killed server's segment "
                 "stays until the next server starts on this host", error)
        return None
    return starter


def _let_go(pinned: set[int], slots: memoryview, head: int, generation: int) -> None:
    """The last object of the allocating process that held run ``head`` is gone: it may be
    reused once released, and is released now if it was never sent."""
    pinned.discard(head)
    release_run(slots, head * ROW_WIDTH, generation, HELD)


def _unkeep(kept: np.ndarray, slots: memoryview, head: int, generation: int) -> None:
    """The last of the server's views of a worker's run ``head`` is gone: the worker may
    reuse it once released, and it is released now if the server never sent it on."""
    kept[head] -= 1
    if not kept[head]:
        release_run(slots, head * ROW_WIDTH, generation, FORWARDED)


#: The pool of the draw under way in this thread (see :func:`drawing_into`).
_drawing: contextvars.ContextVar[ShmPool | None] = contextvars.ContextVar(
    "feedmux_shm_drawing", default=None)


@contextlib.contextmanager
def drawing_into(pool: ShmPool | None) -> Iterator[None]:
    """Within the block, :func:`shared_empty` allocates from ``pool``.

    The producer sets it around each draw from the streamer (and nothing else
    does): :func:`shared_empty` is public and called by a user's streamer, which
    has no pool to pass and must run unchanged outside a server, so the pool
    reaches it as the context of the draw that runs it. That context is set
    and reset by the one caller that draws, for the time of the draw alone: a
    streamer that keeps its generator and runs it elsewhere gets plain memory.
    """
    token = _drawing.set(pool)
    try:
        yield
    finally:
        _drawing.reset(token)


def shared_empty(shape: int | Sequence[int], dtype: Any = float) -> np.ndarray:
    """An uninitialised array that a server sends with no copy at all.

    Inside a server with a shared-memory pool (a streamer run by
    ``feedmux serve``, in the server or in one of its ``--workers``, while the
    server draws from it: :func:`drawing_into`), the array lives in the pool:
    fill it, yield it, and do not write to it afterwards. Elsewhere, or when the
    pool is full or the array small, it is a plain ``np.empty``.

    Examples
    --------
    >>> shared_empty((2, 3), "float32").shape
    (2, 3)
    """
    pool = _drawing.get()
    if pool is not None and os.getpid() == pool.allocator:
        array = pool.empty(shape, dtype)
        if array is not None:
            return array
    return np.empty(shape, dtype)


def owned_copy(array: np.ndarray, pool: ShmPool | None) -> np.ndarray:
    """A copy of ``array`` that the server owns: in ``pool`` while the server sends
    through it, so the copy that protects a sample from its streamer is the only
    one (the send refers to it in place), else a plain ``array.copy()``.

    An array from :func:`shared_empty` is the server's already (the streamer
    promised not to write to it once yielded): it is returned as it is, so a
    sample built in place is never copied at all.
    """
    if pool is not None and os.getpid() == pool.allocator and array.nbytes >= SHM_THRESHOLD:
        if pool.lent(array):
            return array
        copy = pool.empty(array.shape, array.dtype) if pool.wanted else None
        if copy is not None:
            np.copyto(copy, array)
            return copy
    copied: np.ndarray = array.copy()
    return copied
