"""``feedmux audit``: what a job's loaders handed out, checked per epoch across its restarts.

This module owns the judgement over audit logs (:mod:`feedmux._auditlog`
reads them): which hand-outs count, and what was missing or repeated in each
epoch of each server. A server is named by its address as the loaders were
given it (a restarted server that continues its epochs is the same stream; one
that began its epochs again for its free trainers — epoch 1 again, positions
the run had handed out already — began a new *run*, audited as a stream of its
own, ``ADDRESS run N``).
For the ranks of a job, each rank's sessions (one per process) are taken in
order; a session followed by one that resumed from a checkpoint
(``load_state_dict``) counts only up to that checkpoint's position: what it
handed out after it, before it died, the job trained on again and is not a
repeat. A rank's log writes how far it got in its current message lazily, so
a rank killed between two writes lacks its last hand-outs there; its D
record says which samples that message held, and those below the checkpoint
the next session resumed from count as handed out (the job's checkpoint says
every rank was past them; the log can neither confirm nor contradict it). A
rank that had not even been dealt its samples before that checkpoint still
shows up as missing samples. A rank restarted alone on the same host read how
far its killed predecessor got from the predecessor's mark file, and its log
says so (a P record): the predecessor's unwritten samples up to there count as
handed out. The concatenation is the rank's *effective* sequence, which can be
compared with that of an uninterrupted run (``--reference``). Free trainers'
hand-outs count as they are; a free trainer that died may have handed out
samples it could not tell the server about, which the server then dealt
again: repeats within the last ``hwm`` messages of a session that did not
close are reported as re-dealt, not as problems. An epoch of which nothing at
all was handed out is missing whole: between the first and the last epoch
handed out, and, when the caller says the server served N epochs and the job
is over (``epochs=``), up to N, each of them complete. Every rank of a job
must take the same number of steps in each epoch (a DDP job with unequal steps
hangs). It is pure (sessions in, a report out) and never opens a socket.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedmux._auditlog import AuditLogError, HandOutRecord, Session, read_log

__all__ = ["AuditReport", "EpochReport", "audit", "load_sessions"]

#: Missing or repeated positions listed per epoch (the rest are counted).
SHOWN = 10

#: One hand-out as the checks see it: epoch, position, key (None without keys).
Step = tuple[int, int, Any]


@dataclass
class EpochReport:
    """One epoch of one stream: what was handed out and what was wrong with it."""

    stream: str
    epoch: int
    size: int | None
    hand_outs: int = 0
    missing: list[int] = field(default_factory=list)
    repeated: dict[int, int] = field(default_factory=dict)  # position -> times handed out
    redealt: int = 0  # repeats explained by a trainer that died before telling the server
    dropped: int = 0  # the last partial round of a ranked epoch with uneven="drop"
    padded: int = 0  # positions past the epoch's end (a ranked epoch's padding)
    open: bool = False  # the job stopped in it (or its size is unknown): missing not counted

    @property
    def ok(self) -> bool:
        return not self.repeated and (self.open or not self.missing)

    def describe(self) -> str:
        size = "size unknown" if self.size is None else f"{self.size} samples"
        parts = [f"{self.hand_outs} handed out"]
        if self.padded:
            parts.append(f"{self.padded} padding")
        if self.redealt:
            parts.append(f"{self.redealt} re-dealt after a trainer died")
        if self.dropped:
            parts.append(f"{self.dropped} dropped (uneven='drop')")
        if self.missing:
            parts.append(f"{len(self.missing)} missing {_listed(self.missing)}"
                         + (" (not counted: open)" if self.open else ""))
        if self.repeated:
            shown = sorted(self.repeated)[:SHOWN]
            parts.append(f"{len(self.repeated)} repeated ["
                         + ", ".join(f"{p} x{self.repeated[p]}" for p in shown)
                         + (", ..." if len(self.repeated) > SHOWN else "") + "]")
        state = "open (the job stopped in it)" if self.open else "ok" if self.ok else "PROBLEM"
        return f"  epoch {self.epoch} ({size}): {', '.join(parts)}: {state}"


@dataclass
class AuditReport:
    """The whole audit: every epoch, the notes on each rank, the problems found."""

    sessions: int = 0
    torn: int = 0
    epochs: list[EpochReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: (stream, rank) -> the rank's effective sequence (ranked streams only)
    sequences: dict[tuple[str, int], list[Step]] = field(default_factory=dict)
    #: (stream, step) handed out after a checkpoint that a later session resumed from
    replayed: list[tuple[str, Step]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(epoch.ok for epoch in self.epochs)

    @property
    def checked(self) -> int:
        """Hand-outs in epochs that were checked (not open)."""
        return sum(epoch.hand_outs for epoch in self.epochs if not epoch.open)

    def text(self) -> str:
        lines = [f"{self.sessions} session(s)"
                 + (f", {self.torn} ending in a torn record" if self.torn else "")]
        stream = None
        for epoch in self.epochs:
            if epoch.stream != stream:
                stream = epoch.stream
                lines.append(f"stream {stream}:")
            lines.append(epoch.describe())
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"PROBLEM: {problem}" for problem in self.problems]
        bad = sum(not epoch.ok for epoch in self.epochs)
        closed = sum(not epoch.open for epoch in self.epochs)
        lines.append(f"{closed} complete epoch(s) checked, {self.checked} hand-outs, "
                     f"{bad} epoch(s) with problems, {len(self.problems)} other problem(s): "
                     + ("ok" if self.ok else "PROBLEMS"))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """The report as ``--json`` prints it (its keys stay: scripts read them)."""
        return {
            "ok": self.ok, "sessions": self.sessions, "torn": self.torn,
            "checked": self.checked, "notes": self.notes, "problems": self.problems,
            "epochs": [{"stream": e.stream, "epoch": e.epoch, "size": e.size,
                        "handed": e.hand_outs, "missing": e.missing,
                        "repeated": {str(p): n for p, n in e.repeated.items()},
                        "redealt": e.redealt, "dropped": e.dropped, "padded": e.padded,
                        "open": e.open, "ok": e.ok} for e in self.epochs],
        }


def _listed(values: Sequence[int]) -> str:
    shown = ", ".join(str(value) for value in values[:SHOWN])
    return f"[{shown}{', ...' if len(values) > SHOWN else ''}]"


def load_sessions(paths: Iterable[str]) -> list[Session]:
    """Every session of every log in ``paths`` (AuditLogError: a file that is not one)."""
    sessions = [session for path in paths for session in read_log(path)]
    if not sessions:
        raise AuditLogError("expected at least one audit log with a session, got none")
    return sessions


# -- streams and their parts --------------------------------------------------------------------
@dataclass
class _Part:
    """The hand-outs of one session on one stream, in order."""

    session: Session
    link: int
    handouts: list[HandOutRecord]
    #: False for a session's part in a run that a later run of the same server followed:
    #: how the session ended says nothing of that run
    last_run: bool = True
    #: True for every part of a run that a new run of its server followed: what was in
    #: flight when it was cut (every trainer's credit) was never to be handed out
    superseded: bool = False

    def steps(self) -> list[Step]:
        steps: list[Step] = []
        for handout in self.handouts:
            keys = handout.keys or [None] * len(handout.positions)
            steps += zip([handout.epoch] * len(keys), handout.positions.tolist(), keys,
                         strict=True)
        return steps

    def unwritten(self) -> list[Step]:
        """The rows of a killed rank's last message (if it came from this link) that its
        log does not say were handed out: the rank may have handed them out after its
        last write. Nothing for a session that closed (its close wrote how far it got)."""
        session = self.session
        if session.closed or not session.dealt or session.dealt[-1].link != self.link:
            return []
        last = session.dealt[-1]
        written = sum(len(handout.positions) for handout in self.handouts
                      if handout.message == last.message)
        keys = last.keys or [None] * len(last.positions)
        return list(zip([last.epoch] * (len(keys) - written), last.positions[written:].tolist(),
                        keys[written:], strict=True))


def _stream_name(session: Session, link: int) -> str:
    group = session.header.get("group")
    address = session.addresses[link] if link < len(session.addresses) else f"link {link}"
    return address if not group else f"{address} group {group}"


def _streams(sessions: Sequence[Session]) -> dict[str, list[_Part]]:
    streams: dict[str, list[_Part]] = defaultdict(list)
    for session in sessions:
        by_link: dict[int, list[HandOutRecord]] = defaultdict(list)
        for handout in session.handouts:
            by_link[handout.link].append(handout)
        for link in range(max(len(session.addresses), 1 + max(by_link, default=-1))):
            streams[_stream_name(session, link)].append(_Part(session, link, by_link[link]))
    for name, parts in streams.items():
        if len({part.session.rank is None for part in parts}) > 1:
            raise AuditLogError(f"stream {name}: expected the logs of one kind of trainer, "
                                f"got ranked and free trainers on the same server")
    split: dict[str, list[_Part]] = {}
    for name, parts in streams.items():
        split.update(_runs(name, parts) if parts[0].session.rank is None else {name: parts})
    return split


def _server_order(parts: Sequence[_Part]) -> list[str]:
    """The server ids of a stream in the order they served: each session saw its servers
    one after the other; sessions that share none are ordered by when they started."""
    follows: dict[str, set[str]] = defaultdict(set)
    first: dict[str, float] = {}
    for part in sorted(parts, key=lambda part: part.session.started):
        seen: list[str] = []
        for handout in part.handouts:
            if handout.server_id not in seen:
                seen.append(handout.server_id)
                first.setdefault(handout.server_id, part.session.started)
        for before, after in itertools.pairwise(seen):
            follows[after].add(before)
    order: list[str] = []
    waiting = sorted(first, key=lambda server: first[server])
    while waiting:
        ready = next((server for server in waiting if follows[server] <= set(order)),
                     waiting[0])  # a cycle (clock skew): the earliest
        order.append(ready)
        waiting.remove(ready)
    return order


def _runs(name: str, parts: list[_Part]) -> dict[str, list[_Part]]:
    """A free stream split into runs: a server that began its epochs again starts a new
    run, whose epochs are not those of the run before (``NAME run 2``, ...). It began
    again when it handed out epoch 1 and most of what it handed out in the epochs the
    run had reached was handed out there already, or most of what the run had handed out
    there (a run cut after a message or two); a server that continues the run deals in
    them only what nobody handed out (samples in flight when its predecessor died)."""
    handed: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for part in parts:
        for handout in part.handouts:
            handed[handout.server_id].update(
                (handout.epoch, position) for position in handout.positions.tolist())
    run_of: dict[str, int] = {}
    run, seen = 1, set[tuple[int, int]]()
    for server in _server_order(parts):
        latest = max((epoch for epoch, _ in seen), default=0)
        again = [step for step in handed[server] if step[0] <= latest]
        before = sum(step[0] <= latest for step in seen)
        if (seen and min(handed[server])[0] == 1
                and 2 * len(seen.intersection(again)) > min(len(again), before)):
            run, seen = run + 1, set()
        run_of[server] = run
        seen |= handed[server]
    if run == 1:
        return {name: parts}
    runs: dict[str, list[_Part]] = defaultdict(list)
    for part in parts:
        by_run: dict[int, list[HandOutRecord]] = defaultdict(list)
        for handout in part.handouts:
            by_run[run_of[handout.server_id]].append(handout)
        for number, handouts in by_run.items():
            runs[name if number == 1 else f"{name} run {number}"].append(
                _Part(part.session, part.link, handouts, number == max(by_run), number < run))
    return runs


def _server_facts(parts: Sequence[_Part]) -> tuple[int | None, int, str]:
    """The latest epoch size, world size and uneven mode any session heard of the stream."""
    facts: tuple[int | None, int, str] = (None, 0, "")
    for part in sorted(parts, key=lambda part: part.session.started):
        said = part.session.servers.get(part.link)
        if said is not None:
            facts = (said[0] if said[0] is not None else facts[0], said[1], said[2])
    return facts


def _position(saved: Any, session: Session, address: str) -> tuple[int, int] | None:
    """The (epoch, position) on ``address`` of a state ``session`` saved or loaded."""
    resume = saved.get("resume") if isinstance(saved, dict) else None
    if not isinstance(resume, list) or address not in session.addresses:
        return None
    index = session.addresses.index(address)
    where = resume[index] if index < len(resume) else None
    return None if where is None else (int(where[0]), int(where[1]))


def _predecessor(session: Session, address: str) -> tuple[str, int, int] | None:
    """What ``session``'s dead predecessor handed out last on ``address`` (its P record)."""
    if address not in session.addresses:
        return None
    return session.predecessor.get(session.addresses.index(address))


