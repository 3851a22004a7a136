"""The soak's verdict: what the trainers' records say about lost and repeated samples.

Pure functions over the records the soak's trainers write (one line per
sample handed out, flushed at once so that a record survives a SIGKILL) and
the list of trainers the schedule SIGKILLed; no processes, no sockets. Free
trainers are checked per epoch across the whole job, a server restart
included (the restarted server continues the epochs of the one before, under
a new server id): every sample of every complete epoch once. The only
tolerance is the documented one of a SIGKILL: a trainer acknowledges what it
handed out from a thread, at each new message and every ~0.1 s within one, so
what it handed out in its last moments may be
handed out again by another, and the one sample it was handed but killed
before recording is missing from the records (it was handed out). Both are
counted apart, bounded per kill, and anything else fails. A ranked job is
checked against its uninterrupted run: rank ``r`` of ``n`` must take positions
``r, r + n, ...`` of every epoch, in order, across every restart from a
checkpoint, and a position always holds the same sample (a seeded run; with one
sampling process the id is the position, with several the workers' merge
order numbers them).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FreeVerdict", "RankedVerdict", "check_free", "check_ranked", "parse_lines"]

#: What a SIGKILLed trainer may have handed out unacknowledged (the rest of its message,
#: or the last ~0.15 s of its reading, a busy machine stretching them): its last this
#: many records may come again.
KILL_WINDOW = 1024


def parse_lines(lines: Iterable[str], fields: int) -> Iterator[list[str]]:
    """The complete records of ``lines`` (a line cut by a SIGKILL is left out), one at a
    time: a soak's file holds millions (a 36 s soak: 6 M records, which held as lists of
    strings took 3.5 GB).

    >>> list(parse_lines(["s 1 0 0 1 7", "s 1 1", ""], 6))
    [['s', '1', '0', '0', '1', '7']]
    """
    return (parts for line in lines if len(parts := line.split()) == fields)


@dataclass
class FreeVerdict:
    """What the free trainers' records say."""

    epochs: int = 0
    samples: int = 0
    missing: int = 0
    repeated: int = 0
    wrong: int = 0
    #: Explained by a SIGKILL (see the module's docstring), not failures.
    missing_at_kills: int = 0
    repeated_at_kills: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.epochs > 0 and not (self.missing or self.repeated or self.wrong)

    def line(self) -> str:
        return (f"free trainers: {self.epochs} complete epochs checked ({self.samples} "
                f"samples), {self.missing} ids missing, {self.repeated} repeated, {self.wrong} "
                f"wrong samples; at a SIGKILL's edge: {self.missing_at_kills} missing, "
                f"{self.repeated_at_kills} repeated")


