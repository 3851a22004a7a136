"""Resuming a ranked job where its checkpoint left it: the positions its ranks announce.

A ranked trainer restored from a checkpoint (or one that outlived its server)
says in its hello where its job stands: ``(epoch, position, world_size,
kind)``, the next round of ``epoch`` it needs (a global position), the world
size the job had when it got there, and whether it comes from a checkpoint or
from a live rank whose server restarted. This module owns the rules over those
announcements: what a well-formed one is, and the one position every rank of
the new job must agree on before anything is dealt. It is pure (no sockets,
no clock) and must never decide who holds a rank (the rank table does) or how
the sampler gets there (``EpochIterator.resume_at`` and
``RankDealer.resume`` do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from feedmux.protocol import RESUME_CHECKPOINT, RESUME_LIVE, Hello
from feedmux.server._delivery.ranking import describe, not_whole

__all__ = ["CHECKPOINT", "LIVE", "MAX_HANDED_RANGES", "Handed", "Start",
           "agreed_start", "check_announcement", "describe", "not_whole"]

CHECKPOINT, LIVE = RESUME_CHECKPOINT, RESUME_LIVE

#: Most hand-out ranges a restarted server keeps from the hellos of the free trainers that
#: outlived their server (each reports its last 32 messages' ranges).
MAX_HANDED_RANGES = 1 << 16


def check_announcement(resume: Sequence[int]) -> str | None:
    """Why ``resume`` (a hello's field) is not a position to resume at, or None.

    Examples
    --------
    >>> check_announcement((2, 40, 2, CHECKPOINT)) is None, check_announcement(())
    (True, None)
    >>> check_announcement((0, 5, 2, LIVE))
    'expected resume (epoch >= 1, position >= 0, world_size >= 1, 0 or 1), got (0, 5, 2, 0)'
    """
    if not resume:
        return None
    if (len(resume) == 4 and resume[0] >= 1 and resume[1] >= 0 and resume[2] >= 1
            and resume[3] in (LIVE, CHECKPOINT)):
        return None
    return (f"expected resume (epoch >= 1, position >= 0, world_size >= 1, 0 or 1), "
            f"got {tuple(resume)}")


class Start(NamedTuple):
    """Where the ranks of a job agree to start: ``at`` (epoch, position) or None for the
    beginning, and for each rank that is further on, where it is (its rounds before are
    not dealt to it again)."""

    at: tuple[int, int] | None
    ahead: dict[int, tuple[int, int]]


def agreed_start(resumes: Mapping[int, Sequence[int]],
                 world_size: int) -> tuple[Start | None, str]:
    """Where the ranks of a job of ``world_size`` start: ``(Start, "")``, or
    ``(None, why)`` when their announcements do not fit together.

    ``resumes`` maps each rank to its announcement (empty: none). Restored from
    a checkpoint, every rank must announce the same position (the job resumes
    there; a position is global, so a job of another world size can take it
    over). Live ranks that outlived their server announce where each is (they
    differ by the steps a rank ran ahead): the job starts at the earliest, and
    a rank further on gets nothing it already had. A rank that announces
    nothing among live ones has had nothing: it starts at the beginning.

    Examples
    --------
    >>> agreed_start({0: (2, 40, 2, CHECKPOINT), 1: (2, 40, 2, CHECKPOINT)}, 3)
    (Start(at=(2, 40), ahead={}), '')
    >>> agreed_start({0: (), 1: ()}, 2)
    (Start(at=None, ahead={}), '')
    >>> agreed_start({0: (2, 44, 2, LIVE), 1: (2, 40, 2, LIVE)}, 2)
    (Start(at=(2, 40), ahead={0: (2, 44)}), '')
    >>> agreed_start({0: (2, 40, 2, CHECKPOINT), 1: (2, 42, 2, CHECKPOINT)}, 2)[1]
    'the ranks announce different positions: rank 0: a checkpoint at epoch 2, position 40 \
(taken with 2 ranks); rank 1: a checkpoint at epoch 2, position 42 (taken with 2 ranks); \
expected the same checkpoint from every rank (each loads the state saved at the same step)'
    """
    kinds = {resume[3] for resume in resumes.values() if resume}
    if not kinds:
        return Start(None, {}), ""
    if kinds == {LIVE}:
        where = {rank: (resume[0], resume[1]) if resume else (1, 0)
                 for rank, resume in resumes.items()}
        sizes = {resume[2] for resume in resumes.values() if resume}
        if sizes == {world_size}:
            first = min(where.values())
            return Start(first, {rank: at for rank, at in where.items() if at > first}), ""
    elif len({tuple(resume) for resume in resumes.values()}) == 1:
        epoch, position = next(iter(resumes.values()))[:2]
        return Start((epoch, position), {}), ""
    said = "; ".join(f"rank {rank}: {describe(resumes[rank])}" for rank in sorted(resumes))
    return None, (f"the ranks announce different positions: {said}; expected the same "
                  f"checkpoint from every rank (each loads the state saved at the same step)")


class Handed:
    """What free trainers that outlived their server say was handed out.

    Built from their hellos: ``handed``, each trainer's own latest hand-outs
    (``(epoch, start, end)`` triples in the order it handed them out, its
    latest last), and ``handed_below``, the old server's last summary that
    trainer read of what every trainer had handed out (every sample before
    ``(epoch, position)`` but some runs), less what it handed out since.

    :attr:`start` is where the restarted server resumes and :meth:`fresh` says
    which positions from there it deals again. A position is not dealt again
    when a trainer reported it, or when a summary covers it and does not list
    it. Positions past every summary and before the earliest of the trainers'
    latest hand-outs count as handed out (a server deals in position order:
    what a live trainer had not handed out was dealt after its latest sample).
    So what is dealt again is what the summaries list and nobody reported (in
    flight when the server died, or held by a trainer that left: positions
    below the live trainers' latest hand-outs that nobody else reports), and
    what comes after the earliest latest hand-out that nobody reported.
    Ranges reported later (a trainer whose hello came after the start,
    :meth:`add`) are kept out too, as far as dealing has not passed them.

    ``scattered`` are ``(report, summary)`` of trainers whose hand-outs do not
    follow the positions (a free trainer's buckets: its shape's window held rows
    below its latest batch): their ranges are kept out as any report, but their
    latest hand-out is no frontier past the summary they read (without one: past
    the first run they report), since what the window held that no summary
    listed came after that summary.

    Examples
    --------
    >>> import numpy as np
    >>> handed = Handed([(2, 8, 12, 2, 16, 20), (2, 12, 14, 3, 0, 4)])
    >>> handed.start
    (2, 20)
    >>> handed.fresh(2, np.arange(18, 22)).tolist()
    [False, False, True, True]
    >>> handed.fresh(3, np.arange(0, 6)).tolist(), handed.fresh(4, np.arange(2)) is None
    ([False, False, False, False, True, True], True)
    >>> Handed([(5, 0, 40, 6, 0, 10), (6, 10, 20)]).start  # the latest of each: 6:10, 6:20
    (6, 20)
    >>> # 4 .. 7 were held by a trainer that left: the summary lists them, nobody reports them
    >>> handed = Handed([(2, 12, 16), (2, 16, 20)], [(2, 16, 2, 4, 8, 2, 12, 16)])
    >>> positions = np.arange(2, 24)
    >>> handed.start, positions[handed.fresh(2, positions)].tolist()
    ((2, 4), [4, 5, 6, 7, 20, 21, 22, 23])
    >>> # a bucketing trainer handed out 30 .. 31 last, read a summary covering up to 2:16
    >>> handed = Handed([(2, 24, 40)], [(2, 16)], scattered=[((2, 30, 32), (2, 16))])
    >>> handed.start, positions[handed.fresh(2, positions)].tolist()
    ((2, 16), [16, 17, 18, 19, 20, 21, 22, 23])
    """

    def __init__(self, reports: Iterable[Sequence[int]],
                 summaries: Iterable[Sequence[int]] = (),
                 scattered: Iterable[tuple[Sequence[int], Sequence[int]]] = ()) -> None:
        self.ranges: dict[int, list[tuple[int, int]]] = {}
        self._count = 0
        latest: list[tuple[int, int]] = []
        for report in reports:
            triples = self.add(report)
            if triples:
                epoch, _, end = triples[-1]
                latest.append((epoch, end))
        for report, summary in scattered:
            triples = self.add(report)
            if triples:
                epoch, _, end = triples[-1]
                frontier = ((int(summary[0]), int(summary[1])) if len(summary) >= 2
                            else min((e, start) for e, start, _ in triples))
                latest.append(min((epoch, end), frontier))
        #: Each summary: (epoch, position) it covers up to, and its runs not handed out.
        self.summaries: list[tuple[tuple[int, int], list[tuple[int, int, int]]]] = []
        for summary in summaries:
            self._add_summary(summary)
        self.start: tuple[int, int] | None = None
        #: Before this, only what a summary lists is dealt again.
        self._after: tuple[int, int] | None = None
        if latest:
            epoch, position = min(latest)
            for start, end in sorted(self.ranges[epoch]):
                if start <= position < end:
                    position = end
            self._after = (epoch, position)
        elif self.summaries:
            self._after = max(covered for covered, _ in self.summaries)
        listed = [(epoch, start) for _, runs in self.summaries for epoch, start, _ in runs]
        if self._after is not None:
            self.start = min([self._after, *listed])

    def _add_summary(self, summary: Sequence[int]) -> None:
        if len(summary) < 2 or len(summary) % 3 != 2:
            return
        runs = [(int(summary[index]), int(summary[index + 1]), int(summary[index + 2]))
                for index in range(2, len(summary), 3)]
        if self._count + len(runs) + 1 > MAX_HANDED_RANGES:
            return
        self._count += len(runs) + 1
        self.summaries.append(((int(summary[0]), int(summary[1])), runs))

    def add(self, report: Sequence[int]) -> list[tuple[int, int, int]]:
        """Take one trainer's ``(epoch, start, end, ...)`` triples; returns them.

        At most :data:`MAX_HANDED_RANGES` ranges are kept in all (hellos come from
        anyone who can reach the control port); a report past that is ignored.
        """
        triples = [(int(report[index]), int(report[index + 1]), int(report[index + 2]))
                   for index in range(0, len(report) - 2, 3)]
        if self._count + len(triples) > MAX_HANDED_RANGES:
            return []
        self._count += len(triples)
        for epoch, start, end in triples:
            self.ranges.setdefault(epoch, []).append((start, end))
        return triples

    def heard(self, hello: Hello) -> tuple[int, ...]:
        """A trainer's hello: the ranges a free trainer that
        outlived its server reports are kept out from now on (a hello that comes after
        dealing started); returns them (``hello.handed``).

        Before dealing starts this object is replaced by one built from every
        trainer's report, so only late hellos matter (their summaries are not
        taken: dealing went on). They count only in a run that resumed from
        reports (:attr:`start` set): a run that started afresh at epoch 1 is no
        continuation of the one the late trainer reports on, and its epochs of
        the same numbers are other samples (it kept every reported position out
        of them: whole epochs of the new run lost). A ranked trainer's hello adds
        nothing (anyone can reach the control port).
        """
        if hello.handed and hello.rank < 0 and self.start is not None:
            self.add(hello.handed)
        return hello.handed

    def fresh(self, epoch: int, positions: np.ndarray) -> np.ndarray | None:
        """Which of ``positions`` (of ``epoch``) nobody handed out; None: all of them."""
        ranges = self.ranges.get(epoch)
        after = self._after
        first = (epoch, int(positions[0]) if len(positions) else 0)
        covering = [(covered, runs) for covered, runs in self.summaries if first < covered]
        if not ranges and not covering and (not self.summaries or after is None
                                             or first >= after):
            return None
        kept = np.ones(len(positions), dtype=bool)
        for start, end in list(ranges or ()):
            kept &= (positions < start) | (positions >= end)
        if self.summaries and after is not None and epoch <= after[0]:
            # before the earliest latest hand-out: dealt again only where a summary lists it
            kept &= positions >= (after[1] if epoch == after[0] else np.iinfo(np.int64).max)
        listed = np.zeros(len(positions), dtype=bool)
        said = np.zeros(len(positions), dtype=bool)  # covered by a summary that does not list it
        for covered, runs in covering:
            inside = (np.ones(len(positions), dtype=bool) if epoch < covered[0]
                      else positions < covered[1])
            mine = np.zeros(len(positions), dtype=bool)
            for run_epoch, start, end in runs:
                if run_epoch == epoch:
                    mine |= (positions >= start) & (positions < end)
            listed |= inside & mine
            said |= inside & ~mine
        if covering:
            kept = (kept | listed) & ~said
            for start, end in list(ranges or ()):
                kept &= (positions < start) | (positions >= end)
        return kept
