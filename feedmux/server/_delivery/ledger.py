"""The ledger: data messages sent and not yet handed out, and what becomes of them.

:class:`Ledger` owns the messages a server keeps after sending them, in
*lanes*: a rank (ranked delivery: its messages, in order, whoever holds it) or
a free trainer (the messages it holds). Each message is
kept with the trainer it went to, its tags and the last ``(epoch, position)``
of it the trainer said it handed out (a hand-out mark); it leaves the ledger
once it was handed out whole (a mark at or past its last sample, or an
acknowledgement of its sequence number). What happens to the rest when its
trainer is gone is the ledger's :class:`Recovery` policy:

- :data:`Recovery.REDEAL` (free trainers): the lost trainer's
  messages, each cut right after its mark, go to a re-deal queue for the
  other trainers (:meth:`Ledger.lose`, :attr:`Ledger.redeal`), dealt before
  anything new and kept in the order of the samples, oldest epoch first;
- :data:`Recovery.REPLAY` (ranks): they stay in the rank's lane; the rank's
  next holder gets them first, cut after the rank's mark (:meth:`Ledger.take_over`).

A lane keeps at most ``limit`` messages: :meth:`Ledger.room` says when it is
full, and the sender waits for marks rather than forgetting a message nobody
handed out. It is pure (frames in, frames out; no socket, no clock) and must
never decide who holds a rank (the control core does) nor send anything (the
outbox does).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedmux.protocol import Data, decode, encode, position_runs, read_tags

__all__ = ["MAX_SUMMARY_RUNS", "Entry", "Ledger", "Recovery", "handed_below", "rest_after"]


def not_handed(tags: np.ndarray, mark: tuple[int, int]) -> np.ndarray:
    """Per row of a message's ``tags``: whether it comes after ``mark``, the (epoch,
    position) of the last row its trainer handed out.

    A trainer hands a message's rows out in the message's order, which is not the
    order of positions in a bucketed batch (its rows are a bucket's, in the bucket's
    order): when ``mark`` is a row of the message, the rows after that row are the rest.
    A mark from elsewhere (a rank's mark of an earlier message) cuts by position, as
    the sampler's order gives them.

    >>> tags = np.array([[3, 24], [3, 26], [3, 7], [3, 30]])  # a bucketed batch
    >>> not_handed(tags, (3, 26)).tolist()  # two handed out: 7 and 30 are the rest
    [False, False, True, True]
    >>> not_handed(tags, (2, 99)).tolist(), not_handed(tags, (3, 25)).tolist()
    ([True, True, True, True], [False, True, False, True])
    """
    rows = tags.tolist()
    marked = tuple(mark)
    for index, row in enumerate(rows):
        if tuple(row) == marked:
            return np.arange(len(rows)) > index
    return np.array([tuple(row) > marked for row in rows], dtype=bool)


def rest_after(frames: list[Any], mark: tuple[int, int]) -> tuple[np.ndarray, list[Any]] | None:
    """The tags and frames of the samples of a data message not handed out, its trainer
    having handed out up to ``mark`` (:func:`not_handed`).

    The message as it is when none was handed out, re-encoded when some were,
    None when all were.

    >>> from feedmux.protocol import Data, encode
    >>> frames = list(encode(Data(np.array([[1, 0], [1, 2]]), ["a", "b"])))
    >>> tags, rest = rest_after(frames, (1, 0))
    >>> tags.tolist(), rest_after(frames, (1, 2))
    ([[1, 2]], None)
    >>> bucketed = list(encode(Data(np.array([[1, 5], [1, 2]]), ["a", "b"])))
    >>> rest_after(bucketed, (1, 5))[0].tolist()  # 2 comes after 5 in this message
    [[1, 2]]
    """
    tags = read_tags(frames)
    rows = np.flatnonzero(not_handed(tags, mark)).tolist()
    if not rows:
        return None
    if len(rows) == len(tags):
        return tags, frames
    message = decode(frames)
    assert isinstance(message, Data)
    samples = list(message.samples)
    rest = tags[rows].copy()
    return rest, list(encode(Data(rest, [samples[i] for i in rows], message.server_id)))


class Recovery(enum.Enum):
    """What becomes of a gone trainer's messages it had not handed out."""

    REDEAL = "re-deal to the other trainers"
    REPLAY = "replay to the rank's successor"


@dataclass
class Entry:
    """One message kept: where it went, what it holds, how far it was handed out."""

    target: bytes  # the data-socket identity it went to
    frames: list[Any]
    #: Its tags, read from the frames when first needed (not on the hot path of a send).
    known_tags: np.ndarray | None = field(default=None, repr=False)
    seq: int = 0
    nbytes: int = 0
    #: The last (epoch, position) of it its trainer said it handed out, if any.
    mark: tuple[int, int] | None = None
    #: The batch shapes ``(batch_size, drop_last, bucket_by)`` its samples did not stack
    #: into: dealt again, it goes to no trainer of those (:mod:`.freebatches`).
    unbatchable: tuple[tuple[int, bool, str], ...] = ()
    #: Whether its samples are known to be as sampled (no bucketed batch's padding): dealt
    #: again, it may go to a trainer of single samples as it is.
    sampled: bool = False

    @property
    def tags(self) -> np.ndarray:
        if self.known_tags is None:
            self.known_tags = read_tags(self.frames)
        return self.known_tags

    @property
    def last(self) -> tuple[int, int]:
        return int(self.tags[-1, 0]), int(self.tags[-1, 1])

    @property
    def epoch(self) -> int:
        return int(self.tags[0, 0])

    def rest(self, mark: tuple[int, int] | None) -> Entry | None:
        """This message cut right after ``mark`` (None: all of it handed out)."""
        if mark is None:
            return self
        cut = rest_after(self.frames, mark)
        if cut is None:
            return None
        tags, frames = cut
        if frames is self.frames:
            return self
        return Entry(self.target, frames, tags, self.seq, _size(frames))


class Ledger:
    """Messages sent and not yet handed out, per lane, under one :class:`Recovery`.

    Examples
    --------
    >>> from feedmux.protocol import Data, encode
    >>> ledger = Ledger(Recovery.REPLAY, limit=8)
    >>> frames = list(encode(Data(np.array([[1, 0], [1, 2], [1, 4]]), ["a", "b", "c"])))
    >>> ledger.record(0, b"old", frames)
    1
    >>> ledger.record_mark(0, b"old", (1, 2))
    >>> ledger.owed(0, b"new")
    True
    >>> [entry.tags.tolist() for entry in ledger.take_over(0, b"new")]
    [[[1, 4]]]
    """

    def __init__(self, recovery: Recovery, limit: int = 1 << 30) -> None:
        self.recovery = recovery
        self.limit = limit
        self._lanes: dict[Hashable, dict[int, Entry]] = {}
        #: Each lane's latest mark (a rank's: its successor starts after it).
        self._marks: dict[Hashable, tuple[int, int]] = {}
        #: Lost trainers' rest, waiting to be dealt to the others (REDEAL), in the order
        #: of their first samples: (epoch, position).
        self.redeal: deque[Entry] = deque()
        self.next_seq = 1
        #: Messages a successor or another trainer was sent again.
        self.resent_messages = 0
        #: Bytes of the messages kept in the lanes (sent and not handed out).
        self.nbytes = 0

    # -- sending ----------------------------------------------------------------------------
    def room(self, lane: Hashable) -> bool:
        """Whether ``lane`` may be sent one more message (fewer than ``limit`` kept)."""
        return len(self._lanes.get(lane, ())) < self.limit

    def record(self, lane: Hashable, target: bytes, frames: list[Any],
               seq: int | None = None, tags: np.ndarray | None = None) -> int:
        """``frames`` went to ``target`` in ``lane``; returns its sequence number."""
        if seq is None:
            seq = self.next_seq
        self.next_seq = max(self.next_seq, seq + 1)
        entry = Entry(target, frames, tags, seq, _size(frames))
        self._lanes.setdefault(lane, {})[seq] = entry
        self.nbytes += entry.nbytes
        return seq

    def resent(self, lane: Hashable, entry: Entry, target: bytes, seq: int | None = None) -> int:
        """``entry`` (from :meth:`take_over` or the re-deal queue) went to ``target`` (as
        ``seq``; None: in its old place)."""
        self.resent_messages += 1
        return self.record(lane, target, entry.frames, entry.seq if seq is None else seq,
                           entry.known_tags)

    # -- what the trainers say --------------------------------------------------------------
    def acknowledge(self, lane: Hashable, seqs: Iterable[int]) -> None:
        """``lane``'s messages ``seqs`` were handed out whole."""
        entries = self._lanes.get(lane)
        for seq in seqs:
            entry = entries.pop(seq, None) if entries else None
            if entry is not None:
                self.nbytes -= entry.nbytes

    def acknowledge_before(self, lane: Hashable, target: bytes, seq: int) -> None:
        """``target`` is in its message ``seq`` of ``lane``: it handed out whole every
        message of the lane it was sent before that one (a trainer reads its socket in
        order, and sequence numbers grow in the order of the sends)."""
        entries = self._lanes.get(lane)
        if entries:
            self.acknowledge(lane, [earlier for earlier, entry in list(entries.items())
                                    if earlier < seq and entry.target == target])

    def record_mark(self, lane: Hashable, target: bytes, mark: tuple[int, int],
                    seqs: Iterable[int] | None = None) -> None:
        """``target`` handed out ``lane``'s messages up to and including ``mark``
        (only its messages ``seqs``, when given).

        Only what went to ``target`` counts: anyone can reach the control port,
        and a mark on another trainer's message would cut what its successor,
        or the others, get. A message handed out whole leaves the ledger.
        """
        entries = self._lanes.get(lane)
        if not entries or not any(entry.target == target for entry in entries.values()):
            return
        if mark > self._marks.get(lane, (0, -1)):
            self._marks[lane] = mark
        chosen = entries if seqs is None else {s: entries[s] for s in seqs if s in entries}
        done = []
        for seq, entry in chosen.items():
            if entry.target != target:
                continue
            if not not_handed(entry.tags, mark).any():
                done.append(seq)
            elif entry.mark is None or mark > entry.mark:
                entry.mark = mark
        self.acknowledge(lane, done)

    def mark_predecessors(self, lane: Hashable, successor: bytes,
                          mark: tuple[int, int]) -> bool:
        """``lane``'s new holder ``successor`` says its predecessors handed out up to
        ``mark`` (a rank's mark file, which a SIGKILL does not lose): recorded as their
        mark; whether any predecessor's message was kept to be cut there."""
        targets = {entry.target for entry in self._lanes.get(lane, {}).values()
                   if entry.target != successor}
        for target in targets:
            self.record_mark(lane, target, mark)
        return bool(targets)

    # -- recovery ---------------------------------------------------------------------------
    def lose(self, target: bytes) -> int:
        """``target`` is gone: its messages go where the policy says. Returns how many
        it held (kept for a successor, or queued for the others).

        The re-deal queue stays in the order of the samples, not of the losses: the
        trainers of a pass that end together (a DataLoader's workers, each holding some
        of the next epoch) return their messages one after the other, and a trainer is
        to get an epoch's messages before a later epoch's (its ``iter_epoch()`` ends at
        the first sample of a later epoch: what of the earlier one came after it would
        wait for another pass)."""
        if self.recovery is not Recovery.REDEAL:
            return sum(1 for entry in self.entries() if entry.target == target)
        entries = self._lanes.pop(target, {})
        self._marks.pop(target, None)
        rest = []
        for seq in sorted(entries):
            entry = entries[seq]
            self.nbytes -= entry.nbytes
            cut = entry.rest(entry.mark)  # exactly once: only what it had not handed out
            if cut is not None:
                rest.append(cut)
        queue = sorted([*rest, *self.redeal], key=_first_sample)
        self.redeal.clear()
        self.redeal.extend(queue)
        return len(rest)

    def next_redeal(self) -> Entry | None:
        """The first of the lost trainers' messages waiting for another trainer, taken."""
        if not self.redeal:
            return None
        return self.redeal.popleft()

    def redeal_later(self, entry: Entry) -> None:
        """``entry`` (from :meth:`next_redeal`) found nobody: first again."""
        self.redeal.appendleft(entry)

    def owed(self, lane: Hashable, target: bytes) -> bool:
        """Whether ``lane``'s new holder ``target`` must get its predecessors' rest first."""
        return any(entry.target != target for entry in self._lanes.get(lane, {}).values())

    def take_over(self, lane: Hashable, target: bytes) -> list[Entry]:
        """What ``lane``'s new holder ``target`` gets first: its predecessors' messages, in
        order, each cut right after the lane's mark (those handed out whole dropped).

        They leave the ledger: tell :meth:`resent` each one sent, and
        :meth:`put_back` those that could not be sent yet (still owed).
        """
        entries = self._lanes.get(lane, {})
        mark = self._marks.get(lane)
        rest = []
        for seq in sorted(entries):
            entry = entries[seq]
            if entry.target == target:
                continue  # already its own
            del entries[seq]
            self.nbytes -= entry.nbytes
            cut = entry.rest(mark)
            if cut is not None:
                rest.append(cut)
        return rest

    def put_back(self, lane: Hashable, entries: Iterable[Entry]) -> None:
        """``entries`` (taken by :meth:`take_over`) were not sent: kept, still owed."""
        lane_entries = self._lanes.setdefault(lane, {})
        for entry in entries:
            lane_entries[entry.seq] = entry
            self.nbytes += entry.nbytes

    # -- state ------------------------------------------------------------------------------
    def entries(self, lane: Hashable | None = None) -> Iterator[Entry]:
        """The messages kept (of ``lane``), oldest first per lane; read from the metrics
        thread too, hence copies first."""
        lanes = [self._lanes.get(lane, {})] if lane is not None else list(self._lanes.values())
        for entries in lanes:
            yield from list(entries.values())

    def held(self, target: bytes | None = None) -> int:
        """Messages kept (sent to ``target``), the re-deal queue's included when no target."""
        count = sum(1 for entry in self.entries() if target is None or entry.target == target)
        return count + (len(self.redeal) if target is None else 0)

    def count(self, lane: Hashable) -> int:
        """Messages kept in ``lane``."""
        return len(self._lanes.get(lane, ()))

    def holding(self, epoch: int) -> set[Hashable]:
        """The lanes that keep a message of ``epoch``."""
        return {lane for lane, entries in list(self._lanes.items())
                if any(entry.epoch == epoch for entry in list(entries.values()))}

    def queued(self, epoch: int) -> int:
        """Messages of ``epoch`` in the re-deal queue."""
        return sum(1 for entry in list(self.redeal) if entry.epoch == epoch)

    def outstanding(self) -> list[tuple[int, int, int]]:
        """``(epoch, start, end)`` runs of the positions sent and not handed out: the
        kept messages after their marks and the re-deal queue (what a summary of the
        hand-outs leaves out, see :func:`handed_below`)."""
        runs = []
        for entry in [*self.entries(), *list(self.redeal)]:
            tags = entry.tags
            if entry.mark is not None:
                tags = tags[not_handed(tags, entry.mark)]
            runs += position_runs(tags)
        return sorted(runs)

    def oldest_epoch(self) -> int | None:
        """The oldest epoch of a message kept or waiting to be re-dealt (None: none)."""
        epochs = [entry.epoch for entry in [*self.entries(), *list(self.redeal)]]
        return min(epochs) if epochs else None

    def mark(self, lane: Hashable) -> tuple[int, int] | None:
        """``lane``'s latest hand-out mark (None: none yet)."""
        return self._marks.get(lane)

    def lanes(self) -> list[Hashable]:
        return [lane for lane, entries in list(self._lanes.items()) if entries]


#: Most outstanding runs a summary of the hand-outs lists (past that, neighbours merge).
MAX_SUMMARY_RUNS = 1024


def handed_below(newest: tuple[int, int] | None,
                 outstanding: list[tuple[int, int, int]]) -> tuple[int, ...]:
    """The summary a server tells its free trainers (``Heartbeat.handed_below``):
    ``(epoch, position, e, start, end, ...)``, every sample before ``newest`` (the
    position after the newest one sent) handed out but the ``outstanding`` runs.

    Past :data:`MAX_SUMMARY_RUNS` runs, neighbours of an epoch merge (the positions
    between count as not handed out: a restarted server deals them again rather
    than lose one). Empty before anything was sent.

    >>> handed_below((2, 40), [(2, 8, 16), (2, 24, 32)])
    (2, 40, 2, 8, 16, 2, 24, 32)
    >>> handed_below(None, [])
    ()
    """
    if newest is None:
        return ()
    runs = sorted(outstanding)
    while len(runs) > MAX_SUMMARY_RUNS:
        merged: list[tuple[int, int, int]] = []
        fresh = False  # whether merged[-1] is a run of this pass, not a merge
        for run in runs:
            if fresh and merged[-1][0] == run[0]:
                merged[-1] = (run[0], merged[-1][1], run[2])
                fresh = False
            else:
                merged.append(run)
                fresh = True
        if len(merged) == len(runs):  # one run per epoch left: nothing to merge
            break
        runs = merged
    return (*newest, *(value for run in runs for value in run))


def _first_sample(entry: Entry) -> tuple[int, int]:
    """``(epoch, position)`` of the first sample of ``entry``."""
    return int(entry.tags[0, 0]), int(entry.tags[0, 1])


def _size(frames: list[Any]) -> int:
    """Bytes in ``frames`` (bytes, memoryviews of any item size, zmq Frames)."""
    return sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)
