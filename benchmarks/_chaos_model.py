"""The model behind ``benchmarks.chaos``: the scenarios, what each mode promises, the schedule.

This module owns what the chaos run *expects* and *does*, as data: the
scenarios (which trainers, which servers with which options, which events),
the seeded draw of one run's set-up and schedule of events (the same seed gives
the same set-up and the same events in the same order, printed so that a
failure replays), and the promises each mode makes, which the oracle (``feedmux
audit``) checks over the logs. The promises, independent of how the code keeps
them:

- free trainers: every sample of every complete epoch of a server's run is
  handed out exactly once across all the free trainers, whoever joined, left,
  was killed, frozen, or lived through a restart of the server (a server that
  begins its epochs again is a new run, with epochs of its own), those that ask
  for batches (``batch_size=``, cut by the server as it deals) included;
- a torch ``DataLoader`` whose workers end after each pass (non-persistent
  workers): each pass is one server epoch, and every epoch the server served
  comes whole (``feedmux audit --epochs N``);
- ranked trainers: each rank's sequence equals the uninterrupted run's (the
  reference run, same seed, no events), a job resumed from a checkpoint
  included; every rank takes the same number of steps in each epoch; a rank
  restarted without a checkpoint continues its predecessor's share.

It is pure: it never starts a process, opens a socket or reads a clock (the
runner, ``benchmarks._chaos_run``, does; ``benchmarks.chaos`` is the command).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EVENTS", "FOCUS", "FREE_LOADER", "FREE_SERVER", "Event", "Scenario", "Setup",
           "draw"]

#: How a free trainer asks for exactly-once delivery, in the one place it is said: the
#: free trainers, the DataLoader's workers and the free servers all take it from here.
#: Acknowledged delivery is the default: no flag is needed (the deprecated ones do nothing).
FREE_LOADER: dict[str, Any] = {}
FREE_SERVER: tuple[str, ...] = ()

#: The sources (benchmarks.chaos): 8 streamers x 40 ids (epochs of 320), and the small
#: one of the rank-restart report, 7 streamers x 13 ids with 3 active (epochs of 91).
SOURCE, SMALL_SOURCE = "benchmarks.chaos:source", "benchmarks.chaos:small_source"
EPOCH = {SOURCE: 320, SMALL_SOURCE: 91}

#: What each kind of event does (the runner applies them; ``how`` picks a variant).
EVENTS = {
    "join": "a new free trainer joins",
    "leave": "a free trainer leaves normally (SIGTERM: it closes its loader mid-message, "
             "prefetched messages in its queue)",
    "kill-free": "a free trainer is SIGKILLed",
    "stop-free": "a free trainer is SIGSTOPped, then continued",
    "kill-rank": "a rank is SIGKILLed (how: job = torchrun restarts every rank from the "
                 "last checkpoint; alone = the rank alone restarts without a checkpoint, "
                 "at step N if step > 0: it stops reading there first, for a while)",
    "resume-job": "the ranked job is SIGKILLed while a rank is past its last checkpoint, "
                  "then resumed from that checkpoint",
    "server": "a server is SIGTERMed or SIGKILLed and restarted with the same command "
              "(how: SIGNAL-continue: its trainers live on and it continues its run; "
              "SIGNAL-new-run: its free trainers are frozen meanwhile, a new trainer says "
              "hello first and the server begins a new run, then the survivors go on and "
              "cross into it)",
    "kill-worker": "a sampling worker of the ranked server is SIGKILLed",
}


@dataclass(frozen=True)
class Event:
    """One event of a schedule: ``kind`` (see :data:`EVENTS`), applied ``pause`` seconds
    after the one before, once everything recovered from it."""

    pause: float
    kind: str
    target: int = 0  # which trainer or rank (an index into the live ones, modulo)
    how: str = ""
    step: int = 0  # kill-rank alone: the rank stops at this step (0: wherever it is)
    hold: float = 0.0  # ... and stays there, not reading, this many seconds before the kill
    server: str = ""  # server: "ranked" or "free"

    def describe(self) -> str:
        words = [self.kind]
        if self.server:
            words.append(self.server)
        if self.kind in ("kill-free", "stop-free", "leave", "kill-rank"):
            words.append(f"#{self.target}")
        if self.how:
            words.append(self.how)
        if self.step:
            words.append(f"at step {self.step}" + (f", held {self.hold:g} s" if self.hold
                                                   else ""))
        return " ".join(words)


@dataclass(frozen=True)
class Scenario:
    """A kind of run: which trainers and servers, and which events in what proportion."""

    name: str
    summary: str
    ranks: tuple[int, ...] = ()  # the world sizes to draw from (empty: no ranked job)
    free: int = 0  # free trainers at the start
    dataloader: bool = False  # a torch DataLoader over RemoteDataset, 2 non-persistent workers
    events: dict[str, float] = field(default_factory=dict)  # kind -> weight
    source: str = SOURCE
    #: ranked server --epochs (the job runs to the end of the stream); None: the job runs
    #: until the supervisor names a last step
    ranked_epochs: int | None = None
    hwm: tuple[int, ...] = (4,)  # the ranked server's --hwm, drawn
    workers: tuple[int, ...] = (2,)  # the ranked server's --workers, drawn
    epoch_size: tuple[bool, ...] = (False,)  # declare --epoch-size to the ranked server?
    rank_restarts: tuple[str, ...] = ("job", "alone")  # how a killed rank comes back
    #: more options of the ranked server (the mix: --no-shm, so that a sampling worker's
    #: death hands its shards over; with the pool it fails the run, as documented)
    ranked_extra: tuple[str, ...] = ()
    events_per_run: int | None = None  # None: as many as the minutes allow
    #: the batch_size= the free trainers of odd index ask for (0: none does; of those,
    #: index 3, 7, 11, ... also bucket_by="n"): the others take single samples from the
    #: same stream
    free_batch: int = 0


FOCUS: dict[str, Scenario] = {scenario.name: scenario for scenario in (
    Scenario("mix", "every event: a ranked job (2 or 3 ranks, 2 sampling workers), free "
             "trainers, a torch DataLoader",
             ranks=(2, 3), free=3, dataloader=True,
             events={"join": 1, "leave": 1, "kill-free": 1, "stop-free": 1, "kill-rank": 2,
                     "resume-job": 2, "server": 2, "kill-worker": 1},
             ranked_extra=("--no-shm",), free_batch=7),
    Scenario("checkpoint", "a ranked job of 2 or 3 ranks, small --hwm, killed after a "
             "checkpoint and resumed from it, again and again (a killed rank: the job "
             "restarts from its checkpoint)",
             ranks=(2, 3), events={"resume-job": 4, "kill-rank": 1}, hwm=(2, 3, 4),
             workers=(1, 2), rank_restarts=("job",)),
    Scenario("rank-restart", "2 ranks over 7 x 13 ids (epochs of 91), --epochs 3, default "
             "samples per message: a rank stops at a step of any epoch, is SIGKILLed and "
             "restarted alone without a checkpoint",
             ranks=(2,), events={"kill-rank": 1}, source=SMALL_SOURCE, ranked_epochs=3,
             rank_restarts=("alone",),
             hwm=(8,), workers=(1, 2), epoch_size=(False, True), events_per_run=1),
    Scenario("server-restart", "free trainers joining, leaving, killed and frozen while "
             "their server is SIGTERMed or SIGKILLed and restarted, continuing its run or "
             "beginning a new one",
             free=3, events={"server": 3, "join": 1, "leave": 1, "kill-free": 1,
                             "stop-free": 1}, free_batch=7),
    Scenario("dataloader", "a torch DataLoader(RemoteDataset, batch_size=None, "
             "num_workers=2) with non-persistent workers: a pass per epoch, --epochs 3",
             dataloader=True, events_per_run=0),
)}

#: Free trainers at most (a join beyond is skipped), and at least (a leave or kill
#: below is skipped): the free server is started with --min-trainers of the survivors.
MAX_FREE, MIN_FREE = 5, 1
#: Seconds between two events (at least; the next waits until everything recovered).
PAUSE = (3.0, 7.0)


@dataclass(frozen=True)
class Setup:
    """One run's set-up and schedule, drawn from its seed."""

    seed: int
    scenario: Scenario
    ranks: int
    hwm: int
    workers: int
    epoch_size: bool
    events: tuple[Event, ...]

    def describe(self) -> str:
        parts = [f"seed {self.seed}, focus {self.scenario.name}"]
        if self.ranks:
            epochs = self.scenario.ranked_epochs
            parts.append(f"ranked job: {self.ranks} ranks, --hwm {self.hwm}, --workers "
                         f"{self.workers}, "
                         + "".join(f"{extra}, " for extra in self.scenario.ranked_extra)
                         + (f"--epochs {epochs}" if epochs else "to a last step")
                         + (f", --epoch-size {EPOCH[self.scenario.source]}"
                            if self.epoch_size else ""))
        if self.scenario.free:
            batches = (f", the odd ones batch_size={self.scenario.free_batch}, every other "
                       f"of them bucket_by='n'" if self.scenario.free_batch else "")
            parts.append(f"{self.scenario.free} free trainers ({_flags()}{batches})")
        if self.scenario.dataloader:
            parts.append("a DataLoader of 2 non-persistent workers, --epochs 3")
        lines = ["; ".join(parts)]
        lines += [f"  {index + 1:2d}. +{event.pause:.1f} s {event.describe()}"
                  for index, event in enumerate(self.events)]
        return "\n".join(lines)


