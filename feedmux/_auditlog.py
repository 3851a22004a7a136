"""The audit log of a loader: what it handed out, as compact append-only line records.

This module owns the record format and both its ends: :class:`AuditLog`, the
writer a :class:`~feedmux.client.remote.RemoteLoader` given ``audit_log=``
calls once per data message (never per sample, unless a sample key is asked
for), and :func:`read_log`, which turns a file back into :class:`Session`
objects for the checker (:mod:`feedmux.apps.audit`). A record is one text line
ending in a CRC-32 of its text, so a record torn by a SIGKILL (or a full disk)
is recognised however it was cut; only a session's last record may be torn.
Records are appended with ``os.write`` on an ``O_APPEND`` descriptor (no
buffer in this process outlives a write), in batches, and always *before* the
loader tells a server what it handed out (a rank's progress, a free
trainer's acknowledgements), so a log never lacks a hand-out that a server
was told of. A rank's log also records each message's rows when it becomes
current, before the first of them is handed out (a D record, written at
once): how far a rank got in its last message is written lazily (a write per
sample would cost the hot path), so a rank SIGKILLed between two writes may
lack the H record of its last few hand-outs, but never the D record that says
which samples they were. It must never touch a socket or decide whether a job
was sound.

Records (``KIND fields... #crc``)::

    feedmux-audit 1 {header json}      a session starts: one loader in one process
    S link server_id epoch_size world_size uneven   the server of a link, when it changes
    H message link epoch runs [keys]  hand-outs: runs "start:count:step,..." of positions
    D message link epoch runs [keys]  a rank's message made current, before any hand-out
    P link server_id epoch position    a rank's dead predecessor of the same rank handed out
                                       up to here, as its mark file says (docs/ddp.md)
    C message {json}                   state_dict(): a checkpoint (the positions saved)
    R {json}                           load_state_dict(): resumed from those positions
    Q ended                            close() (ended: the stream had finished)
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from feedmux.errors import FeedmuxError

__all__ = [
    "MAGIC",
    "NO_AUDIT",
    "AuditLog",
    "AuditLogError",
    "HandOutRecord",
    "NoAudit",
    "Session",
    "open_audit",
    "read_log",
    "record_line",
    "stride_runs",
]

MAGIC = "feedmux-audit"
VERSION = 1
#: Records a loader that tells no server what it handed out keeps before it writes them.
BATCH_RECORDS = 64
#: ... and the longest it keeps them (seconds).
BATCH_SECONDS = 0.5


class AuditLogError(FeedmuxError, ValueError):
    """An audit log that cannot be read: not one, or damaged before its last record."""


class _Link(Protocol):
    server_id: str
    epoch_size: int | None
    world_size: int
    uneven: str


class _Links(Protocol):
    @property
    def links(self) -> Sequence[_Link]: ...


def stride_runs(positions: Any) -> list[tuple[int, int, int]]:
    """``(start, count, step)`` runs covering ``positions`` in order.

    A free trainer's message is one run of step 1; a rank's, one run of step
    ``world_size``: one numpy pass, no Python step per position.

    Examples
    --------
    >>> import numpy as np
    >>> stride_runs(np.array([4, 7, 10])), stride_runs(np.array([1, 2, 3, 9, 11]))
    ([(4, 3, 3)], [(1, 3, 1), (9, 2, 2)])
    """
    count = len(positions)
    if count == 0:
        return []
    if count == 1:
        return [(int(positions[0]), 1, 1)]
    steps = np.diff(positions)
    if (steps == steps[0]).all():
        return [(int(positions[0]), count, int(steps[0]))]
    values = [int(value) for value in positions]
    runs: list[tuple[int, int, int]] = []
    index = 0
    while index < count:
        if index + 1 == count:
            runs.append((values[index], 1, 1))
            break
        step = values[index + 1] - values[index]
        end = index + 1
        while end + 1 < count and values[end + 1] - values[end] == step:
            end += 1
        runs.append((values[index], end - index + 1, step))
        index = end + 1
    return runs


def record_line(text: str) -> bytes:
    """One record: ``text``, a space, ``#`` and its CRC-32 in hex, a line end."""
    return f"{text} #{zlib.crc32(text.encode()):08x}\n".encode()