def _resume_at(session: Session, address: str) -> tuple[int, int] | None:
    """The (epoch, position) ``session`` was resumed at on ``address``, if it was."""
    return _position(session.resumed, session, address)


# -- ranked streams ----------------------------------------------------------------------------
def _ranked(name: str, parts: list[_Part], report: AuditReport) -> list[Step]:
    """Each rank's effective sequence into ``report``; every counted step (all ranks)."""
    address = name.split(" group ", 1)[0]
    checkpoints = {_position(saved, part.session, address)
                   for part in parts for _, saved in part.session.checkpoints}
    by_rank: dict[int, list[_Part]] = defaultdict(list)
    for part in parts:
        assert part.session.rank is not None
        by_rank[part.session.rank].append(part)
    counted: list[Step] = []
    for rank, rank_parts in sorted(by_rank.items()):
        rank_parts.sort(key=lambda part: part.session.started)
        sequence: list[Step] = []
        after = 0
        for index, part in enumerate(rank_parts):
            steps = part.steps()
            following = rank_parts[index + 1].session if index + 1 < len(rank_parts) else None
            cut = None if following is None else _resume_at(following, address)
            if cut is not None:
                unwritten = part.unwritten()
                behind = sum((step[0], step[1]) < cut for step in unwritten)
                if behind:
                    report.notes.append(
                        f"{name} rank {rank}: {part.session.describe()} died before it "
                        f"wrote that it handed out {behind} sample(s) of its last message, "
                        f"below the checkpoint the next session resumed from: counted")
                steps += unwritten
                kept = [step for step in steps if (step[0], step[1]) < cut]
                after += len(steps) - len(kept)
                report.replayed.extend((name, step) for step in steps[len(kept):])
                steps = kept
                if cut not in checkpoints and following is not None:
                    report.notes.append(f"{name} rank {rank}: {following.describe()} resumed "
                                        f"at epoch {cut[0]} position {cut[1]}, a checkpoint "
                                        f"none of these logs recorded")
            elif following is not None and (said := _predecessor(following, address)):
                # Restarted alone on this host: the successor read how far this session got
                # from its mark file (a store per hand-out), past what its log had written.
                unwritten = [step for step in part.unwritten()
                             if (step[0], step[1]) <= said[1:] and part.session.dealt
                             and part.session.dealt[-1].server_id == said[0]]
                if unwritten:
                    report.notes.append(
                        f"{name} rank {rank}: {part.session.describe()} died before it wrote "
                        f"that it handed out {len(unwritten)} sample(s) of its last message, "
                        f"which its mark file said (its successor's P record): counted")
                steps += unwritten
            sequence += steps
        resumes = sum(_resume_at(part.session, address) is not None for part in rank_parts)
        report.notes.append(f"{name} rank {rank}: {len(rank_parts)} session(s), {resumes} "
                            f"resumed from a checkpoint, {len(sequence)} hand-outs counted"
                            + (f", {after} handed out after a checkpoint the next session "
                               f"resumed from (not counted)" if after else ""))
        report.sequences[(name, rank)] = sequence
        counted += sequence
    return counted


