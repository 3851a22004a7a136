"""The same-host shared-memory pool: one segment, its slot table, both ends' views of it.

This module owns the segment a server shares with the trainers on its host: its
layout (a header with a random token, a slot table, then the data area cut in
granules), the server's allocator (:class:`ShmPool`: places large array frames
in runs of granules, takes back released runs, back-pressures when full), the
trainer's side (:class:`ShmAttachment`: turns a reference frame into a
writable uint8 array over the segment, and frees the run once every view of it is
gone), the reference frame that replaces an array frame on the wire, and
:func:`shared_empty`. It never imports zmq and never sends anything: releases
are a store into the slot table, made by a ``weakref.finalize`` when the last
view of a run dies, so the hot path has no release messages at all.

Slot table (one row of four int64 per granule; only a run's first granule's row
is used): ``state`` (FREE, SENT, HELD by ``shared_empty``), ``generation``
(bumped at each allocation, so a late release of an old use frees nothing),
``owner`` (the pid of the trainer that received it; 0 while in flight) and the
time it was sent. The server takes a run back when its state is FREE, when its
owner pid no longer exists (a trainer that died), or when it stayed unclaimed
for ``orphan_timeout`` seconds (a message lost with a dead trainer's queue).

Cleanup: the segment is a file named ``feedmux-<server pid>-<token>`` in
``/dev/shm``. The server unlinks it when it closes (every exit but SIGKILL);
after a SIGKILL the next server started on the host removes every such file
whose pid is gone (:func:`sweep`). Trainers keep their mapping after the unlink.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import struct
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_SHM_SIZE",
    "REF_SIZE",
    "SHM_THRESHOLD",
    "ShmAttachment",
    "ShmPool",
    "ShmViews",
    "is_ref",
    "owned_copy",
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
#: Seconds between two looks for dead trainers' runs while the pool is full.
OWNER_CHECK = 0.25

_MAGIC = b"feedmxSM"
_HEADER = struct.Struct("<8s16sQQQ")  # magic, token, granules, granule size, data offset
# magic, segment id, head granule, granules, nbytes, generation, pid of the segment's creator
_REF = struct.Struct("<8sQQQQQQ")
#: Bytes of a reference frame: what replaces an array frame that travels through the pool.
REF_SIZE = _REF.size
FREE, SENT, HELD = 0, 1, 2
_STATE, _GEN, _OWNER, _STAMP = 0, 1, 2, 3
_PREFIX = "feedmux-"


def is_ref(frame: Any) -> bool:
    """Whether ``frame`` (a bytes-like of any length) is a reference frame."""
    return len(frame) == REF_SIZE and bytes(frame[:8]) == _MAGIC


def _layout(size: int, granule: int) -> tuple[int, int]:
    """(granules, data offset) of a segment of about ``size`` bytes."""
    granules = max(1, size // granule)
    table_end = 4096 + granules * 32
    return granules, -(-table_end // 4096) * 4096


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(directory: str = SHM_DIR) -> list[str]:
    """Remove the segments of servers that are gone (killed); return their paths."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        pid_text = name[len(_PREFIX):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            path = os.path.join(directory, name)
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


class _Segment:
    """A mapped segment file: the header fields, the slot table and the data area."""

    def __init__(self, fd: int, size: int) -> None:
        self.map = mmap.mmap(fd, size)
        magic, token, granules, granule, offset = _HEADER.unpack_from(self.map, 0)
        if magic != _MAGIC or offset + granules * granule > size:
            raise ValueError("not a feedmux shared-memory segment")
        self.token: bytes = token
        self.segment_id: int = int.from_bytes(token[:8], "little")
        self.granules, self.granule, self.offset = int(granules), int(granule), int(offset)
        whole = np.frombuffer(self.map, np.uint8)
        self.table: np.ndarray = whole[4096 : 4096 + self.granules * 32].view(np.int64).reshape(
            self.granules, 4)
        self.data: np.ndarray = whole[self.offset : self.offset + self.granules * self.granule]
        self.base = int(self.data.ctypes.data)