def _keys(samples: Sequence[Any], key: str, start: int, stop: int) -> list[Any]:
    """The ``key`` field of ``samples[start:stop]`` as ints, floats or strs (numbers of one
    numpy type at once, at C level). ``samples`` may be one batch (``batch_size=``): a
    dict of stacked columns."""
    batch: Any = samples
    if type(batch) is dict and key in batch:
        column = batch[key][start:stop]
        return [_key_of(value, key) for value in column] if type(column) is list else (
            list(np.asarray(column).tolist()))
    try:
        values = [samples[row][key] for row in range(start, stop)]
    except (KeyError, IndexError, TypeError):
        sample = next((samples[row] for row in range(start, stop)
                       if not _has(samples[row], key)), None)
        raise FeedmuxError(f"audit_key {key!r}: expected samples with a field {key!r}, got "
                           f"a {type(sample).__name__} without it") from None
    if values and isinstance(values[0], (np.integer, np.floating)):
        array = np.asarray(values)
        if array.ndim == 1 and array.dtype.kind in "iuf":
            return list(array.tolist())
    return [_key_of(value, key) for value in values]


def _has(sample: Any, key: str) -> bool:
    try:
        sample[key]
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _key_of(value: Any, key: str) -> int | str | float:
    if hasattr(value, "item"):
        value = value.item()  # a numpy scalar or 0-d array
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, (int, str, float)) or isinstance(value, bool):
        raise FeedmuxError(f"audit_key {key!r}: expected an int, str or float field, got "
                           f"{type(value).__name__}")
    return value


