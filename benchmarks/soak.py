"""``python -m benchmarks.soak --minutes N [--seed S] [--workers W]``: feedmux under churn.

Two servers run side by side on the soak's source (``benchmarks.fuzz_live:source``:
500 samples an epoch, each sample's id its position and its array full of it):

- a server with free trainers (acknowledged delivery, the one free delivery): one
  lives for the whole run, short-lived ones come and go, about a third of them
  SIGKILLed mid-stream; halfway through, the server is stopped and a new one
  started on the same endpoints (told to wait for every trainer alive, as
  docs/resume.md asks), which continues the epochs;
- a ranked server with a job of two ranks that checkpoint (``state_dict()``) every
  few steps; now and then a rank is SIGKILLed, and the job is restarted as a
  supervisor would (every rank, from the last checkpoint all ranks wrote).

The schedule (which trainers come and go, which are SIGKILLed and when, when the
server restarts, when a rank dies) is drawn from ``--seed``, printed at the start:
the same seed gives the same scenario. Every few seconds the RSS of every process
is sampled. At the end it reports each long-lived process's RSS slope once warm
(least squares after its first quarter) and checks the records
(:mod:`benchmarks._soakcheck`): no sample of a complete epoch lost or repeated
across the free trainers (a SIGKILL's documented edge counted apart), each rank's
sequence that of an uninterrupted run. It fails (exit 1) on any loss or repeat,
on a wrong sample, and on an RSS slope above ``--max-slope`` MiB/min once warm
(judged for processes that lived three minutes: ``make soak``'s ten minutes, not
``make soak-ci``'s one, which shows the slopes only).
Trainers are child processes of this script (``python -m benchmarks.soak trainer
...`` or ``rank ...``), each stopped by pid; the servers are stopped through their
handles.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import feedmux
from benchmarks._soakcheck import check_free, check_ranked, parse_lines
from benchmarks.attacks import rss
from benchmarks.fuzz_live import ITEMS

__all__ = ["Schedule", "main", "slope"]

MiB = 1 << 20
SAMPLE_EVERY = 2.0
SOURCE = "benchmarks.fuzz_live:source"
WORLD_SIZE = 2
CHECKPOINT_EVERY = 40  # steps between two checkpoints of a rank
#: No free trainer starts, ends or dies this long around the server's restart: the
#: restarted server waits for the trainers alive when it stopped, and those must be the
#: trainers that say hello (docs/resume.md).
QUIET = 3.0
#: Seconds a server may take to start, and a trainer to wait for data (a server restart
#: included): generous, a loaded machine starts processes slowly.
START_WAIT, TRAINER_WAIT = 120.0, 240.0
#: Seconds a process takes to reach its working size (imports, queues, allocator pools).
WARM_UP = 30.0
#: Seconds a process must live for its RSS slope to be judged (see ``_report_rss``).
JUDGED_AFTER = 180.0


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over time, in MiB per minute, once warm: after the
    first quarter and after the first :data:`WARM_UP` seconds."""
    if len(points) < 4:
        return float("nan")
    start = points[0][0] + max(WARM_UP, (points[-1][0] - points[0][0]) / 4)
    warm = [(t, value) for t, value in points if t >= start]
    n = len(warm)
    mean_t = sum(t for t, _ in warm) / n
    mean_v = sum(v for _, v in warm) / n
    var = sum((t - mean_t) ** 2 for t, _ in warm)
    if var == 0:
        return float("nan")
    cov = sum((t - mean_t) * (v - mean_v) for t, v in warm)
    return cov / var * 60 / MiB


# -- the schedule --------------------------------------------------------------------------
@dataclass(frozen=True)
class Churner:
    start: float
    seconds: float
    kill_at: float | None  # seconds after the start (None: it ends by itself)


@dataclass
class Schedule:
    """The soak's scenario, drawn from a seed: times in seconds from the start."""

    seconds: float
    seed: int
    restart: float = 0.0
    churners: list[Churner] = field(default_factory=list)
    rank_kills: list[tuple[float, int]] = field(default_factory=list)  # (time, rank)

    @classmethod
    def draw(cls, seconds: float, seed: int) -> Schedule:
        """A scenario for a run of ``seconds``.

        >>> a, b = Schedule.draw(60, 3), Schedule.draw(60, 3)
        >>> a == b and bool(a.churners) and bool(a.rank_kills)
        True
        """
        rng = random.Random(seed)
        schedule = cls(seconds, seed, restart=seconds * rng.uniform(0.4, 0.6))
        quiet = (schedule.restart - QUIET, schedule.restart + QUIET)
        at = rng.uniform(0.5, 2.0)
        while at < seconds - 2:
            lifetime = rng.uniform(3.0, 9.0)
            kill_at = rng.uniform(0.5, lifetime - 0.5) if rng.random() < 1 / 3 else None
            end = at + (lifetime if kill_at is None else kill_at)
            if not (at < quiet[1] and end > quiet[0]):  # clear of the restart
                schedule.churners.append(Churner(at, lifetime, kill_at))
            at += rng.uniform(2.5, 5.5)
        at = rng.uniform(5.0, 10.0)
        while at < seconds - 5:
            schedule.rank_kills.append((at, rng.randrange(WORLD_SIZE)))
            at += rng.uniform(8.0, 16.0)
        return schedule


