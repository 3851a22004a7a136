"""Shared memory with consumer groups: real server and trainer processes on one host.

One buffered message goes to a member of each group: its large arrays are placed
in the pool once, and each member that receives it holds a cell of the same runs
(:mod:`feedmux._plumbing.shmtable`). Every member gets views, every group every
sample once, nothing is left held at the end, and a SIGKILLed member's holds
come back while the other group's member still views the same runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedmux._plumbing.shm import SHM_DIR, Segment
from feedmux._plumbing.shmtable import ROW_GEN, STATE_COLUMNS, cell_columns, held
from feedmux.client.remote import fetch_stats
from tests.integration.conftest import ROOT, Spawned, child_pids, wait_until
from tests.integration.test_groups import Trainers as GroupTrainers

pytestmark = pytest.mark.timeout(180)

SAMPLER = "tests.integration.samplers:numbered"
STREAMS, PER_STREAM = 4, 25
EPOCH = STREAMS * PER_STREAM
#: 256 KiB of float32 per sample, one sample per message: every array goes through the pool.
WIDTH = 1 << 16
SAMPLE_BYTES = WIDTH * 4
#: The owner column of every claim cell of a row.
ROW_WIDTH_OWNERS = [cell_columns(claim)[1] for claim in range(len(STATE_COLUMNS))]


#: The server's and the loaders' queues, in messages: a dead member's unclaimed references
#: are at most ``2 x HWM`` (the server's cap of references in transit to one trainer).
HWM = 2


def server_args(epochs: int, trainers: int, shm_mib: int, *more: str) -> list[str]:
    return ["--arg", f"streams={STREAMS}", "--arg", f"per_stream={PER_STREAM}",
            "--arg", f"width={WIDTH}", "--epochs", str(epochs), "--samples-per-message", "1",
            "--min-trainers", str(trainers), "--shm-size", str(shm_mib), "--hwm", str(HWM),
            *more]


def mapped_pool(server: Spawned) -> Segment:
    """The server's segment, mapped here (the mapping outlives the server's unlink)."""
    paths: list[Path] = []

    def found() -> bool:
        for pid in [server.pid, *child_pids(server.pid)]:
            paths[:] = sorted(Path(SHM_DIR).glob(f"feedmux-{pid}-*"))
            if paths:
                return True
        return False

    wait_until(found, 30, "the server's shared-memory pool")
    fd = os.open(paths[0], os.O_RDWR)  # read only, but a Segment maps it shared
    try:
        return Segment(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def held_runs(segment: Segment) -> list[int]:
    """The runs something alive holds (a row not free, a cell on its way or claimed)."""
    heads = np.arange(segment.granules)
    return heads[held(segment.table, heads)].tolist()


class Trainers(GroupTrainers):
    """The groups' trainer processes, and keepers (see _KEEPER), each killed at the end."""

    def recorder(self, server: Spawned, name: str, *args: str) -> None:
        """``tests.integration.trainers``: records (epoch, id), counts its views."""
        self.start(server, name, "--views-out", str(self.folder / f"{name}.views"), *args)

    def keeper(self, server: Spawned, name: str, group: str, hold: int, until: int) -> None:
        """A trainer that keeps its first ``hold`` views until sample ``until`` (_KEEPER)."""
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-c", _KEEPER, server.data, server.control, group, str(hold),
             str(until), str(self.folder / name), str(self.folder / f"{name}.ready"),
             str(self.folder / "go")], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)

    def views(self, name: str) -> int:
        return int((self.folder / f"{name}.views").read_text())


#: data, control, group, hold, until, record, ready file, go file. It records (epoch, id)
#: of every sample, keeps its first ``hold`` arrays (views of the pool), says it is ready
#: and waits for the go (bounded: exit 3), then takes a sample every 10 ms (a training
#: step: the server's looks for dead trainers, a few a second, come meanwhile) and at
#: sample ``until`` checks that the arrays it kept were never overwritten (exit 5: a run
#: reused under them) and lets them go.
_KEEPER = """
import os, sys, time
from feedmux import RemoteLoader
data, control, group, hold, until, record, ready, go = sys.argv[1:9]
hold, until, kept = int(hold), int(until), []
with open(record, "w", buffering=1) as out, RemoteLoader(
        data, control=control, group=group, timeout=60, with_meta=True, hwm=2) as loader:
    for count, (meta, sample) in enumerate(loader, start=1):
        if not (sample["x"] == sample["id"]).all():
            sys.exit(4)
        out.write(f"{meta.epoch} {int(sample['id'])}\\n")
        if count <= hold:
            kept.append((int(sample["id"]), sample["x"]))
        if count == hold:
            open(ready, "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(go):  # the test's go, polled (bounded)
                if time.monotonic() > deadline:
                    sys.exit(3)
                time.sleep(0.005)
        if count > hold:
            time.sleep(0.01)
        if count == until:
            if any(not (array == value).all() for value, array in kept):
                sys.exit(5)
            kept.clear()
"""


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[Trainers]:
    started = Trainers(tmp_path)
    yield started
    started.close()


