"""A ranked loader's last hand-out, kept where a SIGKILL cannot take it: a file mapped in memory.

This module owns the mark file of a ranked
:class:`~feedmux.client.remote.RemoteLoader`: a small file in ``/dev/shm`` (or
the temporary folder), named after the job (the servers' endpoints, the
consumer group, the rank, the world size and the user), that holds the tags of
the loader's current message and how many of them it handed out. Each hand-out
is one store into the mapping, no system call: the stores of a process killed
with SIGKILL stay in the page cache, so a successor of the same rank on the same
host reads exactly what its predecessor handed out, where the acknowledging
thread's last mark (sent every 20 to 100 ms) may be dozens of samples behind.

The file is trusted only when it is this user's regular file, of this rank and
world size, written by a process that is gone (its pid is dead, a zombie, or
another process's now); never a live process's (a duplicate rank is refused by
the server anyway). Which server the marks belong to is in the file, and the
server checks it (a restarted server ignores its predecessor's marks). The file
is removed at a clean close; a SIGKILLed loader leaves it for its successor,
which replaces it with its own. It must never send anything, nor decide what a
server deals: the hello carries what it read.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import stat
import tempfile
from collections.abc import Sequence
from typing import Any

from feedmux._plumbing.shmtable import pid_alive

log = logging.getLogger("feedmux.client")

__all__ = ["MarkFile", "mark_path", "read_marks"]

#: The first word of a mark file, and the layout version.
MAGIC, VERSION = 0x6B72616D78756D66, 1  # b"fmuxmark" little-endian
#: The header's words: where each field is.
(_MAGIC, _VERSION, _PID, _START, _RANK, _WORLD, _LINKS, _CAPACITY, INDEX, _LINK, _COUNT,
 _RESERVED) = range(12)
HEADER_WORDS = 12
#: Bytes of a server id a link's slot holds (the server's ids are 12 hex digits).
SERVER_ID_BYTES = 64
#: Words of a link's slot: the last (epoch, position) handed out of the messages before the
#: current one (epoch 0: none), then the server id.
SLOT_WORDS = 2 + SERVER_ID_BYTES // 8
#: Rows of tags the file holds at first; a larger message grows it.
CAPACITY = 256
#: Where the file goes when ``/dev/shm`` is not there (a tmpfs is best: no disk write).
SHM_DIR = "/dev/shm"

#: What a mark file says of one link: (server id, epoch, position) of the last hand-out.
Mark = tuple[str, int, int]


def mark_path(addresses: Sequence[str], controls: Sequence[str], group: str, rank: int,
              world_size: int) -> str:
    """The mark file of rank ``rank`` of ``world_size`` of ``group`` at these servers, for
    this user: the same for every process of that rank on this host."""
    job = "\0".join([*addresses, "|", *controls, "|", group, str(rank), str(world_size)])
    digest = hashlib.sha256(job.encode()).hexdigest()[:24]
    folder = SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) \
        else tempfile.gettempdir()
    return os.path.join(folder, f"feedmux-rank-{os.getuid()}-{digest}.mark")


def _size(links: int, capacity: int) -> int:
    return 8 * (HEADER_WORDS + links * SLOT_WORDS + 2 * capacity)


def read_marks(path: str, *, rank: int, world_size: int,
               links: int) -> list[Mark | None] | None:
    """Per link, what the predecessor whose file is at ``path`` handed out last; None when
    there is no file to trust (none, not this user's, another job's, a live process's).

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m")
    >>> marks = MarkFile.create(path, rank=1, world_size=2, links=1)
    >>> marks.message(0, "s1", np.array([[1, 1], [1, 3], [1, 5]]))
    >>> marks.index[0] = 2  # the loader handed out two samples
    >>> read_marks(path, rank=1, world_size=2, links=1) is None  # a live process's file
    True
    >>> describe(path)
    ([('s1', 1, 3)], True)
    """
    marks, alive = describe(path, rank=rank, world_size=world_size, links=links)
    if marks is None or alive:
        if alive:
            log.info("mark file %s belongs to a live process: not read", path)
        return None
    return marks


def describe(path: str, *, rank: int | None = None, world_size: int | None = None,
             links: int | None = None) -> tuple[list[Mark | None] | None, bool]:
    """``(marks, writer alive)`` of the mark file at ``path`` (marks None: no such file of
    this user, or not of this rank, world size and links when they are given)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None, False
    try:
        status = os.fstat(descriptor)
        if not _is_ours(status) or status.st_size < 8 * HEADER_WORDS:
            return None, False
        content = os.read(descriptor, status.st_size)
    finally:
        os.close(descriptor)
    words = memoryview(content)[: len(content) // 8 * 8].cast("q")
    if words[_MAGIC] != MAGIC or words[_VERSION] != VERSION:
        return None, False
    count_links, capacity = words[_LINKS], words[_CAPACITY]
    if not (0 < count_links <= 1 << 12 and 0 <= capacity <= 1 << 24) \
            or len(content) < _size(count_links, capacity):
        return None, False
    if (rank is not None and words[_RANK] != rank) or (
            world_size is not None and words[_WORLD] != world_size) or (
            links is not None and count_links != links):
        return None, False
    alive = words[_PID] == os.getpid() or _alive(words[_PID], words[_START])
    return _marks(words, content, count_links), alive


def _marks(words: Any, content: bytes, links: int) -> list[Mark | None]:
    index, current, count = words[INDEX], words[_LINK], words[_COUNT]
    marks: list[Mark | None] = []
    tags = HEADER_WORDS + links * SLOT_WORDS
    for link in range(links):
        slot = HEADER_WORDS + link * SLOT_WORDS
        server = content[8 * (slot + 2): 8 * (slot + SLOT_WORDS)].rstrip(b"\0").decode(
            "utf-8", "replace")
        if link == current and 0 < index <= min(count, words[_CAPACITY]):
            # The current message's last hand-out: what the slot says is older (and may be
            # half written, when the process died folding it in).
            row = tags + 2 * (index - 1)
            marks.append((server, words[row], words[row + 1]) if server else None)
        elif words[slot] > 0 and server:
            marks.append((server, words[slot], words[slot + 1]))
        else:
            marks.append(None)
    return marks


def _is_ours(status: os.stat_result) -> bool:
    return stat.S_ISREG(status.st_mode) and status.st_uid == os.getuid()


def _alive(pid: int, start: int) -> bool:
    """Whether process ``pid``, started at ``start`` (clock ticks after boot; 0: unknown),
    still runs: a zombie is dead, and so is a pid that another process took since."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel whether the pid exists
        return pid_alive(pid)
    # fields[0] is the state (field 3 of stat), fields[19] the start time (field 22).
    if fields[0] in (b"Z", b"X"):
        return False
    return not start or int(fields[19]) == start


def _start_time(pid: int) -> int:
    """When process ``pid`` started (clock ticks after boot), or 0 when not known."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            return int(stat_file.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


class MarkFile:
    """This process's mark file: created by :meth:`create`, written by the loader.

    :attr:`index` is a one-word view of the file: the loader stores into it how
    many samples of its current message it handed out, at each hand-out (the
    only thing it does per sample). :meth:`message` is called when a new message
    becomes current, before anything of it is handed out.
    """

    def __init__(self, path: str, descriptor: int, links: int, capacity: int) -> None:
        self.path = path
        self._descriptor = descriptor
        self._inode = os.fstat(descriptor).st_ino
        self.links = links
        self._capacity = capacity
        self._map = mmap.mmap(descriptor, _size(links, capacity))
        self._words = memoryview(self._map).cast("q")
        #: The word the loader stores its hand-outs of the current message into.
        self.index = self._words[INDEX:INDEX + 1]
        self._servers: list[str] = [""] * links

    @classmethod
    def create(cls, path: str, *, rank: int, world_size: int, links: int,
               carried: Sequence[Mark | None] = ()) -> MarkFile:
        """A new mark file at ``path`` (replacing any), holding the ``carried`` marks of a
        predecessor (so that a successor killed before its first hand-out passes them on)."""
        folder, name = os.path.split(path)
        temporary = os.path.join(folder, f".{name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.ftruncate(descriptor, _size(links, CAPACITY))
            marks = cls(path, descriptor, links, CAPACITY)
            words = marks._words
            words[_PID], words[_START] = os.getpid(), _start_time(os.getpid())
            words[_RANK], words[_WORLD], words[_LINKS] = rank, world_size, links
            words[_CAPACITY], words[_LINK] = CAPACITY, -1
            for link, mark in enumerate(carried):
                if mark is not None:
                    marks._server(link, mark[0])
                    marks._fold(link, mark[1], mark[2])
            words[_VERSION] = VERSION
            words[_MAGIC] = MAGIC  # last: a file without it is not read
            os.replace(temporary, path)
        except BaseException:
            os.close(descriptor)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return marks

    def message(self, link: int, server_id: str, tags: Any) -> None:
        """``tags`` (an ``(n, 2)`` array) of server ``server_id`` on ``link`` are the new
        current message; nothing of it is handed out yet.

        The order of the stores is what a SIGKILL between any two of them leaves
        readable: the last hand-out of the message before goes to its link's slot
        first, then the count of hand-outs is reset, and only then the tags change.
        """
        words = self._words
        index, current = words[INDEX], words[_LINK]
        if index > 0 and 0 <= current < self.links:
            row = HEADER_WORDS + self.links * SLOT_WORDS + 2 * (index - 1)
            self._fold(current, words[row], words[row + 1])
        words[INDEX] = 0
        if server_id != self._servers[link]:
            self._server(link, server_id)
        count = len(tags)
        if count > self._capacity:
            self._grow(count)
            words = self._words
        start = HEADER_WORDS + self.links * SLOT_WORDS
        if count:
            flat = memoryview(tags.astype("<i8", copy=False).tobytes()).cast("q")
            words[start:start + 2 * count] = flat
        words[_LINK], words[_COUNT] = link, count

    def _fold(self, link: int, epoch: int, position: int) -> None:
        slot = HEADER_WORDS + link * SLOT_WORDS
        self._words[slot + 1] = position  # read only once the epoch says there is a mark
        self._words[slot] = epoch

    def _server(self, link: int, server_id: str) -> None:
        """Link ``link`` now hands out from server ``server_id``: its slot's mark (another
        server's) is dropped first."""
        slot = HEADER_WORDS + link * SLOT_WORDS
        self._words[slot] = 0
        encoded = server_id.encode()[:SERVER_ID_BYTES].ljust(SERVER_ID_BYTES, b"\0")
        self._map[8 * (slot + 2): 8 * (slot + SLOT_WORDS)] = encoded
        self._servers[link] = server_id

    def _grow(self, rows: int) -> None:
        """Room for a message of ``rows`` samples (rare: a message larger than any before)."""
        capacity = max(rows, 2 * self._capacity)
        os.ftruncate(self._descriptor, _size(self.links, capacity))
        # The old mapping stays valid (the loader may hold its index view): the file only
        # grew. The new one shares its pages.
        self._map = mmap.mmap(self._descriptor, _size(self.links, capacity))
        self._words = memoryview(self._map).cast("q")
        self._words[_CAPACITY] = self._capacity = capacity

    def close(self, remove: bool = True) -> None:
        """Close the file, and (a clean close: the successor starts afresh) remove it."""
        if self._descriptor < 0:
            return
        if remove and os.getpid() == self._words[_PID]:
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
        os.close(self._descriptor)
        self._descriptor = -1