# -- the trainers (child processes) --------------------------------------------------------
def _trainer(argv: list[str]) -> int:
    """A free trainer (acknowledged delivery, the default): a line
    ``server_id epoch position id ok pid`` per sample."""
    data, control, out, seconds = argv[0], argv[1], argv[2], float(argv[3])
    end = time.monotonic() + seconds
    pid = os.getpid()
    with open(out, "a", buffering=1) as log, feedmux.RemoteLoader(
        data, control=control, timeout=TRAINER_WAIT, with_meta=True, hwm=4,
    ) as loader:
        for meta, sample in loader:
            ok = int((sample["x"] == int(sample["id"])).all())
            log.write(f"{meta.server_id} {meta.epoch} {meta.position} {int(sample['id'])} "
                      f"{ok} {pid}\n")
            if time.monotonic() > end:
                break
    return 0


def _rank(argv: list[str]) -> int:
    """A rank of the ranked job: ``step epoch position id ok`` per sample; every
    CHECKPOINT_EVERY steps its loader's state goes to ``DIR/rank{r}-{step}.json``."""
    data, control, rank, out, checkpoints = argv[0], argv[1], int(argv[2]), argv[3], argv[4]
    step = int(argv[5])  # the checkpoint to resume from (0: a fresh start)
    with open(out, "a", buffering=1) as log, feedmux.RemoteLoader(
        data, control=control, timeout=TRAINER_WAIT, with_meta=True, hwm=4, rank=rank,
        world_size=WORLD_SIZE,
    ) as loader:
        if step:
            loader.load_state_dict(json.loads(
                (Path(checkpoints) / f"rank{rank}-{step}.json").read_text()))
        for meta, sample in loader:
            step += 1
            ok = int((sample["x"] == int(sample["id"])).all())
            log.write(f"{step} {meta.epoch} {meta.position} {int(sample['id'])} {ok}\n")
            time.sleep(0.001)  # a training step
            if step % CHECKPOINT_EVERY == 0:
                path = Path(checkpoints) / f"rank{rank}-{step}.json"
                path.with_suffix(".tmp").write_text(json.dumps(loader.state_dict()))
                path.with_suffix(".tmp").rename(path)  # complete, or absent
    return 0