def _closed_ranked(parts: list[_Part], epoch: int) -> bool:
    """Every rank's last session handed out something later than ``epoch``, or ended."""
    last: dict[int, _Part] = {}
    for part in parts:
        assert part.session.rank is not None
        current = last.get(part.session.rank)
        if current is None or part.session.started > current.session.started:
            last[part.session.rank] = part
    return all(part.session.ended or any(h.epoch > epoch for h in part.handouts)
               for part in last.values())


# -- free streams ------------------------------------------------------------------------------
def _in_flight(parts: list[_Part]) -> int:
    """At most how many samples the trainers that closed held without handing them out
    (their credit: ``hwm`` messages each, as large as the largest they handed out); in a
    run a new run followed, every trainer's (the run was cut while they held them)."""
    bound = 0
    cut = any(part.superseded for part in parts)
    for part in parts:
        if cut or (part.session.closed and part.last_run):
            sizes = Counter[int]()
            for handout in part.handouts:
                sizes[handout.message] += len(handout.positions)
            bound += int(part.session.header.get("hwm", 1)) * max(sizes.values(), default=0)
    return bound


def _closed_free(parts: list[_Part], steps: list[Step], size: int | None) -> Any:
    """Whether epoch ``e`` of a free stream is over: the stream ended, or every position
    of it lies before the samples the last trainers may have held when they closed."""
    if any(part.session.ended and part.last_run for part in parts):
        return lambda epoch: True
    last = max((step[0] for step in steps), default=0)
    if size is None or not steps:
        return lambda epoch: epoch <= last - 2
    frontier = max((epoch - 1) * size + position for epoch, position, _ in steps)
    margin = _in_flight(parts)
    # A run that a new run cut: each trainer that crossed into it held what it had been
    # dealt after its own last hand-out of this run, however far behind the others it was
    # (trainers go at their own pace: one taking batches of 7 a step ran epochs ahead of
    # one taking a sample a step), and a new run never deals it.
    crossed = [(part.handouts[-1].epoch - 1) * size + int(part.handouts[-1].positions.max())
               for part in parts if not part.last_run and part.handouts]
    slowest = min(crossed, default=frontier)
    return lambda epoch: epoch * size + margin <= frontier and epoch * size <= slowest + 1