def _flags() -> str:
    loader = ", ".join(f"{key}={value!r}" for key, value in FREE_LOADER.items()) or "defaults"
    return f"loader {loader}, server {' '.join(FREE_SERVER) or 'defaults'}"


def draw(seed: int, scenario: Scenario, minutes: float) -> Setup:
    """The set-up and schedule of one run of ``scenario``: the same for the same seed."""
    rng = random.Random(f"{scenario.name}:{seed}")
    ranks = rng.choice(scenario.ranks) if scenario.ranks else 0
    hwm, workers = rng.choice(scenario.hwm), rng.choice(scenario.workers)
    epoch_size = rng.choice(scenario.epoch_size)
    count = scenario.events_per_run
    if count is None:  # as many as fit in the minutes at the mean pause, recovery aside
        count = max(1, int(minutes * 60 / (sum(PAUSE) / 2 + 2)))
    kinds, weights = zip(*scenario.events.items(), strict=True) if scenario.events else ((), ())
    events: list[Event] = []
    free = scenario.free
    while len(events) < count and kinds:
        kind = rng.choices(kinds, weights)[0]
        pause = round(rng.uniform(*PAUSE), 1)
        target = rng.randrange(16)
        if kind == "join":
            if free >= MAX_FREE:
                continue
            free += 1
            events.append(Event(pause, kind))
        elif kind in ("leave", "kill-free"):
            if free <= MIN_FREE:
                continue
            free -= 1
            events.append(Event(pause, kind, target))
        elif kind == "stop-free":
            events.append(Event(pause, kind, target, f"{rng.uniform(0.5, 3.0):.1f} s"))
        elif kind == "kill-rank":
            how = scenario.rank_restarts[0]
            if len(scenario.rank_restarts) > 1:
                how = rng.choice(scenario.rank_restarts)
            step, hold = 0, 0.0
            if scenario.ranked_epochs is not None:  # a step of any epoch (not its last)
                per_epoch = -(-EPOCH[scenario.source] // ranks)
                epoch = rng.randrange(scenario.ranked_epochs)
                step = epoch * per_epoch + rng.randrange(1, per_epoch - 1)
                pause, hold = 0.0, rng.choice((0.0, 0.5, 2.0, 5.0))
            events.append(Event(pause, kind, target % ranks, how, step, hold))
        elif kind == "server":
            servers = [name for name, there in (("ranked", ranks), ("free", scenario.free))
                       if there]
            server = rng.choice(servers)
            runs = ("continue", "new-run") if server == "free" else ("continue",)
            events.append(Event(pause, kind, 0, f"{rng.choice(('TERM', 'KILL'))}-"
                                                f"{rng.choice(runs)}", server=server))
        else:
            events.append(Event(pause, kind, target))
    return Setup(seed, scenario, ranks, hwm, workers, epoch_size, tuple(events))