# -- the run -------------------------------------------------------------------------------
class _Soak:
    def __init__(self, scratch: Path, workers: int, seed: int) -> None:
        self.scratch = scratch
        self.workers = workers
        #: Both servers' run seed: a resumed or restarted run must give the same samples at
        #: the same positions (with several workers their merge order depends on it).
        self.seed = seed
        self.rss: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.trainers: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: list[str] = []  # pids of the SIGKILLed free trainers
        self.stopped: list[str] = []  # pids of the free trainers running at the end
        self.count = 0
        self.server: feedmux.Server | None = None
        self.servers = 0
        #: Seconds from the old server's stop to the restarted one dealing (None: no restart).
        self.restart_took: float | None = None
        self.ranked: feedmux.Server | None = None
        #: Per rank: (resumed from step, its record file) of each of its processes.
        self.lives: list[list[tuple[int, Path]]] = [[] for _ in range(WORLD_SIZE)]
        self.ranks: list[subprocess.Popen[bytes] | None] = [None] * WORLD_SIZE

    def _spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "benchmarks.soak", *argv],
                                env={**os.environ, "PYTHONPATH": os.getcwd()})

    def start_server(self, data: str = "tcp://127.0.0.1:0", control: str | None = None,
                     min_trainers: int = 0) -> None:
        self.servers += 1
        options: dict[str, Any] = {"bind": data, "workers": self.workers,
                                   "min_trainers": min_trainers, "seed": self.seed}
        if control is not None:
            options["control"] = control
        self.server = feedmux.Server(SOURCE, **options).start(timeout=START_WAIT)

    def restart_server(self) -> None:
        assert self.server is not None
        data, control = self.server.data_address, self.server.control_address
        # The trainers the old server had dealt to (one still starting up may die unheard).
        with (self.scratch / "received.txt").open() as received:  # millions of lines
            dealt = {line.rsplit(" ", 1)[-1].strip() for line in received}
        alive = sum(1 for process in self.trainers.values()
                    if process.poll() is None and str(process.pid) in dealt)
        self.server.stop()
        stopped = time.monotonic()
        self.start_server(data, control, min_trainers=alive)
        # The survivors must be the trainers that say hello: a trainer started while the
        # restarted server still waits would count as one of them, and a fresh trainer
        # tells nothing of the old run (the server would begin its epochs again). So the
        # schedule goes on only once the server deals, however long the survivors took
        # to notice the restart on a loaded machine (bounded).
        deadline = stopped + START_WAIT
        while alive and feedmux.fetch_stats(
                self.server.control_address,
                timeout=max(1.0, deadline - time.monotonic()))["samples_sent"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the restarted server heard from fewer than {alive} "
                                   f"trainer(s) within {START_WAIT:g} s")
            time.sleep(0.05)
        self.restart_took = time.monotonic() - stopped

    def start_trainer(self, seconds: float) -> str:
        assert self.server is not None
        self.count += 1
        name = f"trainer-{self.count}"
        self.trainers[name] = self._spawn(
            "trainer", self.server.data_address, self.server.control_address,
            str(self.scratch / "received.txt"), str(seconds))
        return name

    def kill_trainer(self, name: str) -> None:
        victim = self.trainers[name]
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait(15)
            self.killed.append(str(victim.pid))

    def start_ranked(self) -> None:
        self.ranked = feedmux.Server(SOURCE, bind="tcp://127.0.0.1:0", workers=self.workers,
                                     seed=self.seed).start(timeout=START_WAIT)
        for rank in range(WORLD_SIZE):
            self._start_rank(rank, 0)

    def _start_rank(self, rank: int, step: int) -> None:
        assert self.ranked is not None
        record = self.scratch / f"rank{rank}-life{len(self.lives[rank])}.txt"
        self.lives[rank].append((step, record))
        self.ranks[rank] = self._spawn(
            "rank", self.ranked.data_address, self.ranked.control_address, str(rank),
            str(record), str(self.scratch), str(step))

    def kill_rank(self, rank: int) -> None:
        """SIGKILL ``rank``; restart the job (every rank) from its last common checkpoint."""
        for process in self.ranks:  # the victim first; then torchrun stops the others
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(15)
        saved = [{int(path.stem.split("-")[1]) for path in self.scratch.glob(f"rank{r}-*.json")}
                 for r in range(WORLD_SIZE)]
        common = set.intersection(*saved)
        step = max(common) if common else 0
        for path in self.scratch.glob("rank*-*.json"):  # the job goes on from ``step``
            if int(path.stem.split("-")[1]) > step:
                path.unlink()
        for other in range(WORLD_SIZE):
            self._start_rank(other, step)

    def sample(self, now: float) -> None:
        processes: list[tuple[str, int | None]] = [
            (f"server-{self.servers}", self.server.pid if self.server else None),
            ("ranked-server", self.ranked.pid if self.ranked else None)]
        processes += [(name, p.pid) for name, p in self.trainers.items() if p.poll() is None]
        processes += [(f"rank{r}-life{len(self.lives[r])}", p.pid)
                      for r, p in enumerate(self.ranks) if p is not None and p.poll() is None]
        for name, pid in processes:
            if pid is None:
                continue
            try:
                self.rss[name].append((now, rss(pid)))
            except (OSError, RuntimeError):
                pass

    def stop_all(self) -> None:
        self.stopped = [str(p.pid) for p in self.trainers.values() if p.poll() is None]
        processes = [*self.trainers.values(), *(p for p in self.ranks if p is not None)]
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(15)
        for server in (self.server, self.ranked):
            if server is not None:
                server.stop()