class AuditLog:
    """The writer of one loader's audit log (thread-safe: the acknowledging thread calls
    :meth:`guard`'s wrapper while the loader's thread hands out).

    The loader announces each new data message (:meth:`begin`) and how far it
    handed it out (:meth:`upto`); the log records each part once, whoever
    reports it first. ``write_through``: write at every message (a free
    trainer's own acknowledgements follow at once); otherwise records wait for
    :data:`BATCH_RECORDS` records, :data:`BATCH_SECONDS`, a checkpoint, the
    close, or the acknowledging thread's next report to a server. ``dealt`` (a
    rank's log): each message's rows are written as a D record in :meth:`begin`,
    with whatever waits, before the loader hands out the first of them.
    """

    def __init__(self, path: str | os.PathLike[str], key: str | None, header: dict[str, Any],
                 links: _Links, *, write_through: bool, dealt: bool = False) -> None:
        self.path = str(path)
        self.key = key
        self._header = {**header, "key": key}
        self._links = links
        self._write_through = write_through
        self._dealt = dealt
        self._lock = threading.Lock()
        self._fd = -1
        self._pid = 0
        self._owner = os.getpid()  # the process whose hand-outs are pending
        self._closed = False
        self._pending: list[bytes] = []
        self._flushed_at = time.monotonic()
        self._servers: dict[int, tuple[str, int | None, int, str]] = {}
        self._messages = 0
        # The current message: link, tags, samples and how many rows are recorded.
        self._link = 0
        self._tags: Any = None
        self._samples: Sequence[Any] = ()
        self._recorded = 0
        #: The current message's keys, taken once for its D record (None: not taken).
        self._message_keys: list[Any] | None = None

    # -- what the loader reports ----------------------------------------------------------
    def begin(self, link: int, server_id: str, tags: Any, samples: Sequence[Any]) -> None:
        """A new data message is current: ``tags`` rows (epoch, position), its ``samples``."""
        with self._lock:
            if self._owner != os.getpid():
                self._forked()
            self._note_server(link, server_id)
            self._messages += 1
            self._link, self._tags, self._samples, self._recorded = link, tags, samples, 0
            self._message_keys = None
            if self._dealt and len(tags):
                # Before the loader hands out any of it (it does once this returns): a rank
                # killed at any moment after has its samples in the log.
                self._pending.append(record_line(self._rows_text("D", 0, len(tags))))
                self._flush()

    def upto(self, used: int) -> None:
        """The current message's first ``used`` samples were handed out."""
        with self._lock:
            self._record(used)
            if self._pending and (self._write_through or len(self._pending) >= BATCH_RECORDS
                                  or time.monotonic() - self._flushed_at > BATCH_SECONDS):
                self._flush()

    def guard(self, progress: Callable[[], Any]) -> Callable[[], Any]:
        """``progress`` (the acknowledging thread's view of the loader: a tuple ending in
        the tags and the count used, or None) wrapped so that what it reports is
        written here first."""
        def guarded() -> Any:
            current = progress()
            with self._lock:
                if current is not None and current[2] is self._tags:
                    self._record(current[4])
                if self._pending:
                    self._flush()
            return current

        return guarded

    def checkpoint(self, state: dict[str, Any], used: int) -> dict[str, Any]:
        """``state_dict()`` returns ``state``: record it (with everything before it)."""
        self._mark("C", used, state)
        return state

    def resumed(self, state: dict[str, Any]) -> None:
        """``load_state_dict(state)``: the next hand-outs continue from its positions."""
        self._mark("R", None, state)

    def close(self, used: int, *, ended: bool) -> None:
        """The loader closes (``ended``: its stream had finished); later reports are ignored."""
        with self._lock:
            if self._closed:
                return
            self._record(used)
            for link, (server_id, *_) in list(self._servers.items()):
                self._note_server(link, server_id)  # an epoch size learnt since
            self._pending.append(record_line(f"Q {int(ended)}"))
            self._flush()
            self._closed = True
            if self._fd >= 0 and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = -1

    def flush(self) -> None:
        """Write what waits (the loader is garbage-collected or the process exits)."""
        with self._lock:
            if self._pending:
                self._flush()

    # -- inside the lock ------------------------------------------------------------------
    def predecessor(self, link: int, server_id: str, epoch: int, position: int) -> None:
        """A ranked loader read its dead predecessor's mark file: the predecessor handed out
        ``(epoch, position)`` of server ``server_id`` (link ``link``) last. The
        predecessor's own log may lack its last few hand-outs (written lazily); this
        record, written before any server is told, says how far it got."""
        with self._lock:
            self._pending.append(record_line(f"P {link} {server_id} {epoch} {position}"))
            self._flush()

    def _mark(self, kind: str, used: int | None, state: dict[str, Any]) -> None:
        saved = {"resume": state.get("resume"),
                 "last": [state.get("last_epoch"), state.get("last_position"),
                          state.get("last_server_id")]}
        with self._lock:
            if used is not None:
                self._record(used)
            prefix = f"C {self._messages}" if kind == "C" else kind
            saved_text = json.dumps(saved, separators=(",", ":"))
            self._pending.append(record_line(f"{prefix} {saved_text}"))
            self._flush()

    def _note_server(self, link: int, server_id: str) -> None:
        """An S record when what the loader knows of link ``link``'s server changed."""
        server = self._links.links[link]
        seen = (server_id, server.epoch_size, server.world_size, server.uneven)
        if self._servers.get(link) != seen:
            self._servers[link] = seen
            size = "-" if server.epoch_size is None else server.epoch_size
            self._pending.append(record_line(
                f"S {link} {server_id} {size} {server.world_size} {server.uneven or '-'}"))

    def _record(self, used: int) -> None:
        """Append the H record of the current message's rows ``recorded .. used``."""
        tags = self._tags
        if tags is None or used <= self._recorded:
            return
        used = min(used, len(tags))
        self._pending.append(record_line(self._rows_text("H", self._recorded, used)))
        self._recorded = used

    def _rows_text(self, kind: str, start: int, stop: int) -> str:
        """An H or D record's text: the current message's rows ``start .. stop``."""
        rows = self._tags[start:stop]
        runs = ",".join(f"{first}:{count}:{step}" for first, count, step
                        in stride_runs(rows[:, 1]))
        text = f"{kind} {self._messages} {self._link} {int(rows[0, 0])} {runs}"
        if self.key is not None:
            if kind == "D":
                self._message_keys = _keys(self._samples, self.key, 0, len(self._tags))
            keys = (self._message_keys[start:stop] if self._message_keys is not None
                    else _keys(self._samples, self.key, start, stop))
            text += " " + json.dumps(keys, separators=(",", ":"))
        return text

    def _forked(self) -> None:
        """This is a forked copy: what waits is the parent's; this process's own session
        (its own file where the path names ``{pid}``) starts now."""
        self._owner, self._fd, self._pid = os.getpid(), -1, 0
        self._pending.clear()
        self._servers.clear()
        self._tags, self._recorded, self._message_keys = None, 0, None

    def _flush(self) -> None:
        if self._closed:
            self._pending.clear()
            return
        if self._fd < 0 or self._pid != os.getpid():
            self._open()
        os.write(self._fd, b"".join(self._pending))
        self._pending.clear()
        self._flushed_at = time.monotonic()

    def _open(self) -> None:
        """Open (in this process) and start a session; a torn last line gets its own end."""
        path = Path(self.path.replace("{pid}", str(os.getpid())))
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pid = os.getpid()
        start = b""
        size = os.fstat(self._fd).st_size
        if size:
            with open(path, "rb") as existing:
                existing.seek(size - 1)
                if existing.read(1) != b"\n":
                    start = b"\n"
        header = {**self._header, "pid": self._pid, "time": time.time()}
        header_text = json.dumps(header, separators=(",", ":"))
        self._pending.insert(0, record_line(f"{MAGIC} {VERSION} {header_text}"))
        self._pending.insert(0, start)


