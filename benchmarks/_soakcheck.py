"""The soak's verdict: what the trainers' records say about lost and repeated samples.

Pure functions over the records the soak's trainers write (one line per
sample handed out, flushed at once so that a record survives a SIGKILL) and
the list of trainers the schedule SIGKILLed; no processes, no sockets. Free
reliable trainers are checked per epoch across the whole job, a server restart
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

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    """What the free reliable trainers' records say."""

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
        return (f"reliable delivery: {self.epochs} complete epochs checked ({self.samples} "
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

    >>> rows = [["s", "1", str(i), str(i), "1", "7"] for i in range(4)] * 2
    >>> rows += [["s", str(e), "0", "0", "1", "7"] for e in (2, 3)]
    >>> check_free(rows, [], 4).line()[:72]
    'reliable delivery: 1 complete epochs checked (8 samples), 0 ids missing,'
    >>> check_free(rows, [], 4).repeated
    4
    """
    killed = set(killed)
    ids: dict[tuple[int, int], str] = {}  # a seeded run: one sample per (epoch, position)
    copies: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    tail: dict[str, list[tuple[int, int]]] = defaultdict(list)  # pid -> its (epoch, position)s
    verdict = FreeVerdict()
    last_epoch = 0
    pids: dict[str, str] = {}  # one string per trainer, not one per record
    for _, epoch_text, position_text, id_text, ok, pid_text in records:
        pid = pids.setdefault(pid_text, pid_text)
        key = (int(epoch_text), int(position_text))
        epoch = key[0]
        index = len(tail[pid])
        tail[pid].append(key)
        copies[key].append((pid, index))
        last_epoch = max(last_epoch, epoch)
        if ok != "1" or ids.setdefault(key, id_text) != id_text:
            verdict.wrong += 1
    ends = [tail[pid][-1][0] for pid in stopped if tail[pid]]
    complete = range(1, min([last_epoch - 1, *ends]))
    edges = {(epoch, position + 1) for pid in killed for epoch, position in tail[pid][-1:]}
    verdict.epochs = len(complete)
    twice = _ids_twice({key: value for key, value in ids.items() if key[0] in complete})
    verdict.wrong += sum(twice.values())
    for epoch in complete:
        for position in range(items):
            found = copies.get((epoch, position), [])
            verdict.samples += len(found)
            if not found:
                if (epoch, position) in edges:
                    verdict.missing_at_kills += 1
                else:
                    verdict.missing += 1
                    _example(verdict, f"epoch {epoch} position {position} missing")
                continue
            extra = len(found) - 1
            if not extra:
                continue
            at_kill = sum(1 for pid, index in found
                          if pid in killed and index >= len(tail[pid]) - KILL_WINDOW)
            explained = min(extra, at_kill)
            verdict.repeated_at_kills += explained
            verdict.repeated += extra - explained
            if extra > explained:
                _example(verdict, f"epoch {epoch} position {position} handed out "
                                  f"{len(found)} times (pids {[pid for pid, _ in found]})")
    return verdict


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
