"""One cell of the delivery matrix: a real server, its trainers, one SIGKILLed and restarted.

This module owns what a cell runs and what it reads back: the server's command
line for a combination of modes (free or ranked, one consumer group or two,
sockets or shared memory, one or two sampling workers), the
trainer processes (``tests.integration.trainers``), the kill-and-restart loop and
the records the trainers leave. The kill happens at a condition (the doomed
trainer SIGKILLs itself after a number of samples), the restart once it is dead,
and the survivor holds still until the restarted trainer has its first sample,
so the restarted one always takes part. It judges nothing: the checks of each
mode's promise are the test's. It must never sleep to synchronise or wait
without a bound.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.conftest import ROOT, Endpoints, Spawned, kill_remaining, wait_until

SAMPLER = "tests.integration.samplers:numbered"
STREAMS, PER_STREAM = 4, 40
EPOCH = STREAMS * PER_STREAM
EPOCHS = 2
SAMPLES_PER_MESSAGE = 8
#: The server's and every loader's queue, in messages (the trainers' loaders use 4).
HWM = 4
#: Values per sample: 32 KiB, so a message's array frame (256 KiB) goes through the pool.
WIDTH = 8192
#: The doomed trainer dies inside its 5th message of epoch 1.
DIE_AFTER = 37
#: The survivor waits here for the restarted trainer's first sample.
HOLD_AFTER = 60
#: Seconds a trainer or the server may take to finish (a loaded machine is slow).
FINISH_TIMEOUT = 90.0

#: A record line: (epoch, id) of a free trainer, (epoch, id, position) of a ranked one.
Record = list[tuple[int, ...]]


@dataclass(frozen=True)
class Cell:
    """One combination of delivery modes."""

    ranked: bool
    #: Two consumer groups (the killed trainer's and one nobody disturbs), else the one
    #: group every server has: the loaders that name none.
    groups: bool
    shm: bool
    workers: int

    @property
    def name(self) -> str:
        return "-".join([
            "ranked" if self.ranked else "free",
            "twogroups" if self.groups else "onegroup", "shm" if self.shm else "sockets",
            f"workers{self.workers}",
        ])

    def server_args(self) -> list[str]:
        """``feedmux serve`` arguments after the source."""
        args = ["--arg", f"streams={STREAMS}", "--arg", f"per_stream={PER_STREAM}",
                "--arg", f"width={WIDTH}", "--epochs", str(EPOCHS), "--epoch-size", str(EPOCH),
                "--samples-per-message", str(SAMPLES_PER_MESSAGE), "--hwm", str(HWM),
                "--workers", str(self.workers), "--min-trainers", str(self.trainers_at_start)]
        if not self.shm:
            args.append("--no-shm")
        return args

    @property
    def trainers_at_start(self) -> int:
        """The survivor and the doomed trainer, and the other group's trainer."""
        return 3 if self.groups else 2

    def member(self, rank: int) -> list[str]:
        """Trainer flags of the survivor (rank 0) or the doomed / restarted one (rank 1)."""
        flags: list[str] = []
        if self.ranked:
            flags += ["--rank", str(rank), "--world-size", "2"]
        elif self.groups:
            flags += ["--world-size", "2"]
        if self.groups:
            flags += ["--group", "killed"]
        return flags

    def other_group(self) -> list[str]:
        """Trainer flags of the other group's only trainer, which nobody disturbs."""
        ranked = ["--rank", "0", "--world-size", "1"] if self.ranked else []
        return ["--group", "undisturbed", *ranked]


CELLS = [Cell(*values) for values in itertools.product(
    (False, True), (False, True), (False, True), (1, 2))]


class Trainers:
    """The trainer processes of one cell and the records they write in ``folder``."""

    def __init__(self, server: Spawned, folder: Path) -> None:
        self.server = server
        self.folder = folder
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(self, name: str, *flags: str) -> subprocess.Popen[bytes]:
        """Start trainer ``name`` (its record in ``folder/name``, its views count beside)."""
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.trainers", self.server.data,
             self.server.control, str(self.folder / name), "--views-out",
             str(self.folder / f"{name}.views"), *flags],
            env=self._env, cwd=ROOT, stderr=subprocess.PIPE)
        return self.processes[name]

    def exit_code(self, name: str, timeout: float = FINISH_TIMEOUT) -> int:
        """Wait for trainer ``name`` to exit; its stderr goes into an unexpected failure."""
        process = self.processes[name]
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"trainer {name} still running after {timeout} s") from None
        if process.returncode not in (0, -9):
            raise AssertionError(f"trainer {name} exited {process.returncode}:\n"
                                 f"{stderr.decode(errors='replace')}")
        return process.returncode

    def stderr(self, name: str, timeout: float = FINISH_TIMEOUT) -> str:
        """What trainer ``name`` wrote on stderr, once it exited."""
        _, stderr = self.processes[name].communicate(timeout=timeout)
        return stderr.decode(errors="replace")

    def record(self, name: str) -> Record:
        path = self.folder / name
        if not path.exists():
            return []
        return [tuple(int(field) for field in line.split())
                for line in path.read_text().splitlines()]

    def views(self, name: str) -> int:
        """Samples trainer ``name`` got as shared-memory views (it wrote it at its end)."""
        return int((self.folder / f"{name}.views").read_text())

    def kill_remaining(self) -> None:
        kill_remaining(list(self.processes.values()))


@dataclass
class Outcome:
    """What a cell's trainers handed out: each trainer's record and the views they saw."""

    records: dict[str, Record]
    views: int
    server_log: str


def kill_and_restart(cell: Cell, serve: Callable[..., Spawned], folder: Path) -> Outcome:
    """Run ``cell`` over its 2 epochs: SIGKILL one trainer mid-epoch, restart it, finish."""
    server = serve(SAMPLER, *cell.server_args(), endpoints=Endpoints.ipc(folder))
    trainers = Trainers(server, folder)
    go = folder / "go"
    try:
        names = ["survivor", "doomed", "restarted"]
        trainers.start("survivor", *cell.member(0), "--hold-after", str(HOLD_AFTER),
                       "--go-file", str(go))
        if cell.groups:
            trainers.start("undisturbed", *cell.other_group())
            names.append("undisturbed")
        trainers.start("doomed", *cell.member(1), "--die-after", str(DIE_AFTER),
                       "--step-ms", "1")
        assert trainers.exit_code("doomed") == -9
        trainers.start("restarted", *cell.member(1))
        wait_until(lambda: bool(trainers.record("restarted")), FINISH_TIMEOUT,
                   "the restarted trainer's first sample")
        go.touch()
        for name in names[2:] + names[:1]:
            assert trainers.exit_code(name) == 0, f"trainer {name} was killed"
        assert server.wait(timeout=FINISH_TIMEOUT) == 0, server.stderr
    finally:
        trainers.kill_remaining()
    return Outcome({name: trainers.record(name) for name in names},
                   sum(trainers.views(name) for name in names if name != "doomed"),
                   server.stderr)


def refusal_of(cell: Cell, spawn: Callable[..., Any], folder: Path) -> str:
    """Start ``cell``'s server and a trainer; the stderr of whichever of them refused."""
    server = spawn("serve", SAMPLER, *Endpoints.ipc(folder).args(), *cell.server_args())
    try:
        server.endpoints()
    except AssertionError:
        return str(server.stderr)  # refused at start: it exited before binding
    trainers = Trainers(server, folder)
    try:
        trainers.start("refused", *cell.member(1))
        return trainers.stderr("refused")
    finally:
        trainers.kill_remaining()