class NoAudit:
    """What a loader without ``audit_log`` calls: nothing."""

    def begin(self, link: int, server_id: str, tags: Any, samples: Sequence[Any]) -> None:
        pass

    def predecessor(self, link: int, server_id: str, epoch: int, position: int) -> None:
        pass

    def upto(self, used: int) -> None:
        pass

    def guard(self, progress: Callable[[], Any]) -> Callable[[], Any]:
        return progress

    def checkpoint(self, state: dict[str, Any], used: int) -> dict[str, Any]:
        return state

    def resumed(self, state: dict[str, Any]) -> None:
        pass

    def close(self, used: int, *, ended: bool) -> None:
        pass


NO_AUDIT = NoAudit()


def open_audit(path: str | os.PathLike[str] | None, key: str | None, loader: Any,
               links: _Links) -> AuditLog | NoAudit:
    """The audit log of ``loader`` (its public settings go into each session's header).

    ``path`` may name ``{rank}``, ``{pid}`` and ``{client_id}``: one file per
    process when copies of a loader iterate in several (each session must be
    written by one process).
    """
    if path is None:
        if key is not None:
            raise FeedmuxError(f"expected audit_key only with audit_log, got audit_key={key!r}")
        return NO_AUDIT
    if key is not None and not (isinstance(key, str) and key):
        raise FeedmuxError(f"expected audit_key a field name (str), got {key!r}")
    header = {"client_id": loader.client_id, "rank": loader.rank,
              "world_size": loader.world_size, "group": loader.group,
              # (every loader acknowledges now; the checker reads False in older logs)
              "reliable": True, "hwm": loader.hwm,
              "addresses": list(loader.addresses)}
    rank = "" if loader.rank is None else loader.rank
    # {pid} is filled in by the process that writes (a forked copy has its own).
    named = str(path).format(rank=rank, pid="{pid}", client_id=loader.client_id)
    log = AuditLog(named, key, header, links,
                   write_through=True, dealt=loader.rank is not None)
    weakref.finalize(loader, log.flush)
    return log


# -- reading ----------------------------------------------------------------------------------
@dataclass
class HandOutRecord:
    """One H record (rows of one message that a session handed out) or D record (a
    rank's message as it became current, before any of it was handed out)."""

    message: int
    link: int
    server_id: str
    epoch: int
    positions: np.ndarray
    keys: list[Any] | None


@dataclass
class Session:
    """One loader in one process, from its header to the next header (or the file's end)."""

    path: str
    line: int
    header: dict[str, Any]
    handouts: list[HandOutRecord] = field(default_factory=list)
    #: a rank's messages as they became current (D records), before any hand-out
    dealt: list[HandOutRecord] = field(default_factory=list)
    #: link -> epoch size, world size and uneven mode the servers said (the latest)
    servers: dict[int, tuple[int | None, int, str]] = field(default_factory=dict)
    #: link -> the id of its server at this point of the reading
    server_ids: dict[int, str] = field(default_factory=dict)
    #: (index in handouts where it was taken, saved resume positions) of each C record
    checkpoints: list[tuple[int, Any]] = field(default_factory=list)
    #: link -> (server id, epoch, position) a P record said the dead predecessor of this
    #: rank handed out last (from its mark file)
    predecessor: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    #: the positions of R (load_state_dict), if any, and where in handouts it came
    resumed: Any = None
    resumed_at: int = 0
    closed: bool = False
    ended: bool = False
    torn: bool = False

    @property
    def rank(self) -> int | None:
        rank = self.header.get("rank")
        return None if rank is None else int(rank)

    @property
    def addresses(self) -> list[str]:
        return [str(address) for address in self.header.get("addresses", [])]

    @property
    def started(self) -> float:
        return float(self.header.get("time", 0.0))

    def describe(self) -> str:
        who = "free trainer" if self.rank is None else f"rank {self.rank}"
        return f"{who} {self.header.get('client_id', '?')} ({self.path}:{self.line})"

    def apply(self, text: str) -> None:
        """Add one checked record's meaning to this session (ValueError: malformed)."""
        kind, _, rest = text.partition(" ")
        if kind in ("H", "D"):
            message, link, epoch, runs, *keys = rest.split(" ", 4)
            server = self.server_ids.get(int(link), "")
            positions = _positions(runs)
            key_list = json.loads(keys[0]) if keys else None
            if key_list is not None and len(key_list) != len(positions):
                raise ValueError(f"{len(key_list)} keys for {len(positions)} positions")
            rows = self.handouts if kind == "H" else self.dealt
            rows.append(HandOutRecord(int(message), int(link), server, int(epoch), positions,
                                      key_list))
        elif kind == "S":
            link, server_id, size, world, uneven = rest.split(" ")
            self.server_ids[int(link)] = server_id
            self.servers[int(link)] = (None if size == "-" else int(size), int(world),
                                       "" if uneven == "-" else uneven)
        elif kind == "P":
            link, server_id, epoch, position = rest.split(" ")
            self.predecessor[int(link)] = (server_id, int(epoch), int(position))
        elif kind == "C":
            _, saved = rest.split(" ", 1)
            self.checkpoints.append((len(self.handouts), json.loads(saved)))
        elif kind == "R":
            self.resumed, self.resumed_at = json.loads(rest), len(self.handouts)
        elif kind == "Q":
            self.closed, self.ended = True, rest.strip() == "1"
        else:
            raise ValueError(f"unknown record kind {kind!r}")