def _free(parts: list[_Part]) -> tuple[list[Step], Counter[tuple[int, int]]]:
    """Every step of the stream, and per (epoch, position) how many copies lie in the
    unacknowledged tail of a reliable session that died (it did not close)."""
    steps: list[Step] = []
    tails: Counter[tuple[int, int]] = Counter()
    for part in parts:
        steps += part.steps()
        session = part.session
        if session.closed or not session.header.get("reliable") or not part.last_run:
            continue
        messages = sorted({handout.message for handout in part.handouts})
        tail = set(messages[-int(session.header.get("hwm", 1)):])
        for handout in part.handouts:
            if handout.message in tail:
                tails.update((handout.epoch, position) for position in handout.positions.tolist())
    return steps, tails


# -- the epochs --------------------------------------------------------------------------------
def _epochs(name: str, steps: list[Step], facts: tuple[int | None, int, str],
            closed: Any, tails: Counter[tuple[int, int]],
            served: int | None = None) -> list[EpochReport]:
    """Per epoch of the stream: what was handed out and what was wrong. An epoch of
    which nothing came (between the first and the last handed out, or up to ``served``:
    the server served that many and the job is over) is there too, every position
    missing; epochs up to ``served`` are complete."""
    size, world_size, uneven = facts
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for epoch, position, _ in steps:
        by_epoch[epoch].append(position)
    if served is not None:
        for epoch in range(1, served + 1):
            by_epoch.setdefault(epoch, [])
        closed = lambda epoch, later=closed: epoch <= served or later(epoch)  # noqa: E731
    if by_epoch:
        for epoch in range(min(by_epoch), max(by_epoch) + 1):
            by_epoch.setdefault(epoch, [])
    reports = []
    for epoch in sorted(by_epoch):
        if not by_epoch[epoch]:
            report = EpochReport(name, epoch, size, open=not closed(epoch) or size is None)
            report.missing = [] if size is None else list(range(size))
            reports.append(report)
            continue
        counts = Counter(by_epoch[epoch])
        report = EpochReport(name, epoch, size, hand_outs=len(by_epoch[epoch]))
        report.open = not closed(epoch) or size is None
        for position, times in counts.items():
            if times > 1:
                if times - tails[(epoch, position)] <= 1:
                    report.redealt += times - 1
                else:
                    report.repeated[position] = times
        if size is not None:
            report.padded = sum(times for position, times in counts.items() if position >= size)
            missing = np.setdiff1d(np.arange(size), np.fromiter(counts, dtype=np.int64))
            seen = max(counts)
            if uneven == "drop" and world_size:
                tail = missing[missing > seen]
                if 0 < len(tail) < world_size and tail[0] == seen + 1:
                    report.dropped, missing = len(tail), missing[missing <= seen]
            report.missing = missing.tolist()
        reports.append(report)
    return reports