def check_free(records: Iterable[Sequence[str]], killed: Iterable[str], items: int,
               stopped: Iterable[str] = ()) -> FreeVerdict:
    """Check ``records`` (``server_id epoch position id ok pid``, in file order) of an
    exhaustive source of ``items`` samples an epoch (a sample is wrong when its array
    is not its id, or when another id came at the same epoch and position);
    ``killed``: the pids of the trainers that were SIGKILLed; ``stopped``: of those
    still running when the run stopped.

    An epoch is complete when it comes before the last epoch of every trainer
    stopped at the end (what was dealt to one and not handed out lies after its
    last sample, and its server stopped with it) and before the last two epochs.

    The records are read once into typed arrays (21 bytes a record) and judged
    with numpy: ``make soak`` (10 minutes, 2 workers) handed out 22 M samples and
    peaked at 2.7 GB; the dicts and lists before took about 0.5 KB a record.

    >>> rows = [["s", "1", str(i), str(i), "1", "7"] for i in range(4)] * 2
    >>> rows += [["s", str(e), "0", "0", "1", "7"] for e in (2, 3)]
    >>> check_free(rows, [], 4).line()[:68]
    'free trainers: 1 complete epochs checked (8 samples), 0 ids missing,'
    >>> check_free(rows, [], 4).repeated
    4
    """
    table = _FreeRecords.read(records)
    verdict = FreeVerdict()
    if not table.size:
        return verdict
    epochs, positions, ids, pids, ok = table.columns()
    by_pid = table.by_pid(pids)
    killed_numbers = [table.pids[pid] for pid in set(killed) if pid in table.pids]
    ends = [int(epochs[by_pid.last[table.pids[pid]]]) for pid in stopped if pid in table.pids]
    complete = range(1, min([int(epochs.max()) - 1, *ends]))
    edges = {(int(epochs[last]), int(positions[last]) + 1)
             for last in by_pid.last[killed_numbers]}
    verdict.epochs = len(complete)

    verdict.wrong = _wrong(epochs, positions, ids, ok, complete)

    # Copies of each (complete epoch, position), and those at a SIGKILL's edge.
    counted = ((epochs >= complete.start) & (epochs < complete.stop) & (positions >= 0)
               & (positions < items))
    cells = len(complete) * items
    flat = (epochs[counted].astype(np.int64) - complete.start) * items + positions[counted]
    copies = np.bincount(flat, minlength=cells)
    near_end = by_pid.index >= by_pid.count[pids] - KILL_WINDOW
    at_kill_record = np.isin(pids, killed_numbers) & near_end
    at_kill = np.bincount(flat[at_kill_record[counted]], minlength=cells)
    del near_end, at_kill_record
    verdict.samples = int(copies.sum())
    extra = np.maximum(copies - 1, 0)
    explained = np.minimum(extra, at_kill)
    verdict.repeated_at_kills = int(explained.sum())
    verdict.repeated = int((extra - explained).sum())
    absent = np.flatnonzero(copies == 0)
    at_edges = [cell for cell in absent.tolist()
                if (complete.start + cell // items, cell % items) in edges]
    verdict.missing_at_kills = len(at_edges)
    verdict.missing = len(absent) - len(at_edges)
    unexplained = np.flatnonzero(extra > explained)
    for cell in sorted(set(absent.tolist()) - set(at_edges) | set(unexplained.tolist()))[:10]:
        epoch, position = complete.start + cell // items, cell % items
        if copies[cell] == 0:
            _example(verdict, f"epoch {epoch} position {position} missing")
        else:
            found = np.flatnonzero(counted)[flat == cell]
            names = [table.names[number] for number in pids[found].tolist()]
            _example(verdict, f"epoch {epoch} position {position} handed out "
                              f"{len(found)} times (pids {names})")
    return verdict


def _wrong(epochs: np.ndarray, positions: np.ndarray, ids: np.ndarray, ok: np.ndarray,
           complete: range) -> int:
    """Records not ok, or with another id than the first ok one at their (epoch,
    position) (a seeded run: a position always holds one sample), and in each complete
    epoch the ids that came at more than one position."""
    good = np.flatnonzero(ok)
    order = good[np.lexsort((positions[good], epochs[good]))]  # stable: file order in a key
    del good
    sorted_epochs, sorted_positions = epochs[order], positions[order]
    starts = np.flatnonzero(np.r_[True, (sorted_epochs[1:] != sorted_epochs[:-1])
                                  | (sorted_positions[1:] != sorted_positions[:-1])])
    del sorted_positions
    first_ids = ids[order[starts]]
    others = ids[order] != np.repeat(first_ids, np.diff(np.r_[starts, len(order)]))
    wrong = len(ids) - len(order) + int(others.sum())
    del others
    key_epochs = sorted_epochs[starts]
    del sorted_epochs
    inside = (key_epochs >= complete.start) & (key_epochs < complete.stop)
    if inside.any():  # an id at two positions of an epoch: (epoch, id) pairs come twice
        low, span = int(first_ids.min()), int(first_ids.max() - first_ids.min()) + 1
        pairs = key_epochs[inside].astype(np.int64) * span + (first_ids[inside] - low)
        wrong += len(pairs) - len(np.unique(pairs))
    return wrong


@dataclass
class _ByPid:
    """Each record's index among its trainer's, each trainer's count and last record."""

    index: np.ndarray
    count: np.ndarray
    last: np.ndarray


@dataclass
class _FreeRecords:
    """The free trainers' records as typed arrays (the server id is not kept: the epochs
    are the job's across a restart)."""

    epochs: array[int] = field(default_factory=lambda: array("i"))
    positions: array[int] = field(default_factory=lambda: array("i"))
    ids: array[int] = field(default_factory=lambda: array("q"))
    pid_numbers: array[int] = field(default_factory=lambda: array("i"))
    ok: array[int] = field(default_factory=lambda: array("b"))
    pids: dict[str, int] = field(default_factory=dict)  # pid -> its number
    names: list[str] = field(default_factory=list)  # number -> pid

    @classmethod
    def read(cls, records: Iterable[Sequence[str]]) -> _FreeRecords:
        table = cls()
        pids, names = table.pids, table.names
        for _, epoch, position, sample_id, ok, pid in records:
            table.epochs.append(int(epoch))
            table.positions.append(int(position))
            table.ids.append(int(sample_id))
            number = pids.get(pid)
            if number is None:
                number = pids[pid] = len(names)
                names.append(pid)
            table.pid_numbers.append(number)
            table.ok.append(ok == "1")
        return table

    @property
    def size(self) -> int:
        return len(self.epochs)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Epochs, positions, ids, pid numbers and ok flags: views, not copies."""
        return (np.frombuffer(self.epochs, dtype=np.int32),
                np.frombuffer(self.positions, dtype=np.int32),
                np.frombuffer(self.ids, dtype=np.int64),
                np.frombuffer(self.pid_numbers, dtype=np.int32),
                np.frombuffer(self.ok, dtype=np.int8).astype(bool))

    def by_pid(self, pids: np.ndarray) -> _ByPid:
        count = np.bincount(pids, minlength=len(self.names))
        order = np.argsort(pids, kind="stable")
        starts = np.cumsum(count) - count
        index = np.empty(len(pids), dtype=np.int64)
        index[order] = np.arange(len(pids)) - np.repeat(starts, count)
        return _ByPid(index=index, count=count, last=order[starts + count - 1])


@dataclass
class RankedVerdict:
    """What a ranked job's records say, rank by rank."""

    steps: list[int] = field(default_factory=list)
    resumes: int = 0
    mismatches: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and min(self.steps) > 0 and not self.mismatches

    def line(self) -> str:
        return (f"ranked job: {self.resumes} restarts from a checkpoint, steps per rank "
                f"{self.steps}, {self.mismatches} samples off the uninterrupted sequence")


def check_ranked(lives: Sequence[Sequence[tuple[int, Sequence[Sequence[str]]]]],
                 items: int) -> RankedVerdict:
    """Check a ranked job: per rank, its processes in order, each ``(resumed from step,
    records)`` (records ``step epoch position id ok``; step 0: a fresh start).
    Every epoch must hold each of the ``items`` ids once.

    What each rank consumed is its records up to each checkpoint the next process
    resumed from: it must be the uninterrupted sequence of its rank.

    >>> lives = [[(0, [["1", "1", "0", "0", "1"], ["2", "1", "2", "2", "1"]]),
    ...           (1, [["2", "1", "2", "2", "1"], ["3", "2", "0", "0", "1"]])],
    ...          [(0, [["1", "1", "1", "1", "1"], ["2", "1", "3", "3", "1"]])]]
    >>> check_ranked(lives, items=4).line()
    'ranked job: 1 restarts from a checkpoint, steps per rank [3, 2], 0 samples off the \
uninterrupted sequence'

    A process that started afresh (0) after another continues its predecessor's share:

    >>> again = [[(0, [["1", "1", "0", "0", "1"]]), (0, [["1", "1", "2", "2", "1"]])],
    ...          [(0, [["1", "1", "1", "1", "1"], ["2", "1", "3", "3", "1"]])]]
    >>> check_ranked(again, items=4).line()
    'ranked job: 1 restarts from a checkpoint, steps per rank [2, 2], 0 samples off the \
uninterrupted sequence'
    """
    world_size = len(lives)
    verdict = RankedVerdict()
    ids: dict[tuple[str, str], str] = {}  # (epoch, position) -> the id it had first
    per_rank = items // world_size
    for rank, processes in enumerate(lives):
        consumed: list[Sequence[str]] = []
        for resumed_from, records in processes:
            if resumed_from or consumed:
                verdict.resumes += rank == 0
            if resumed_from == 0 and consumed:
                # The job restarted before any checkpoint: a rank restarted without one
                # continues its predecessor's share (docs/ddp.md), its steps counted from
                # 1 again.
                records = [[str(len(consumed) + int(row[0])), *row[1:]] for row in records]
            else:
                del consumed[resumed_from:]
            consumed.extend(records)
        for step, row in enumerate(consumed, start=1):
            epoch, slot = divmod(step - 1, per_rank)
            expected = [str(step), str(epoch + 1), str(rank + slot * world_size)]
            same = ids.setdefault((row[1], row[2]), row[3]) == row[3]
            if list(row[:3]) != expected or not same or row[4] != "1":
                verdict.mismatches += 1
                if len(verdict.examples) < 10:
                    verdict.examples.append(f"rank {rank} step {step}: expected (step, epoch, "
                                            f"position) {expected}, got {list(row)}")
        verdict.steps.append(len(consumed))
    for epoch, twice in _ids_twice(ids).items():
        verdict.mismatches += twice
        verdict.examples.append(f"epoch {epoch}: {twice} ids at two positions")
    # Where each rank stands at the end is not checked: the soak's ranks do not step in
    # lockstep (no all-reduce), and each rank's sequence already holds its equal share.
    return verdict


def _ids_twice(ids: dict[tuple[Any, Any], str]) -> dict[Any, int]:
    """Per epoch, how many ids came at more than one position (an epoch holds each once)."""
    by_epoch: dict[Any, list[str]] = defaultdict(list)
    for (epoch, _), sample_id in ids.items():
        by_epoch[epoch].append(sample_id)
    return {epoch: len(found) - len(set(found)) for epoch, found in by_epoch.items()
            if len(found) != len(set(found))}


def _example(verdict: FreeVerdict, text: str) -> None:
    if len(verdict.examples) < 10:
        verdict.examples.append(text)
