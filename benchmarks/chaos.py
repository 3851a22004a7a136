"""``python -m benchmarks.chaos --minutes N --seed S``: a job under a seeded schedule of SIGKILLs.

Two servers run ``feedmux serve`` as a supervisor would start them: a ranked
one (``--workers 2 --seed S``) feeding a data-parallel job of three ranks that
checkpoint every few steps, and a reliable one (``--reliable --min-trainers
3``) feeding three free trainers. A schedule drawn from ``--seed`` SIGKILLs one
process at a time — a sampling worker, a server, a rank, a free trainer — and
the supervisor here restarts what died the documented way (docs/resume.md): a
server with the same command; the whole ranked job, as torchrun does, every
rank loading the last checkpoint; a free trainer afresh. Every trainer writes
an audit log (``RemoteLoader(audit_log=..., audit_key="id")``) and checks each
sample's array against its id. At the end the job stops at a common step, a
reference run of the same seeded job without kills gives the uninterrupted
sequence, and ``feedmux audit`` must pass: the ranked job's logs against the
reference (each rank's sequence up to each checkpoint it resumed from, then
after, equals the uninterrupted one; every epoch exact), the free trainers'
logs alone (every sample of every complete epoch once). It reports the kills
survived and the samples checked and exits 1 on any problem. Every wait is
bounded; every process it started is killed by pid on every exit path.
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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import feedmux
from feedmux.apps.audit import audit, load_sessions

__all__ = ["main", "source"]

STREAMERS = 8
ITEMS = 40  # per streamer: an epoch is STREAMERS * ITEMS samples
WIDTH = 64
RANKS = 3
FREE = 3
#: Steps between two checkpoints of the ranked job.
EVERY = 10
#: Seconds a start, a restart or the end of a run may take on a loaded machine.
START_TIMEOUT = 60.0
LOADER_TIMEOUT = 60.0
#: A trainer's exit codes that mean a problem.
WRONG = {3: "a sample held other values than its id", 4: "a rank ran past its last step",
         5: "a rank's stream ended (the server ended it)"}
#: Seconds between two kills (at least; the next waits until everything recovered).
KILL_EVERY = (3.0, 7.0)
RECOVERY_TIMEOUT = 120.0
VICTIMS = ("ranked server", "worker", "rank", "reliable server", "free trainer")


def _items(streamer: int) -> Iterator[dict[str, Any]]:
    for item in range(ITEMS):
        ident = streamer * ITEMS + item
        yield {"id": np.int64(ident), "x": np.full(WIDTH, ident, dtype=np.int32)}


def source() -> feedmux.StochasticMux:
    """The job's data: a seeded exhaustive mux, each sample's array full of its id."""
    streamers = [feedmux.Streamer(_items, index) for index in range(STREAMERS)]
    return feedmux.StochasticMux(streamers, n_active=4, rate=None, mode="exhaustive",
                                 random_state=0)


# -- the trainers (child processes: python -m benchmarks.chaos rank|free ...) -------------------
def _exact(sample: dict[str, Any]) -> bool:
    return bool((sample["x"] == int(sample["id"])).all())


def _write_atomic(path: Path, text: str) -> None:
    scratch = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rank(args: argparse.Namespace) -> int:
    """One rank: hand out, checkpoint every EVERY steps (rank 0, once every rank got
    there), stop at the step the supervisor names."""
    scratch = Path(args.dir)
    loader = feedmux.RemoteLoader(
        args.data, control=args.control, rank=args.rank, world_size=RANKS, hwm=4,
        timeout=LOADER_TIMEOUT, audit_log=str(scratch / f"rank{args.rank}.log"), audit_key="id")
    step = 0
    saved = None if args.reference else _read_json(scratch / "checkpoint.json")
    if saved is not None:
        step = saved["step"]
        loader.load_state_dict(saved["data"])
    if step and step == (_read_json(scratch / "stop.json") or {}).get("step"):
        return 0  # the job had reached its last step: restarted only because another rank died
    with loader:
        for sample in loader:
            if not _exact(sample):
                print(f"rank {args.rank}: sample {int(sample['id'])} holds other values",
                      file=sys.stderr)
                return 3
            step += 1
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            if step % EVERY:
                continue
            _write_atomic(scratch / f"rank{args.rank}.step",
                          json.dumps({"generation": args.generation, "step": step}))
            if args.rank == 0 and not args.reference and _all_reached(scratch, args, step):
                _write_atomic(scratch / "checkpoint.json",
                              json.dumps({"step": step, "data": loader.state_dict()}))
            stop = args.stop_at or (_read_json(scratch / "stop.json") or {}).get("step")
            if stop is not None and step >= stop:
                return 0 if step == stop else 4
    print(f"rank {args.rank}: the stream ended at step {step}", file=sys.stderr)
    return 5


def _all_reached(scratch: Path, args: argparse.Namespace, step: int) -> bool:
    """Wait (bounded) until every rank of this generation of the job handed out ``step``
    samples: a checkpoint no rank is behind (a DDP job's ranks are in lockstep)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        marks = [_read_json(scratch / f"rank{rank}.step") for rank in range(RANKS)]
        if all(mark is not None and mark["generation"] == args.generation
               and mark["step"] >= step for mark in marks):
            return True
        time.sleep(0.005)
    return False


class _Stopped(Exception):
    """SIGTERM: the supervisor ends a free trainer."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped


def _free(args: argparse.Namespace) -> int:
    """A free reliable trainer: hand out until SIGTERM (it closes its loader then)."""
    scratch = Path(args.dir)
    signal.signal(signal.SIGTERM, _stop)
    try:
        return _hand_out(args, scratch)
    except _Stopped:
        return 0


def _hand_out(args: argparse.Namespace, scratch: Path) -> int:
    with feedmux.RemoteLoader(args.data, control=args.control, reliable=True, hwm=4,
                              timeout=LOADER_TIMEOUT, audit_key="id",
                              audit_log=str(scratch / f"free{args.index}.log")) as loader:
        for sample in loader:
            if not _exact(sample):
                print(f"free trainer {args.index}: sample {int(sample['id'])} holds other "
                      f"values", file=sys.stderr)
                return 3
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
    return 0


# -- the supervisor ----------------------------------------------------------------------------
@dataclass
class _Server:
    """A ``feedmux serve`` process and how to start it again with the same command."""

    name: str
    options: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    data: str = "tcp://127.0.0.1:0"
    control: str = "tcp://127.0.0.1:0"
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as log:
            mark = log.tell()
            self.process = _spawn(["-m", "feedmux", "serve", "benchmarks.chaos:source",
                                   "--bind", self.data, "--control", self.control,
                                   "--log-every", "60", *self.options], log)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with open(self.log, "rb") as log:
                log.seek(mark)
                for line in log.read().decode(errors="replace").splitlines():
                    if "serving " in line and ": data " in line:
                        words = line.split(": data ", 1)[1].split(", ")
                        self.data, self.control = words[0], words[1].split()[-1]
                        return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start within {START_TIMEOUT:g} s "
                           f"(see {self.log})")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def workers(self) -> list[int]:
        """The pids of this server's sampling workers (its child processes)."""
        if not self.alive():
            return []
        assert self.process is not None
        pid = self.process.pid
        try:
            return [int(child) for child in
                    Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []


def _spawn(argv: list[str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *argv], stdout=log, stderr=log,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})


@dataclass
class _Chaos:
    scratch: Path
    seed: int
    step_ms: float
    ranked: _Server = field(init=False)
    reliable: _Server = field(init=False)
    ranks: list[subprocess.Popen[bytes] | None] = field(default_factory=lambda: [None] * RANKS)
    free: list[subprocess.Popen[bytes] | None] = field(default_factory=lambda: [None] * FREE)
    generation: int = 0
    resumed_at: int = 0  # the step the current generation of the job started at
    kills: Counter[str] = field(default_factory=Counter)
    job_restarts: int = 0
    failures: list[str] = field(default_factory=list)
    errors: Counter[int] = field(default_factory=Counter)  # exit code -> trainers that failed
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        logs = self.scratch / "logs"
        logs.mkdir()
        self.ranked = _Server("the ranked server", ["--workers", "2", "--seed", str(self.seed),
                                                    "--hwm", "4"], logs / "ranked-server.log")
        self.reliable = _Server("the reliable server",
                                ["--reliable", "--seed", str(self.seed), "--hwm", "4",
                                 "--min-trainers", str(FREE)], logs / "reliable-server.log")

    # -- starting and restarting --------------------------------------------------------------
    def _trainer(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(self.scratch / "logs" / f"{name}.log", "ab") as log:
            return _spawn(["-m", "benchmarks.chaos", *argv, "--dir", str(self.scratch),
                           "--step-ms", str(self.step_ms)], log)

    def start_job(self) -> None:
        """Every rank, each loading the last checkpoint if there is one (a torchrun restart)."""
        self.generation += 1
        self.resumed_at = (_read_json(self.scratch / "checkpoint.json") or {}).get("step", 0)
        for rank in range(RANKS):
            self.ranks[rank] = self._trainer(
                ["rank", self.ranked.data, self.ranked.control, "--rank", str(rank),
                 "--generation", str(self.generation)], f"rank{rank}")

    def recovered(self) -> bool:
        """Everything runs again and the job made two checkpoints' worth of progress since
        it (re)started: the next kill may come."""
        if not (self.ranked.alive() and self.reliable.alive()):
            return False
        if any(p is None or p.poll() is not None for p in [*self.ranks, *self.free]):
            return False
        marks = [_read_json(self.scratch / f"rank{rank}.step") for rank in range(RANKS)]
        return all(mark is not None and mark["generation"] == self.generation
                   and mark["step"] >= self.resumed_at + 2 * EVERY for mark in marks)

    def start_free(self, index: int) -> None:
        self.free[index] = self._trainer(
            ["free", self.reliable.data, self.reliable.control, "--index", str(index)],
            f"free{index}")

    def supervise(self, stopping: bool = False) -> None:
        """Restart whatever died, as a supervisor would."""
        for server in (self.ranked, self.reliable):
            if not server.alive():
                server.start()
        if any(process is None or process.poll() not in (None, 0) for process in self.ranks) or (
                not stopping and any(process.poll() is not None for process in self.ranks
                                     if process is not None)):
            for rank, process in enumerate(self.ranks):
                self._exited(f"rank {rank}", process)
            for process in self.ranks:
                _kill(process)
            self.job_restarts += 1
            self.start_job()
        for index, process in enumerate(self.free):
            if not stopping and (process is None or process.poll() is not None):
                self._exited(f"free trainer {index}", process)
                self.start_free(index)

    def _exited(self, name: str, process: subprocess.Popen[bytes] | None) -> None:
        """Count how a trainer ended: killed, failed (its server died under it: a real job
        restarts then too), or found a wrong sample (a problem)."""
        code = None if process is None else process.poll()
        if code in WRONG:
            self.failures.append(f"{name}: {WRONG[code]} (exit code {code})")
        elif code not in (None, 0, -signal.SIGKILL):
            self.errors[code] += 1

    def kill_one(self, rng: random.Random) -> str:
        """SIGKILL one process the schedule picks; returns what it was."""
        victim = rng.choice(VICTIMS)
        if victim == "worker":
            pids = self.ranked.workers()
            if not pids:
                return ""
            pid = rng.choice(pids)
        elif victim in ("ranked server", "reliable server"):
            server = self.ranked if victim == "ranked server" else self.reliable
            assert server.process is not None
            pid = server.process.pid
        else:
            group = self.ranks if victim == "rank" else self.free
            process = rng.choice(group)
            assert process is not None
            pid = process.pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return ""
        self.kills[victim] += 1
        return victim

    def stop_everything(self) -> None:
        for process in [*self.ranks, *self.free, *self.others]:
            _kill(process)
        for server in (self.ranked, self.reliable):
            _terminate(server.process)


def _kill(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
    if process is not None:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            pass


def _terminate(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM (a server drains and its workers stop), SIGKILL after a bound."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(15)


def _wait_all(processes: list[subprocess.Popen[bytes] | None], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    for process in processes:
        assert process is not None
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def _last_step(scratch: Path) -> int:
    """The furthest step any rank or checkpoint reached (a rank resumes from the latter)."""
    marks = [_read_json(scratch / name) for name in
             ["checkpoint.json", *(f"rank{rank}.step" for rank in range(RANKS))]]
    return max((mark["step"] for mark in marks if mark is not None), default=0)


def _audit_cli(logs: list[Path], reference: list[Path]) -> tuple[int, str]:
    """``feedmux audit`` as a user runs it: its exit code and its report."""
    argv = [sys.executable, "-m", "feedmux", "audit", *map(str, logs)]
    if reference:
        argv += ["--reference", *map(str, reference)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def _reference(chaos: _Chaos, steps: int) -> list[Path]:
    """The same seeded job without kills, run to ``steps``: its audit logs."""
    folder = chaos.scratch / "reference"
    folder.mkdir()
    (folder / "logs").mkdir()
    server = _Server("the reference server", chaos.ranked.options, folder / "logs" / "server.log")
    try:
        server.start()
        assert server.process is not None
        chaos.others.append(server.process)
        ranks = []
        for rank in range(RANKS):
            with open(folder / "logs" / f"rank{rank}.log", "ab") as log:
                ranks.append(_spawn(
                    ["-m", "benchmarks.chaos", "rank", server.data, server.control, "--rank",
                     str(rank), "--generation", "1", "--dir", str(folder), "--reference",
                     "--stop-at", str(steps)], log))
        chaos.others += ranks
        if not _wait_all(list(ranks), START_TIMEOUT + steps * RANKS / 500):
            chaos.failures.append("the reference run did not end in time")
        chaos.failures += [f"reference rank {rank} exited with code {p.returncode}"
                           for rank, p in enumerate(ranks) if p.returncode != 0]
    finally:
        _terminate(server.process)
    return [folder / f"rank{rank}.log" for rank in range(RANKS)]


def run(minutes: float, seed: int, step_ms: float, keep: str | None = None) -> int:
    begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="feedmux-chaos-") as scratch_dir:
        if keep is not None:
            scratch_dir = keep
            Path(keep).mkdir(parents=True)
        chaos = _Chaos(Path(scratch_dir), seed, step_ms)
        rng = random.Random(seed)
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            chaos.ranked.start()
            chaos.reliable.start()
            chaos.start_job()
            for index in range(FREE):
                chaos.start_free(index)
            next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
            killed = time.monotonic()
            while time.monotonic() - begin < minutes * 60:
                chaos.supervise()
                now = time.monotonic()
                if now >= next_kill and chaos.recovered():
                    chaos.kill_one(rng)
                    killed, next_kill = now, now + rng.uniform(*KILL_EVERY)
                elif now - killed > RECOVERY_TIMEOUT:
                    chaos.failures.append(f"not recovered {RECOVERY_TIMEOUT:g} s after a kill")
                    break
                time.sleep(0.1)
            # The end: a step every rank reaches (a few checkpoints ahead), then everything stops.
            chaos.supervise()
            stop = (_last_step(chaos.scratch) // EVERY + 5) * EVERY
            _write_atomic(chaos.scratch / "stop.json", json.dumps({"step": stop}))
            for process in chaos.free:
                _terminate(process)
            deadline = time.monotonic() + START_TIMEOUT + stop * step_ms / 1000
            while time.monotonic() < deadline:
                chaos.supervise(stopping=True)
                if all(p is not None and p.poll() == 0 for p in [*chaos.ranks, *chaos.free]):
                    break
                time.sleep(0.1)
            else:
                chaos.failures.append("the trainers did not reach their last step in time")
            for server in (chaos.ranked, chaos.reliable):
                _terminate(server.process)
            reference = _reference(chaos, stop)
            ranked_logs = [chaos.scratch / f"rank{rank}.log" for rank in range(RANKS)]
            free_logs = [chaos.scratch / f"free{index}.log" for index in range(FREE)]
            ranked_code, ranked_text = _audit_cli(ranked_logs, reference)
            free_code, free_text = _audit_cli(free_logs, [])
            ranked = audit(load_sessions(map(str, ranked_logs)),
                           load_sessions(map(str, reference)))
            free = audit(load_sessions(map(str, free_logs)))
        finally:
            signal.signal(signal.SIGTERM, previous)
            chaos.stop_everything()
    kills = sum(chaos.kills.values())
    print(f"{minutes:g} min, seed {seed}: {kills} kills survived "
          f"({', '.join(f'{n} {what}' for what, n in sorted(chaos.kills.items()))}), "
          f"{chaos.job_restarts} ranked-job restarts, server starts: "
          f"ranked {chaos.ranked.starts}, reliable {chaos.reliable.starts}; trainers that "
          f"exited with an error (restarted): "
          f"{dict(chaos.errors) if chaos.errors else 'none'}")
    print(f"  ranked job: {stop} steps per rank; {ranked.checked} samples checked in "
          f"{sum(not e.open for e in ranked.epochs)} complete epochs against the "
          f"uninterrupted run; feedmux audit exit {ranked_code}")
    print(f"  reliable trainers: {free.checked} samples checked in "
          f"{sum(not e.open for e in free.epochs)} complete epochs "
          f"({sum(e.redealt for e in free.epochs)} re-dealt after a trainer died); "
          f"feedmux audit exit {free_code}")
    for code, text in ((ranked_code, ranked_text), (free_code, free_text)):
        if code:
            print("\n".join(line for line in text.splitlines() if "ok" not in line[-4:]))
    for failure in chaos.failures:
        print(f"  FAILED: {failure}")
    complete = all(any(not e.open for e in report.epochs) for report in (ranked, free))
    return 0 if not (ranked_code or free_code or chaos.failures) and complete else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=1.0,
                        help="a trainer's time per sample (its training step)")
    parser.add_argument("--keep", metavar="DIR",
                        help="write the logs into DIR (a new folder) and keep them")
    return parser


def _trainer_parser(kind: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.chaos {kind}")
    parser.add_argument("data")
    parser.add_argument("control")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--step-ms", type=float, default=0.0)
    if kind == "rank":
        parser.add_argument("--rank", type=int, required=True)
        parser.add_argument("--generation", type=int, required=True)
        parser.add_argument("--reference", action="store_true")
        parser.add_argument("--stop-at", type=int)
    else:
        parser.add_argument("--index", type=int, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:
        return _rank(_trainer_parser("rank").parse_args(argv[1:]))
    if argv[:1] == ["free"]:
        return _free(_trainer_parser("free").parse_args(argv[1:]))
    args = _parser().parse_args(argv)
    return run(args.minutes, args.seed, args.step_ms, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