def audit(sessions: Sequence[Session], reference: Sequence[Session] = (), *,
          epochs: int | None = None) -> AuditReport:
    """Check ``sessions`` (a job's logs, restarts included); with ``reference`` (the logs
    of an uninterrupted run of the same seeded job), also each rank's effective sequence;
    with ``epochs`` (the server served that many, ``--epochs N``, and the job is over),
    every one of them must be there, whole."""
    report = AuditReport(sessions=len(sessions), torn=sum(s.torn for s in sessions))
    for name, parts in sorted(_streams(sessions).items()):
        facts = _server_facts(parts)
        if parts[0].session.rank is not None:
            steps = _ranked(name, parts, report)
            closed = lambda e, p=parts: _closed_ranked(p, e)  # noqa: E731
            found = _epochs(name, steps, facts, closed, Counter(), epochs)
            _equal_steps(name, report, [e.epoch for e in found if not e.open])
        else:
            steps, tails = _free(parts)
            found = _epochs(name, steps, facts, _closed_free(parts, steps, facts[0]), tails,
                            epochs)
        report.epochs += found
        _compare_keys(name, steps, report)
    if reference:
        _compare(report, audit(reference))
    return report


def _equal_steps(name: str, report: AuditReport, closed: list[int]) -> None:
    """Every rank of the job took as many steps as the others in each complete epoch."""
    counts: dict[int, Counter[int]] = {}
    for (stream, rank), sequence in report.sequences.items():
        if stream == name:
            counts[rank] = Counter(epoch for epoch, _, _ in sequence)
    for epoch in closed:
        steps = {rank: count[epoch] for rank, count in sorted(counts.items())}
        if len(set(steps.values())) > 1:
            report.problems.append(
                f"{name}: epoch {epoch}: the ranks took different numbers of steps ("
                + ", ".join(f"rank {rank} {n}" for rank, n in steps.items())
                + "): expected the same for every rank (a DDP job would hang)")