class ShmPool:
    """The server's side: creates the segment, places frames in it, takes runs back.

    Use :meth:`create`, which returns None (and says why) where shared memory is
    not available, so that the server falls back to sockets.
    """

    def __init__(self, path: str, segment: _Segment) -> None:
        self.path = path
        self.segment = segment
        self.creator = os.getpid()
        self.busy = np.zeros(segment.granules, bool)
        self.runs: dict[int, int] = {}  # head granule -> granules, every run not FREE here
        self.cursor = 0
        self.stalls = 0
        self.messages = 0
        self.orphan_timeout = ORPHAN_TIMEOUT
        self._owners_checked = 0.0
        #: Whether the server sends through the pool now (every free trainer maps it):
        #: :func:`owned_copy` writes large drawn arrays here only then.
        self.wanted = False

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
            path = os.path.join(directory, f"{_PREFIX}{os.getpid()}-{token[:6].hex()}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            log.warning("shared memory off: %s", error)
            return None
        try:
            os.ftruncate(fd, total)
            header = _HEADER.pack(_MAGIC, token, granules, granule, offset)
            os.pwrite(fd, header, 0)
            segment = _Segment(fd, total)
        except (OSError, ValueError) as error:
            os.unlink(path)
            log.warning("shared memory off: %s", error)
            return None
        finally:
            os.close(fd)
        return cls(path, segment)

    @property
    def token(self) -> str:
        return self.segment.token.hex()

    # -- allocation -------------------------------------------------------------------------
    def _find(self, count: int) -> int:
        """The head of ``count`` free granules (next fit from the cursor), or -1."""
        busy = self.busy
        size = len(busy)
        if count > size:
            return -1
        for start in (self.cursor, 0):
            window = busy[start:]
            free = np.flatnonzero(~window)
            if len(free) >= count:
                if count == 1:
                    return start + int(free[0])
                ends = np.flatnonzero(free[count - 1:] - free[: len(free) - count + 1] == count - 1)
                if len(ends):
                    return start + int(free[ends[0]])
        return -1

    def allocate(self, nbytes: int, state: int = SENT) -> int:
        """The head of a run of at least ``nbytes`` (state set), or -1 when full."""
        segment = self.segment
        count = max(1, -(-nbytes // segment.granule))
        head = self._find(count)
        if head < 0:
            self.reclaim(self.owners_due())
            head = self._find(count)
            if head < 0:
                return -1
        self.busy[head : head + count] = True
        self.runs[head] = count
        self.cursor = head + count if head + count < segment.granules else 0
        row = segment.table[head]
        row[_GEN] += 1
        row[_OWNER] = 0
        row[_STAMP] = int(time.monotonic() * 1000)
        row[_STATE] = state
        return head

    def free(self, head: int) -> None:
        count = self.runs.pop(head)
        self.busy[head : head + count] = False

    def owners_due(self) -> bool:
        """Whether it is time to look for dead trainers again (a system call per owner:
        at most every ``OWNER_CHECK`` seconds, not at every look at a full pool)."""
        now = time.monotonic()
        if now - self._owners_checked < OWNER_CHECK:
            return False
        self._owners_checked = now
        return True

    def reclaim(self, dead_owners: bool = True) -> int:
        """Take back released runs (and those of dead trainers, and orphans); return how many."""
        if not self.runs:
            return 0
        table = self.segment.table
        heads = np.fromiter(self.runs, np.int64, len(self.runs))
        states = table[heads, _STATE]
        freed = 0
        for head in heads[states == FREE].tolist():
            self.free(head)
            freed += 1
        if dead_owners:
            now = int(time.monotonic() * 1000)
            alive: dict[int, bool] = {}
            for head in heads[states == SENT].tolist():
                owner = int(table[head, _OWNER])
                orphan = owner == 0 and now - table[head, _STAMP] > self.orphan_timeout * 1000
                if owner and owner not in alive:
                    alive[owner] = _pid_alive(owner)
                if orphan or (owner and not alive[owner]):
                    table[head, _GEN] += 1  # a late claim or release of it now fails
                    table[head, _STATE] = FREE
                    self.free(head)
                    freed += 1
        return freed

    def place(self, frames: Sequence[Any], threshold: int = SHM_THRESHOLD) -> list[Any] | None:
        """``frames`` with every large array frame moved into the pool and replaced by a ref.

        Returns None when the pool has no room for them now (nothing is placed
        then); the caller waits for releases and asks again. A frame that is
        already in the pool (:func:`shared_empty`) is referred to without a copy.
        """
        segment = self.segment
        placed: list[Any] = list(frames)
        taken: list[int] = []
        held: list[int] = []
        for index in range(2, len(placed)):
            frame = placed[index]
            nbytes = len(frame)
            if nbytes < threshold:
                continue
            source = np.frombuffer(frame, np.uint8)
            offset = int(source.ctypes.data) - segment.base
            head = offset // segment.granule
            if (0 <= offset < len(segment.data) and offset % segment.granule == 0
                    and self.runs.get(head) and segment.table[head, _STATE] == HELD):
                row = segment.table[head]
                row[_STAMP] = int(time.monotonic() * 1000)
                row[_STATE] = SENT
                held.append(head)
            else:
                head = self.allocate(nbytes)
                if head < 0:
                    for undo in taken:
                        segment.table[undo, _STATE] = FREE
                        self.free(undo)
                    segment.table[held, _STATE] = HELD
                    return None
                taken.append(head)
                start = head * segment.granule
                segment.data[start : start + nbytes] = source
            placed[index] = _REF.pack(_MAGIC, segment.segment_id, head, self.runs[head], nbytes,
                                      int(segment.table[head, _GEN]), self.creator)
        self.messages += 1
        return placed

    def empty(self, shape: Any, dtype: Any) -> np.ndarray | None:
        """An array in the pool (HELD until sent), or None when the pool has no room."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if dtype.hasobject or nbytes < SHM_THRESHOLD:
            return None
        head = self.allocate(nbytes, HELD)
        if head < 0:
            return None
        segment = self.segment
        start = head * segment.granule
        array: np.ndarray = segment.data[start : start + nbytes].view(dtype).reshape(shape)
        generation = int(segment.table[head, _GEN])
        # Never sent: the run comes back when the array dies.
        weakref.finalize(array, _release, segment.table, head, generation, HELD)
        return array

    def stats(self) -> dict[str, int]:
        return {
            "shm_messages": self.messages,
            "shm_stalls": self.stalls,
            "shm_bytes_in_use": int(self.busy.sum()) * self.segment.granule,
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


def _release(table: np.ndarray, head: int, generation: int, state: int) -> None:
    """Free run ``head`` if it is still in ``state`` at ``generation`` (finalizer)."""
    row = table[head]
    if row[_GEN] == generation and row[_STATE] == state:
        row[_STATE] = FREE


class ShmAttachment:
    """The trainer's side of one server's segment: refs in, views out, releases on death."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self.segment = _Segment(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.view = memoryview(self.segment.map)
        self.pid = os.getpid()

    @property
    def token(self) -> str:
        return self.segment.token.hex()

    def resolve(self, ref: Any, nbytes: int) -> np.ndarray:
        """The memory a reference frame names: claimed by this process, freed when unused."""
        _, _, head, count, size, generation, _ = _REF.unpack(ref)
        segment = self.segment
        if size != nbytes or not 0 <= head < segment.granules or (
                count * segment.granule < size or head + count > segment.granules):
            raise ValueError(f"shared-memory reference to {size} bytes at granule {head} does "
                             f"not fit an array of {nbytes} bytes in this pool")
        row = segment.table[head]
        row[_OWNER] = self.pid
        if row[_GEN] != generation or row[_STATE] != SENT:
            raise ValueError(f"shared-memory run {head} was taken back before it was received")
        start = segment.offset + head * segment.granule
        # An ndarray, not a memoryview: numpy keeps the array it is given alive in every
        # view made from it, but re-exports a memoryview's memory without keeping it.
        memory: np.ndarray = np.frombuffer(self.view[start : start + size], np.uint8)
        weakref.finalize(memory, _release, segment.table, head, generation, SENT)
        return memory


class ShmViews:
    """A trainer's attachments, by segment id: the resolver its decoder is given."""

    def __init__(self) -> None:
        self.attachments: dict[int, ShmAttachment] = {}

    def attach(self, path: str) -> str:
        """Map the segment at ``path``; return the token read from it (raises OSError)."""
        try:
            attachment = ShmAttachment(path)
        except ValueError as error:
            raise OSError(str(error)) from None
        self.attachments[attachment.segment.segment_id] = attachment
        return attachment.token

    def _attach_named(self, segment_id: int, creator: int) -> ShmAttachment | None:
        """Map the segment a reference names, found by its name on this host.

        A reference can arrive before the offer that names the pool (a trainer
        whose data socket was dealt to before its hello was answered): its
        creator's pid and segment id give the file's name. None where there is
        no such file (another host, another container).
        """
        token = segment_id.to_bytes(8, "little")[:6].hex()
        try:
            self.attach(os.path.join(SHM_DIR, f"{_PREFIX}{creator}-{token}"))
        except OSError:
            return None
        return self.attachments.get(segment_id)

    def __call__(self, frame: Any, nbytes: int) -> Any:
        if not is_ref(frame):
            return frame
        segment_id = int.from_bytes(bytes(frame[8:16]), "little")
        attachment = self.attachments.get(segment_id)
        if attachment is None:
            attachment = self._attach_named(segment_id, _REF.unpack(frame)[-1])
        if attachment is None:
            raise ValueError("reference to a shared-memory pool this trainer has not mapped "
                             "(a trainer on another host, or one started with shm=False)")
        return attachment.resolve(frame, nbytes)


_active: ShmPool | None = None


def activate(pool: ShmPool | None) -> None:
    """Make ``pool`` the one :func:`shared_empty` allocates from in this process."""
    global _active
    _active = pool


def shared_empty(shape: int | Sequence[int], dtype: Any = float) -> np.ndarray:
    """An uninitialised array that a server sends with no copy at all.

    Inside a server with a shared-memory pool (a streamer run by
    ``feedmux serve``, one worker), the array lives in the pool: fill it, yield
    it, and do not write to it afterwards. Elsewhere, or when the pool is full or
    the array small, it is a plain ``np.empty``.

    Examples
    --------
    >>> shared_empty((2, 3), "float32").shape
    (2, 3)
    """
    pool = _active
    if pool is not None and os.getpid() == pool.creator:
        array = pool.empty(shape, dtype)
        if array is not None:
            return array
    return np.empty(shape, dtype)


def owned_copy(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` that the server owns: in the pool while the server sends
    through it, so the copy that protects a sample from its streamer is the only
    one (the send refers to it in place), else a plain ``array.copy()``."""
    pool = _active
    if (pool is not None and pool.wanted and array.nbytes >= SHM_THRESHOLD
            and os.getpid() == pool.creator):
        copy = pool.empty(array.shape, array.dtype)
        if copy is not None:
            np.copyto(copy, array)
            return copy
    copied: np.ndarray = array.copy()
    return copied