def test_two_groups_of_two_trainers_get_views_every_sample_once_and_nothing_stays_held(
        serve: Callable[..., Any], trainers: Trainers) -> None:
    epochs = 2
    server = serve(SAMPLER, *server_args(epochs, trainers=4, shm_mib=64))
    segment = mapped_pool(server)
    names = {"a": ["a0", "a1"], "b": ["b0", "b1"]}
    for group, members in names.items():
        for name in members:
            trainers.recorder(server, name, "--group", group, "--world-size", "2")
    for members in names.values():
        for name in members:
            assert trainers.wait(name, 90) == 0, f"trainer {name} failed"
    assert server.wait(60) == 0, server.stderr
    every = Counter((epoch, sample) for epoch in range(1, epochs + 1) for sample in range(EPOCH))
    for group, members in names.items():
        seen = Counter(row for name in members for row in trainers.seen(name))
        assert seen == every, f"group {group} did not get every sample exactly once"
        assert all(trainers.seen(name) for name in members), f"a member of {group} got nothing"
        # Views of the pool, not copies: all but what came before a member mapped the pool.
        for name in members:
            count, views = len(trainers.seen(name)), trainers.views(name)
            assert views >= count - 4, f"{name}: {views} views of {count} samples"
    # The stream is over and every trainer gone: no run is held by anything alive, and
    # none was left SHARED by the groups' buffer or lent out by the server.
    assert held_runs(segment) == []


def test_a_sigkilled_members_holds_come_back_while_the_other_group_holds_the_same_runs(
        serve: Callable[..., Any], trainers: Trainers, tmp_path: Path) -> None:
    hold, until = 8, 40
    # 16 MiB: 64 runs of one sample each, reused lowest first; a buffer of 4 messages, so
    # the sampler goes at the pace of the slowest group (the keeper's steps).
    server = serve(SAMPLER, *server_args(1, 2, 16, "--group-buffer", "4"))
    segment = mapped_pool(server)
    trainers.keeper(server, "keeper", "a", hold, until)
    trainers.keeper(server, "doomed", "b", hold, until)
    for name in ("keeper", "doomed"):
        wait_until(lambda name=name: (tmp_path / f"{name}.ready").exists(), 60,
                   f"{name} to hold {hold} views")
    # Both hold the first samples: one copy in the pool, a claim cell each.
    assert fetch_stats(server.control)["shm_bytes_in_use"] >= hold * SAMPLE_BYTES
    doomed = trainers.processes["doomed"]
    claimed = [head for head in held_runs(segment)
               if doomed.pid in segment.table[head, ROW_WIDTH_OWNERS].tolist()]
    # (the first samples may come whole: before the trainer mapped the pool)
    assert len(claimed) >= hold // 2, "the doomed trainer's views are not claimed in the pool"
    generations = segment.table[claimed, ROW_GEN].copy()
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(10)
    # Its group goes on with a successor; the keeper's group goes on as it was, its views
    # of the same runs intact (it checks them at sample ``until``, then lets them go).
    trainers.recorder(server, "successor", "--group", "b")
    (tmp_path / "go").touch()
    assert trainers.wait("keeper", 90) == 0, "the keeper's views were overwritten, or it failed"
    assert trainers.wait("successor", 90) == 0
    assert server.wait(60) == 0, server.stderr
    assert Counter(trainers.seen("keeper")) == Counter((1, sample) for sample in range(EPOCH))
    group_b = Counter(trainers.seen("doomed") + trainers.seen("successor"))
    assert max(group_b.values()) == 1, "group b was handed a sample twice"
    # The dead member's holds came back: once the keeper let go, the server took those
    # runs back and used them again (a new generation each).
    reused = segment.table[claimed, ROW_GEN] > generations
    assert reused.all(), f"runs {np.array(claimed)[~reused].tolist()} were never given back"
    # What it never received (its queue) waits for the orphan timeout: a bounded few.
    assert len(held_runs(segment)) <= 2 * HWM, held_runs(segment)