def _compare_keys(name: str, steps: list[Step], report: AuditReport) -> None:
    """The same position of an epoch carried the same key wherever it was handed out
    (also before and after a resume)."""
    keys: dict[tuple[int, int], Any] = {}
    replayed = [step for stream, step in report.replayed if stream == name]
    conflicts = 0
    first: str | None = None
    for epoch, position, key in [*steps, *replayed]:
        if key is None:
            continue
        known = keys.setdefault((epoch, position), key)
        if known != key:
            conflicts += 1
            first = first or (f"epoch {epoch} position {position}: key {json.dumps(known)} "
                              f"and key {json.dumps(key)}")
    if conflicts:
        report.problems.append(f"{name}: {conflicts} position(s) handed out with different "
                               f"keys (a source that is not deterministic?), first {first}")


def _paired(mine: set[str], theirs: set[str]) -> dict[str, str]:
    """Reference stream -> audited stream: by name, or the only one of each (a reference
    run of the job usually listens elsewhere)."""
    if len(mine) == 1 and len(theirs) == 1:
        return {next(iter(theirs)): next(iter(mine))}
    return {name: name for name in theirs}


def _compare(report: AuditReport, reference: AuditReport) -> None:
    """Each rank's effective sequence equals the reference run's (over the shorter)."""
    if not reference.sequences:
        report.problems.append("expected reference logs of ranked trainers, got none")
    streams = _paired({name for name, _ in report.sequences},
                      {name for name, _ in reference.sequences})
    for (there, rank), expected in sorted(reference.sequences.items()):
        name = streams[there]
        got = report.sequences.get((name, rank))
        if got is None:
            report.problems.append(f"{name} rank {rank}: in the reference, not in these logs")
            continue
        common = min(len(got), len(expected))
        for step, (mine, theirs) in enumerate(zip(got[:common], expected[:common],
                                                  strict=True)):
            if mine != theirs:
                report.problems.append(
                    f"{name} rank {rank}: step {step} handed out epoch {mine[0]} position "
                    f"{mine[1]} key {json.dumps(mine[2])}, the reference run epoch "
                    f"{theirs[0]} position {theirs[1]} key {json.dumps(theirs[2])}")
                break
        else:
            report.notes.append(f"{name} rank {rank}: the first {common} steps equal the "
                                f"reference run's" + ("" if len(got) == len(expected) else
                                f" ({len(got)} here, {len(expected)} there)"))

