"""The supervisor of ``benchmarks.chaos``: real servers and trainers, the events, the oracle.

This module owns the processes of one chaos run: it starts ``feedmux serve``
and the trainers (``python -m benchmarks.chaos rank|free|dataloader``), applies
the events of a schedule drawn by ``benchmarks._chaos_model`` in order (each
once everything recovered from the one before), restarts what died the way a
supervisor would (a server with the same command; the whole ranked job from
its last checkpoint, as torchrun does), runs the reference job without events,
and asks ``feedmux audit`` (the command, as a user runs it) whether each mode
kept its promise. It must never decide on its own that a sample was lost or
repeated: that judgement is the audit's. Every wait is bounded; every process
it started is killed by pid on every exit path.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import feedmux
from benchmarks._chaos_model import EPOCH, FREE_SERVER, Event, Scenario, Setup, draw
from benchmarks.chaos import EVERY, WRONG, read_json, write_atomic

__all__ = ["run"]

#: Seconds a start, a restart or the end of a run may take on a loaded machine.
START_TIMEOUT = 60.0
#: Seconds after an event until everything must have recovered.
RECOVERY_TIMEOUT = 120.0
#: Seconds the end of a run may take (the trainers reach their last step, the stream ends).
END_TIMEOUT = 180.0
#: The reference run replays every step of the job, which takes longer the longer the job
#: ran and the busier the machine: it may go on while its ranks' logs grow, until they
#: stood still this long, or until :data:`REFERENCE_CAP` (a 2-minute mix replays about
#: 26,000 steps of 2 ranks: over 180 s on a 2-core host with two busy loops).
REFERENCE_STALL, REFERENCE_CAP = 60.0, 1800.0
#: At the end, how long the free trainers have to hand out what they hold once their server
#: stopped, and how long their audit logs must stand still to say they did.
DRAIN_TIMEOUT, DRAIN_QUIET = 30.0, 2.0
#: Epochs of the DataLoader's server (a pass of its workers per epoch).
DATALOADER_EPOCHS = 3
#: Seconds a DataLoader worker waits for a sample before it fails its pass.
DATALOADER_TIMEOUT = 20.0


@dataclass
class _Server:
    """A ``feedmux serve`` process and how to start it again with the same command."""

    name: str
    source: str
    options: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    data: str = "tcp://127.0.0.1:0"
    control: str = "tcp://127.0.0.1:0"
    starts: int = 0

    def start(self, *extra: str) -> None:
        self.starts += 1
        with open(self.log, "ab") as log:
            mark = log.tell()
            self.process = _spawn(["-m", "feedmux", "serve", self.source, "--bind", self.data,
                                   "--control", self.control, "--log-every", "60",
                                   *self.options, *extra], log)
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
            time.sleep(0.05)  # the poll interval of a bounded wait
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


def _signal(process: subprocess.Popen[bytes], signum: int) -> bool:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        return False
    return True


@dataclass
class _Chaos:
    """The processes of one run and what happened to them."""

    setup: Setup
    scratch: Path
    step_ms: float
    ranked: _Server | None = None
    free_server: _Server | None = None
    #: The free server was stopped at the end (the supervisor leaves it stopped).
    free_stopped: bool = False
    torch_server: _Server | None = None
    ranks: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    free: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)  # index -> process
    dataloader: subprocess.Popen[bytes] | None = None
    generation: int = 0
    finished: bool = False  # the ranked job ran to its end (--epochs)
    ended: bool = False  # the ranked server ended its stream (--epochs)
    pause_at: dict[int, int] = field(default_factory=dict)  # rank -> step to stop at
    applied: Counter[str] = field(default_factory=Counter)
    job_restarts: int = 0
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # trainers that failed (restarted)
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    begin: float = field(default_factory=time.monotonic)
    progress: dict[str, int] = field(default_factory=dict)  # what recovered() compares

    def __post_init__(self) -> None:
        (self.scratch / "logs").mkdir(parents=True)
        scenario, seed = self.setup.scenario, str(self.setup.seed)
        if self.setup.ranks:
            self.ranked = _Server("the ranked server", scenario.source, self.ranked_options(),
                                  self.scratch / "logs" / "ranked-server.log")
            self.ranks = [None] * self.setup.ranks
        if scenario.free:
            self.free_server = _Server("the free server", scenario.source,
                                       [*FREE_SERVER, "--seed", seed, "--hwm", "4"],
                                       self.scratch / "logs" / "free-server.log")
        if scenario.dataloader:
            self.torch_server = _Server(
                "the DataLoader's server", scenario.source,
                [*FREE_SERVER, "--seed", seed, "--epochs", str(DATALOADER_EPOCHS)],
                self.scratch / "logs" / "dataloader-server.log")

    def ranked_options(self) -> list[str]:
        setup = self.setup
        options = ["--seed", str(setup.seed), "--hwm", str(setup.hwm), "--workers",
                   str(setup.workers), *setup.scenario.ranked_extra]
        if setup.scenario.ranked_epochs:
            options += ["--epochs", str(setup.scenario.ranked_epochs)]
        if setup.epoch_size:
            options += ["--epoch-size", str(EPOCH[setup.scenario.source])]
        return options

    def say(self, text: str) -> None:
        print(f"  [{time.monotonic() - self.begin:6.1f} s] {text}", flush=True)

    # -- trainers -----------------------------------------------------------------------------
    def _trainer(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(self.scratch / "logs" / f"{name}.log", "ab") as log:
            return _spawn(["-m", "benchmarks.chaos", *argv, "--dir", str(self.scratch),
                           "--step-ms", str(self.step_ms)], log)

    def _rank_argv(self, rank: int, *extra: str) -> list[str]:
        assert self.ranked is not None
        argv = ["rank", self.ranked.data, self.ranked.control, "--rank", str(rank),
                "--world-size", str(self.setup.ranks), "--generation", str(self.generation),
                "--hwm", "0" if self.setup.scenario.ranked_epochs else "4", *extra]
        if self.setup.scenario.ranked_epochs:
            argv.append("--until-end")
        if self.pause_at.get(rank):
            argv += ["--pause-at", str(self.pause_at[rank])]
        return argv

    def start_job(self) -> None:
        """Every rank, each loading the last checkpoint if there is one (a torchrun restart)."""
        self.generation += 1
        for rank in range(self.setup.ranks):
            self.ranks[rank] = self._trainer(self._rank_argv(rank), f"rank{rank}")
        self.progress["job"] = self.generation

    def start_rank_alone(self, rank: int, step: int) -> None:
        """``rank`` alone, without a checkpoint, after its predecessor's ``step`` steps."""
        self.pause_at.pop(rank, None)
        self.ranks[rank] = self._trainer(
            self._rank_argv(rank, "--fresh", "--start-step", str(step)), f"rank{rank}")

    def start_free(self) -> int:
        assert self.free_server is not None
        index = max(self.free, default=-1) + 1
        while (self.scratch / f"free{index}.log").exists():
            index += 1
        argv = ["free", self.free_server.data, self.free_server.control, "--index", str(index)]
        if self.setup.scenario.free_batch and index % 2:
            argv += ["--batch-size", str(self.setup.scenario.free_batch)]
            if index % 4 == 3:  # every other one of them in length buckets (bucket_by=)
                argv += ["--bucket-by", "n"]
        self.free[index] = self._trainer(argv, f"free{index}")
        return index

    def start_dataloader(self) -> None:
        assert self.torch_server is not None
        with open(self.scratch / "logs" / "dataloader.log", "ab") as log:
            self.dataloader = _spawn(
                ["-m", "benchmarks.chaos", "dataloader", self.torch_server.data,
                 self.torch_server.control, "--dir", str(self.scratch), "--epochs",
                 str(DATALOADER_EPOCHS), "--timeout", str(DATALOADER_TIMEOUT), "--step-ms",
                 str(self.step_ms)], log)

    def start(self) -> None:
        for server in (self.ranked, self.free_server, self.torch_server):
            if server is not None:
                server.start()
        if self.ranked is not None:
            self.start_job()
        for _ in range(self.setup.scenario.free):
            self.start_free()
        if self.torch_server is not None:
            self.start_dataloader()

    # -- the state ----------------------------------------------------------------------------
    def marks(self) -> list[int]:
        """Each rank's published step (0: none yet)."""
        return [int((read_json(self.scratch / f"rank{rank}.step") or {}).get("step", 0))
                for rank in range(self.setup.ranks)]

    def free_handed(self) -> int:
        """The bytes of the free trainers' audit logs: grows while they hand out."""
        return sum(path.stat().st_size for path in self.scratch.glob("free*.log"))

    def snapshot(self) -> None:
        """Note where things stand: the next event waits until they moved on."""
        self.progress.update({f"rank{rank}": mark for rank, mark in enumerate(self.marks())})
        self.progress["free"] = self.free_handed()

    def recovered(self) -> bool:
        """Everything runs again and made progress since the last event."""
        if self.free_server is not None and not self.free_server.alive():
            return False
        if self.ranked is not None and not (self.ranked.alive() or self.ended):
            return False
        if self.ranked is not None and not self.finished:
            if any(process is None or process.poll() is not None for process in self.ranks):
                return False
            if any(mark < self.progress.get(f"rank{rank}", 0) + EVERY
                   for rank, mark in enumerate(self.marks())):
                return False
        if self.free_server is not None:
            if any(process.poll() is not None for process in self.free.values()):
                return False
            if self.free_handed() <= self.progress.get("free", 0):
                return False
        return True

    def supervise(self, stopping: bool = False) -> None:
        """Restart whatever died that no event asked for, as a supervisor would."""
        for server in (self.ranked, self.free_server):
            if server is None or server.alive() or (server is self.ranked and self.ended) \
                    or (server is self.free_server and self.free_stopped):
                continue
            assert server.process is not None
            if server is self.ranked and self.setup.scenario.ranked_epochs \
                    and server.process.poll() == 0:
                self.ended = True  # it served its epochs: the end of the stream
                self.say(f"{server.name} ended its stream")
                continue
            self.errors.append(f"{server.name} exited with code {server.process.poll()}")
            server.start()
        if self.ranked is not None and not self.finished:
            codes = [None if p is None else p.poll() for p in self.ranks]
            if self.setup.scenario.ranked_epochs and (
                    all(code == 0 for code in codes)
                    or (self.ended and all(code is not None for code in codes))):
                self.finished = True
                for rank, code in enumerate(codes):
                    self._exited(f"rank {rank}", code)
            elif any(code not in (None, 0) for code in codes) or (
                    not stopping and not self.setup.scenario.ranked_epochs
                    and any(code is not None for code in codes)):
                for rank, code in enumerate(codes):
                    self._exited(f"rank {rank}", code)
                for process in self.ranks:
                    _kill(process)
                self.job_restarts += 1
                self.say(f"a rank exited (codes {codes}): the job restarts from its last "
                         f"checkpoint")
                self.start_job()
        for index, process in list(self.free.items()):
            code = process.poll()
            if code is not None:
                self._exited(f"free trainer {index}", code)
                del self.free[index]
                if not stopping:
                    self.say(f"free trainer {index} exited with code {code}: a new one")
                    self.start_free()

    def _exited(self, name: str, code: int | None) -> None:
        """Count how a trainer ended on its own: a wrong sample is a problem; another error
        (its server was away too long: a real job restarts then too) is reported."""
        if code in WRONG:
            self.failures.append(f"{name}: {WRONG[code]} (exit code {code})")
        elif code not in (None, 0, -signal.SIGKILL):
            self.errors.append(f"{name} exited with code {code}")

    # -- the events ---------------------------------------------------------------------------
    def apply(self, event: Event, rng: random.Random) -> None:
        self.say(event.describe())
        self.applied[event.kind] += 1
        if event.kind == "join":
            self.say(f"  free trainer {self.start_free()} joined")
        elif event.kind in ("leave", "kill-free", "stop-free"):
            self._free_event(event)
        elif event.kind == "kill-rank":
            self._kill_rank(event)
        elif event.kind == "resume-job":
            self._resume_job()
        elif event.kind == "server":
            self._server_event(event)
        elif event.kind == "kill-worker":
            assert self.ranked is not None
            pids = self.ranked.workers()
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.say(f"  worker {pid} SIGKILLed")
                except ProcessLookupError:
                    pass
        self.snapshot()

    def _free_event(self, event: Event) -> None:
        if not self.free:
            return
        index = sorted(self.free)[event.target % len(self.free)]
        process = self.free[index]
        if event.kind == "stop-free":
            _signal(process, signal.SIGSTOP)
            time.sleep(float(event.how.split()[0]))  # how long it stays frozen: the event
            _signal(process, signal.SIGCONT)
            self.say(f"  free trainer {index} continued")
            return
        del self.free[index]
        _signal(process, signal.SIGTERM if event.kind == "leave" else signal.SIGKILL)
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait(15)
            self.failures.append(f"free trainer {index} did not leave within 30 s of SIGTERM")
        if event.kind == "leave" and code != 0:
            self.errors.append(f"free trainer {index} left with exit code {code}")
        self.say(f"  free trainer {index} {'left' if event.kind == 'leave' else 'killed'} "
                 f"(exit code {code})")

    def _kill_rank(self, event: Event) -> None:
        rank = event.target
        process = self.ranks[rank]
        assert process is not None
        if event.step:  # it stops reading at that step: wait for it, then kill it
            marker = self.scratch / f"rank{rank}.paused"
            deadline = time.monotonic() + RECOVERY_TIMEOUT
            while not marker.exists() and process.poll() is None:
                if time.monotonic() > deadline:
                    self.failures.append(f"rank {rank} never reached step {event.step}")
                    return
                time.sleep(0.02)  # the poll interval of a bounded wait
            if process.poll() is not None:
                self.failures.append(f"rank {rank} ended (code {process.poll()}) before "
                                     f"step {event.step}")
                return
            time.sleep(event.hold)  # how long it stays without reading: the event
        _kill(process)
        if event.how == "job":  # the supervisor's next look restarts the whole job
            return
        step = event.step or self.marks()[rank]
        self.start_rank_alone(rank, step)
        self.say(f"  rank {rank} restarted alone after step {step}, without a checkpoint")

    def _resume_job(self) -> None:
        """Freeze the job at a moment when some rank is past the last checkpoint, kill it,
        and start it again from that checkpoint."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT
        ranks = [p for p in self.ranks if p is not None]
        while time.monotonic() < deadline:
            for process in ranks:
                _signal(process, signal.SIGSTOP)
            checkpoint = read_json(self.scratch / "checkpoint.json")
            if (checkpoint is not None and checkpoint["step"] >= EVERY
                    and any(mark > checkpoint["step"] for mark in self.marks())):
                for process in ranks:
                    _kill(process)
                self.job_restarts += 1
                self.say(f"  the job killed at steps {self.marks()}, resumed from the "
                         f"checkpoint at step {checkpoint['step']}")
                self.start_job()
                return
            for process in ranks:
                _signal(process, signal.SIGCONT)
            time.sleep(0.01 + random.random() * 0.05)  # let them run a little (not seeded)
        self.errors.append("resume-job: no moment with a rank past the checkpoint")

    def _server_event(self, event: Event) -> None:
        server = self.ranked if event.server == "ranked" else self.free_server
        assert server is not None and server.process is not None
        how, _, run = event.how.partition("-")
        survivors = list(self.free.values()) if run == "new-run" else []
        for process in survivors:  # slow to notice the restart (a loaded host)
            _signal(process, signal.SIGSTOP)
        _signal(server.process, signal.SIGTERM if how == "TERM" else signal.SIGKILL)
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(15)
        if server is self.free_server and run == "new-run":
            server.start("--min-trainers", "1")
            index = self.start_free()  # its hello comes first: the server begins a new run
            log = self.scratch / f"free{index}.log"
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and not _handed_out(log):
                time.sleep(0.05)  # the poll interval of a bounded wait
            for process in survivors:
                _signal(process, signal.SIGCONT)
            self.say(f"  {server.name} restarted, free trainer {index} joined first and "
                     f"handed out, then the {len(survivors)} survivors went on")
        elif server is self.free_server:
            live = sum(process.poll() is None for process in self.free.values())
            server.start("--min-trainers", str(max(1, live)))
            self.say(f"  {server.name} restarted (--min-trainers {max(1, live)})")
        else:
            server.start()
            self.say(f"  {server.name} restarted")

    # -- the end ------------------------------------------------------------------------------
    def _deaths_noticed(self) -> None:
        """Wait (bounded) until the free server took every SIGKILLed free trainer for lost
        and dealing went on after it (a lost trainer's rest is dealt before anything new):
        a server stopped 0.3 s after the last event, a kill, never re-dealt what the dead
        trainer held (the short mix's seed 1: "epoch 127: 26 missing")."""
        assert self.free_server is not None
        deadline = time.monotonic() + RECOVERY_TIMEOUT
        while time.monotonic() < deadline:
            alive = sum(process.poll() is None for process in self.free.values())
            try:
                connected = feedmux.fetch_stats(self.free_server.control,
                                                timeout=5)["connected_trainers"]
            except feedmux.FeedmuxError:
                connected = None
            if connected is not None and connected <= alive:
                break
            time.sleep(0.2)  # the poll interval of a bounded wait
        else:
            self.failures.append(f"the free server still counted a dead trainer "
                                 f"{RECOVERY_TIMEOUT:g} s after the last event")
            return
        handed = self.free_handed()
        while time.monotonic() < deadline and self.free_handed() <= handed:
            time.sleep(0.1)  # the poll interval of a bounded wait

    def _drained(self) -> None:
        """Wait (bounded) until the free trainers handed out what they hold."""
        logs = [self.scratch / f"free{index}.log" for index in self.free]
        if not _quiet(logs):
            self.errors.append(f"the free trainers still handed out {DRAIN_TIMEOUT:g} s "
                               f"after their server stopped")

    def finish(self) -> int | None:
        """Stop everything at a common end; returns the ranked job's last step (None: it ran
        to the end of its stream, or there is none)."""
        stop = None
        if self.ranked is not None and not self.setup.scenario.ranked_epochs:
            self.supervise()
            checkpoint = (read_json(self.scratch / "checkpoint.json") or {}).get("step", 0)
            stop = (max([checkpoint, *self.marks()]) // EVERY + 5) * EVERY
            write_atomic(self.scratch / "stop.json", json.dumps({"step": stop}))
        if self.free_server is not None:
            # The free server stops first and the free trainers hand out what they hold
            # before they are stopped: the audit takes an epoch as complete once it lies
            # further than the closing trainers' credit behind the furthest hand-out, and a
            # trainer frozen just before the end holds an epoch the others have left that
            # far behind (seed 5 of the mix: its tail, 149 samples, "missing").
            self._deaths_noticed()
            self.free_stopped = True
            _terminate(self.free_server.process)
            self._drained()
        for index, process in list(self.free.items()):
            _terminate(process)
            if process.returncode != 0:
                self.errors.append(f"free trainer {index} left with exit code "
                                   f"{process.returncode}")
        self.free.clear()
        deadline = time.monotonic() + END_TIMEOUT
        while self.ranked is not None and time.monotonic() < deadline:
            self.supervise(stopping=True)
            if self.finished or all(p is not None and p.poll() == 0 for p in self.ranks):
                break
            time.sleep(0.1)  # the poll interval of a bounded wait
        else:
            if self.ranked is not None:
                self.failures.append(f"the ranks did not reach their end within "
                                     f"{END_TIMEOUT:g} s")
        if self.dataloader is not None:
            try:
                self.dataloader.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.failures.append("the DataLoader did not end in time")
                _kill(self.dataloader)
            if self.dataloader.returncode in WRONG:
                self.failures.append(f"the DataLoader: {WRONG[self.dataloader.returncode]}")
            elif self.dataloader.returncode != 0:
                self.errors.append(f"the DataLoader exited with code "
                                   f"{self.dataloader.returncode}: " + _last_line(
                                       self.scratch / "logs" / "dataloader.log"))
        for server in (self.ranked, self.free_server, self.torch_server):
            if server is not None:
                _terminate(server.process)
        return stop

    def stop_everything(self) -> None:
        for process in [*self.ranks, *self.free.values(), self.dataloader, *self.others]:
            _kill(process)
        for server in (self.ranked, self.free_server, self.torch_server):
            if server is not None:
                _terminate(server.process)


def _quiet(logs: list[Path], timeout: float = DRAIN_TIMEOUT, quiet: float = DRAIN_QUIET) -> bool:
    """Wait until none of the audit ``logs`` has grown for ``quiet`` seconds (their
    trainers handed out what they held), ``timeout`` at most; whether they did."""
    deadline = time.monotonic() + timeout
    sizes: list[int] = []
    since = time.monotonic()
    while time.monotonic() < deadline:
        now_sizes = [log.stat().st_size if log.exists() else 0 for log in logs]
        if now_sizes != sizes:
            sizes, since = now_sizes, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return True
        time.sleep(0.1)  # the poll interval of a bounded wait
    return False


def _progressing(processes: list[subprocess.Popen[bytes]], logs: list[Path],
                 stall: float = REFERENCE_STALL, cap: float = REFERENCE_CAP) -> str | None:
    """Wait until ``processes`` exited, as long as one of the ``logs`` grows within every
    ``stall`` seconds and ``cap`` seconds at most; None, or what went wrong."""
    start = since = time.monotonic()
    sizes: list[int] = []
    while any(process.poll() is None for process in processes):
        now = time.monotonic()
        now_sizes = [log.stat().st_size if log.exists() else 0 for log in logs]
        if now_sizes != sizes:
            sizes, since = now_sizes, now
        elif now - since >= stall:
            return f"stood still for {stall:g} s (its logs did not grow)"
        if now - start >= cap:
            return f"did not end within {cap:g} s"
        time.sleep(0.2)  # the poll interval of a bounded wait
    return None


def _handed_out(log: Path) -> bool:
    """Whether the audit log ``log`` holds a hand-out record yet."""
    try:
        return b"\nH " in log.read_bytes()
    except OSError:
        return False


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _reference(chaos: _Chaos, stop: int | None) -> list[Path]:
    """The same seeded job without events, run to ``stop`` (or to its stream's end)."""
    assert chaos.ranked is not None
    folder = chaos.scratch / "reference"
    (folder / "logs").mkdir(parents=True)
    server = _Server("the reference server", chaos.ranked.source, chaos.ranked_options(),
                     folder / "logs" / "server.log")
    try:
        server.start()
        assert server.process is not None
        chaos.others.append(server.process)
        ranks = []
        for rank in range(chaos.setup.ranks):
            argv = ["-m", "benchmarks.chaos", "rank", server.data, server.control, "--rank",
                    str(rank), "--world-size", str(chaos.setup.ranks), "--generation", "1",
                    "--dir", str(folder), "--reference",
                    "--hwm", "0" if chaos.setup.scenario.ranked_epochs else "4"]
            argv += ["--until-end"] if stop is None else ["--stop-at", str(stop)]
            with open(folder / "logs" / f"rank{rank}.log", "ab") as log:
                ranks.append(_spawn(argv, log))
        chaos.others += ranks
        logs = [folder / f"rank{rank}.log" for rank in range(chaos.setup.ranks)]
        problem = _progressing(ranks, logs)
        if problem is not None:
            chaos.failures.append(f"the reference run {problem}")
        for rank, process in enumerate(ranks):
            if process.poll() not in (0, None):
                chaos.failures.append(f"reference rank {rank} exited with code "
                                      f"{process.returncode}")
    finally:
        _terminate(server.process)
    return [folder / f"rank{rank}.log" for rank in range(chaos.setup.ranks)]


def _audit(logs: list[Path], *options: str) -> tuple[int, str]:
    """``feedmux audit`` as a user runs it: its exit code and its report."""
    argv = [sys.executable, "-m", "feedmux", "audit", *map(str, logs), *options]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def _summary(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else "(no output)"


def run(scenario: Scenario, seed: int, minutes: float, step_ms: float,
        keep: str | None = None) -> int:
    """One run of ``scenario`` from ``seed``: 0 if the audit found every promise kept."""
    setup = draw(seed, scenario, minutes)
    print(f"chaos: {setup.describe()}", flush=True)
    verdicts: list[tuple[str, int, str]] = []
    with tempfile.TemporaryDirectory(prefix="feedmux-chaos-") as scratch_dir:
        scratch = Path(keep if keep is not None else scratch_dir)
        chaos = _Chaos(setup, scratch, step_ms)
        rng = random.Random(seed)
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            for event in setup.events:  # a rank that stops at a step knows it from its start
                if event.kind == "kill-rank" and event.step:
                    chaos.pause_at.setdefault(event.target, event.step)
            chaos.start()
            chaos.snapshot()
            for event in setup.events:
                due = time.monotonic() + event.pause
                while (time.monotonic() < due or not (event.step or chaos.recovered())):
                    if time.monotonic() > due + RECOVERY_TIMEOUT:
                        chaos.failures.append(f"not recovered {RECOVERY_TIMEOUT:g} s after "
                                              f"the event before '{event.describe()}'")
                        break
                    chaos.supervise()
                    time.sleep(0.1)  # the poll interval of a bounded wait
                else:
                    chaos.apply(event, rng)
                    continue
                break
            stop = chaos.finish()
            chaos.say("the end: auditing")
            if chaos.ranked is not None:
                reference = _reference(chaos, stop)
                epochs = scenario.ranked_epochs
                code, text = _audit([scratch / f"rank{r}.log" for r in range(setup.ranks)],
                                    "--reference", *map(str, reference),
                                    *(["--epochs", str(epochs)] if epochs else []))
                verdicts.append(("ranked job", code, text))
            if chaos.free_server is not None:
                code, text = _audit(sorted(scratch.glob("free*.log")))
                verdicts.append(("free trainers", code, text))
            if chaos.torch_server is not None:
                logs = sorted(scratch.glob("dataloader-*.log"))
                code, text = ((1, "no DataLoader worker wrote an audit log") if not logs else
                              _audit(logs, "--epochs", str(DATALOADER_EPOCHS)))
                verdicts.append(("DataLoader", code, text))
        finally:
            signal.signal(signal.SIGTERM, previous)
            chaos.stop_everything()
        code = _report(setup, chaos, verdicts)
        if code and keep is None:  # the evidence of a failed run outlives it
            kept = tempfile.mkdtemp(prefix=f"feedmux-chaos-{scenario.name}-{seed}-")
            shutil.copytree(scratch, kept, dirs_exist_ok=True)
            print(f"  the run's logs are kept in {kept}", flush=True)
        return code


def _report(setup: Setup, chaos: _Chaos, verdicts: list[tuple[str, int, str]]) -> int:
    applied = ", ".join(f"{n} {kind}" for kind, n in sorted(chaos.applied.items())) or "none"
    servers = ", ".join(f"{server.name} {server.starts}" for server in
                        (chaos.ranked, chaos.free_server, chaos.torch_server) if server)
    print(f"seed {setup.seed} ({setup.scenario.name}): events applied: {applied}; "
          f"ranked-job restarts {chaos.job_restarts}; server starts: {servers}")
    if chaos.errors:
        print(f"  trainers or servers that exited on their own: {'; '.join(chaos.errors)}")
    bad = bool(chaos.failures)
    for name, code, text in verdicts:
        print(f"  {name}: feedmux audit exit {code}: {_summary(text)}")
        if code:
            bad = True
            print("\n".join(f"    {line}" for line in text.splitlines()
                            if "PROBLEM" in line or "error" in line))
    for failure in chaos.failures:
        print(f"  FAILED: {failure}")
    print(f"seed {setup.seed} ({setup.scenario.name}): {'PROBLEMS' if bad else 'ok'} "
          f"(replay: python -m benchmarks.chaos --focus {setup.scenario.name} "
          f"--seed {setup.seed})", flush=True)
    return 1 if bad else 0