def _drive(soak: _Soak, schedule: Schedule) -> None:
    """Play ``schedule``: start, kill and restart as it says, sampling RSS meanwhile."""
    soak.start_server()
    soak.start_ranked()
    soak.start_trainer(schedule.seconds + 60)  # the long-lived one
    events: list[tuple[float, str, Any]] = [(schedule.restart, "restart", None)]
    for churner in schedule.churners:
        events.append((churner.start, "start", churner))
    events += [(at, "rank", rank) for at, rank in schedule.rank_kills]
    events.sort(key=lambda event: event[0])
    begin = time.monotonic()
    next_sample = begin
    while (now := time.monotonic()) - begin < schedule.seconds:
        if now >= next_sample:
            soak.sample(now - begin)
            next_sample = now + SAMPLE_EVERY
        while events and events[0][0] <= now - begin:
            _, kind, what = events.pop(0)
            if kind == "restart":
                soak.restart_server()
            elif kind == "start":
                name = soak.start_trainer(what.seconds)
                if what.kill_at is not None:
                    events.append((what.start + what.kill_at, "kill", name))
                    events.sort(key=lambda event: event[0])
            elif kind == "kill":
                soak.kill_trainer(what)
            else:
                soak.kill_rank(what)
        time.sleep(0.05)  # the schedule's resolution


def run(minutes: float, seed: int, workers: int, max_slope: float) -> int:
    schedule = Schedule.draw(minutes * 60, seed)
    print(f"soak: {minutes:g} min, seed {seed}, {workers} worker(s) per server: "
          f"{len(schedule.churners)} short-lived trainers "
          f"({sum(c.kill_at is not None for c in schedule.churners)} to be SIGKILLed), "
          f"the server restarted at {schedule.restart:.1f} s, "
          f"{len(schedule.rank_kills)} rank(s) SIGKILLed", flush=True)
    with tempfile.TemporaryDirectory(prefix="feedmux-soak-") as scratch_dir:
        scratch = Path(scratch_dir)
        soak = _Soak(scratch, workers, seed)
        try:
            _drive(soak, schedule)
        finally:
            soak.stop_all()
        with (scratch / "received.txt").open() as received:  # read as it is checked
            free = check_free(parse_lines(received, 6), soak.killed, ITEMS, soak.stopped)
        ranked = check_ranked(
            [[(step, list(parse_lines(path.read_text().splitlines(), 5)) if path.exists()
               else []) for step, path in lives] for lives in soak.lives], ITEMS)
    print(f"  {soak.count} free trainers ({len(soak.killed)} SIGKILLed), {soak.servers} runs "
          f"of the free trainers' server"
          + ("" if soak.restart_took is None else
             f" (the restarted one dealt {soak.restart_took:.1f} s after the stop)"))
    steep = _report_rss(soak.rss, max_slope)
    for verdict in (free, ranked):
        print(f"  {verdict.line()}")
        for example in verdict.examples:
            print(f"    {example}")
    return 0 if free.ok and ranked.ok and not steep else 1


def _report_rss(points_by_name: dict[str, list[tuple[float, int]]], max_slope: float) -> int:
    """Print each long-lived process's RSS; the number whose slope passes ``max_slope``.

    A slope is judged only for a process that lived :data:`JUDGED_AFTER` seconds: in
    a shorter life a one-time step (a job's first restart replaying its epochs, an
    allocator's arena) cannot be told from growth, so it is shown, not judged.
    """
    short = steep = 0
    for name, points in sorted(points_by_name.items()):
        lived = points[-1][0] - points[0][0]
        if lived < WARM_UP + 20 or len(points) < 8:
            short += 1  # too short-lived for a slope: start-up only
            continue
        rate = slope(points)
        judged = lived >= JUDGED_AFTER
        over = judged and rate > max_slope
        steep += over
        verdict = "  (above the limit)" if over else "" if judged else "  (not judged: too short)"
        print(f"  {name:>14}: RSS {points[0][1] / MiB:6.1f} -> {points[-1][1] / MiB:6.1f} MiB "
              f"over {lived:5.0f} s, slope once warm {rate:+.2f} MiB/min{verdict}")
        if over:
            print("      RSS (s: MiB): " + ", ".join(
                f"{t:.0f}: {value / MiB:.1f}" for t, value in points[::3]))
    print(f"  ({short} short-lived processes not listed: they never got warm)")
    return steep


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trainer"]:
        return _trainer(argv[1:])
    if argv[:1] == ["rank"]:
        return _rank(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None,
                        help="the schedule's seed (default: a fresh one, printed)")
    parser.add_argument("--workers", type=int, default=1, help="sampling processes per server")
    parser.add_argument("--max-slope", type=float, default=1.0,
                        help="the RSS slope once warm, in MiB/min, above which the soak fails")
    args = parser.parse_args(argv)
    seed = random.SystemRandom().randrange(1 << 31) if args.seed is None else args.seed
    return run(args.minutes, seed, args.workers, args.max_slope)


if __name__ == "__main__":
    raise SystemExit(main())