def _checked(raw: bytes) -> str | None:
    """The text of a record whose CRC matches, else None (torn or damaged)."""
    if not raw.endswith(b"\n"):
        return None
    text, _, crc = raw[:-1].decode("utf-8", "replace").rpartition(" #")
    if not text or len(crc) != 8:
        return None
    try:
        if int(crc, 16) != zlib.crc32(text.encode()):
            return None
    except ValueError:
        return None
    return text


def _positions(runs: str) -> np.ndarray:
    parts = []
    for run in runs.split(","):
        start, count, step = (int(value) for value in run.split(":"))
        if count < 1:
            raise ValueError(f"a run of {count} positions")
        parts.append(start + step * np.arange(count, dtype=np.int64))
    return np.concatenate(parts)


def read_log(path: str | os.PathLike[str]) -> list[Session]:
    """The sessions of one audit log file; :class:`AuditLogError` if it is not one or is
    damaged anywhere but at a session's last record (a torn record: ``Session.torn``)."""
    try:
        lines = Path(path).read_bytes().splitlines(keepends=True)
    except OSError as error:
        raise AuditLogError(f"cannot read audit log {path}: {error}") from None
    # The lone line end is what the writer adds after a torn record before a new session.
    records = [(number, raw, _checked(raw)) for number, raw in enumerate(lines, 1)
               if raw != b"\n"]
    if not records or not records[0][1].startswith(MAGIC.encode()):
        raise AuditLogError(f"{path}: expected a feedmux audit log (a first line "
                            f"'{MAGIC} {VERSION} ...'), got "
                            f"{repr(records[0][1][:40]) if records else 'an empty file'}")
    sessions: list[Session] = []
    for index, (number, _, text) in enumerate(records):
        if text is None:
            following = records[index + 1][2] if index + 1 < len(records) else MAGIC + " "
            if following is None or not following.startswith(MAGIC + " "):
                raise AuditLogError(
                    f"{path}:{number}: a damaged record (its checksum does not match) followed "
                    f"by more records of the same session: only a session's last record can "
                    f"be torn")
            if sessions:
                sessions[-1].torn = True
            continue
        if text.startswith(MAGIC + " "):
            sessions.append(_session(path, number, text))
        elif not sessions:
            raise AuditLogError(f"{path}:{number}: a record before any session header")
        else:
            try:
                sessions[-1].apply(text)
            except (ValueError, TypeError) as error:  # json.JSONDecodeError is a ValueError
                raise AuditLogError(f"{path}:{number}: malformed {text[:1]!r} record: "
                                    f"{error}") from None
    return sessions


def _session(path: str | os.PathLike[str], number: int, text: str) -> Session:
    _, version, header = text.split(" ", 2)
    if version != str(VERSION):
        raise AuditLogError(f"{path}:{number}: expected audit log version {VERSION}, "
                            f"got {version}")
    try:
        parsed = json.loads(header)
    except json.JSONDecodeError as error:
        raise AuditLogError(f"{path}:{number}: malformed session header: {error}") from None
    if not isinstance(parsed, dict):
        raise AuditLogError(f"{path}:{number}: expected a session header object, got "
                            f"{type(parsed).__name__}")
    return Session(str(path), number, parsed)
