"""A ranked consumer group resumed from its checkpoint gets what the uninterrupted job got.

The job: 2 ranks of a language model in the group ``train`` (batches of 16 by
length, ``bucket_by="tokens"``, ``pad=True``), sharing its server's sampled
stream with an evaluation job (the group ``eval``, one sample at a time). Every
process is a real one: the server (``Server(...).start()``, port 0) and each
trainer (``tests.integration.group_resume_trainer``, ``tests.integration.trainers``).
The reference is an uninterrupted run of the same seeded server; an
interrupted run's ranks each save their state after STEPS batches (in epoch 2)
and exit, and a new pair resumes from the saved states: on the same server
(the buffer still holds epoch 2 from its first message, as the evaluation job
lags), or on a new server with the same seed (its sampler seeks to epoch 2).
Each rank's batches up to the checkpoint plus its batches after must be its
uninterrupted ones. Where the stream can no longer give the checkpoint's epoch
whole, the resumed ranks are refused with the reason and nothing is dealt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedmux import Server
from feedmux.client.remote import fetch_stats
from tests.integration.conftest import ROOT, kill_remaining, wait_until
from tests.integration.trainers import GO_TIMEOUT

pytestmark = pytest.mark.timeout(240)

RAGGED = "tests.integration.bucket_samplers:ragged"
EPOCH = 302  # 2 streams x 151 samples
EPOCHS = 3
#: Each rank checkpoints after this many batches: in epoch 2 (epoch 1 gives each of the
#: 2 ranks 10 batches of 16 at most).
STEPS = 14
Batch = tuple[int, tuple[int, ...]]  # (epoch, ids)


def started(**options: Any) -> Server:
    """A seeded server of the ragged samples (a fresh process each time: port 0)."""
    options = {"factory_kwargs": {"streams": 2, "per_stream": EPOCH // 2}, "epochs": EPOCHS,
               "epoch_size": EPOCH, "seed": 5, "samples_per_message": 8,
               "bucket_window": 64, "min_trainers": 3, "drain_timeout": 120.0,
               "bind": "tcp://127.0.0.1:0", "control": "tcp://127.0.0.1:0", **options}
    return Server(RAGGED, **options).start()


class Processes:
    """Trainer processes, each killed by pid at the end of the test; each one's stderr is
    kept in a file beside its record, for a failure to show."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, server: Server, name: str, module: str, *args: str) -> None:
        with open(self.folder / f"{name}.stderr", "wb") as stderr:
            self.running[name] = subprocess.Popen(
                [sys.executable, "-m", module, server.data_address, server.control_address,
                 str(self.folder / name), *args],
                env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, stderr=stderr)

    def rank(self, server: Server, name: str, rank: int, *args: str) -> None:
        self.start(server, name, "tests.integration.group_resume_trainer", "--group",
                   "train", "--rank", str(rank), "--world-size", "2", *args)

    def evaluation(self, server: Server, *args: str, name: str = "eval") -> None:
        self.start(server, name, "tests.integration.trainers", "--group", "eval", *args)

    def wait(self, name: str, timeout: float = 120) -> int:
        return self.running[name].wait(timeout=timeout)

    def assert_exits(self, codes: dict[str, int]) -> None:
        """Wait for each named trainer; fail with the last lines of the record and of the
        stderr of each that exited with another code than the one given."""
        exits = {name: self.wait(name) for name in codes}
        wrong = [name for name in codes if exits[name] != codes[name]]
        assert not wrong, f"expected exit codes {codes}, got {exits}\n" + "\n".join(
            f"{name}'s record ends: {self.lines(name)[-3:]}\n{name}'s stderr ends:\n"
            f"{self.stderr(name)[-2000:]}" for name in wrong)

    def stderr(self, name: str) -> str:
        path = self.folder / f"{name}.stderr"
        return path.read_text(errors="replace") if path.exists() else ""

    def lines(self, name: str) -> list[str]:
        path = self.folder / name
        return path.read_text().splitlines() if path.exists() else []

    def batches(self, name: str) -> list[Batch]:
        return [(int(epoch), tuple(int(i) for i in ids.split()))
                for epoch, ids in (line.split(" ", 1) for line in self.lines(name))]

    def close(self) -> None:
        kill_remaining(list(self.running.values()))


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.close()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[list[Batch]]:
    """Each rank's batches in a run that nobody interrupts (the evaluation job beside it)."""
    run = Processes(tmp_path_factory.mktemp("uninterrupted"))
    server = started()
    try:
        for rank in range(2):
            run.rank(server, f"whole{rank}", rank)
        run.evaluation(server)
        run.assert_exits({"whole0": 0, "whole1": 0, "eval": 0})
        return [run.batches(f"whole{rank}") for rank in range(2)]
    finally:
        run.close()
        server.stop()


def per_epoch(lines: list[str]) -> dict[int, Counter[int]]:
    """An evaluation trainer's record (``epoch id`` per line) as the ids of each epoch."""
    epochs: dict[int, Counter[int]] = {}
    for line in lines:
        epoch, sample = line.split()
        epochs.setdefault(int(epoch), Counter())[int(sample)] += 1
    return epochs


def checkpointed(processes: Processes, server: Server, tmp_path: Path) -> list[list[Batch]]:
    """The job's ranks take STEPS batches each, save their states and exit."""
    for rank in range(2):
        processes.rank(server, f"first{rank}", rank, "--steps", str(STEPS), "--state",
                       str(tmp_path / f"state{rank}.json"))
    processes.assert_exits({"first0": 0, "first1": 0})
    first = [processes.batches(f"first{rank}") for rank in range(2)]
    assert all(len(batches) == STEPS and batches[-1][0] == 2 for batches in first), (
        "expected each rank's checkpoint in epoch 2")
    return first


def resume(processes: Processes, server: Server, tmp_path: Path, *args: str) -> None:
    for rank in range(2):
        processes.rank(server, f"resumed{rank}", rank, "--resume",
                       str(tmp_path / f"state{rank}.json"), *args)


def test_a_ranked_group_resumes_on_its_server_while_the_evaluation_group_reads(
        processes: Processes, uninterrupted: list[list[Batch]], tmp_path: Path) -> None:
    # The evaluation job holds silent (a free loader says nothing while it is not read):
    # its group has no live member after 3 s, and with the default --group-timeout (10 s)
    # it was dropped, and the buffer's epoch 2 with it, whenever the first run and the
    # resumed ranks' start took longer (under load), and the resumed ranks were refused.
    # The hold is bounded by the trainer's wait for its go; the group outlives that bound.
    server = started(group_timeout=2 * GO_TIMEOUT)
    try:
        # The evaluation job holds after 20 samples of epoch 1 (its loader takes 2
        # messages ahead at most): the buffer keeps epoch 2 from its first message.
        go = tmp_path / "go"
        processes.evaluation(server, "--hold-after", "20", "--go-file", str(go), "--hwm", "2")
        first = checkpointed(processes, server, tmp_path)
        resume(processes, server, tmp_path)
        wait_until(lambda: len(processes.lines("resumed0")) > 0, timeout=60,
                   what="the resumed job's first batch")
        go.touch()  # the evaluation job reads on, beside the resumed job
        processes.assert_exits({"resumed0": 0, "resumed1": 0})
        for rank in range(2):
            assert first[rank] + processes.batches(f"resumed{rank}") == uninterrupted[rank], (
                f"rank {rank}: the resumed run is not the uninterrupted one")
        processes.assert_exits({"eval": 0})
        assert per_epoch(processes.lines("eval")) == {
            epoch: Counter(range(EPOCH)) for epoch in range(1, EPOCHS + 1)}
    finally:
        server.stop()


def test_a_ranked_group_resumes_on_a_new_server_with_the_same_seed(
        processes: Processes, uninterrupted: list[list[Batch]], tmp_path: Path) -> None:
    server = started()
    try:
        processes.evaluation(server, name="eval-before")
        first = checkpointed(processes, server, tmp_path)
    finally:
        server.stop()
    processes.running["eval-before"].kill()
    # Only the job's ranks at first: the new server's sampler starts at epoch 2. Rank 0
    # holds after its first batch (and so its group, and the end of the stream) until the
    # evaluation job has come: it joins at the oldest epoch it can get whole.
    server = started(min_trainers=2)
    try:
        go = tmp_path / "go"
        resume(processes, server, tmp_path, "--hold-after", "1", "--go-file", str(go))
        wait_until(lambda: len(processes.lines("resumed0")) > 0, timeout=60,
                   what="the resumed job's first batch")
        processes.evaluation(server)
        wait_until(lambda: fetch_stats(server.control_address, timeout=5).get(
            "connected_trainers") == 3, timeout=60, what="the evaluation job's trainer")
        go.touch()
        processes.assert_exits({"resumed0": 0, "resumed1": 0})
        for rank in range(2):
            assert first[rank] + processes.batches(f"resumed{rank}") == uninterrupted[rank], (
                f"rank {rank}: the resumed run is not the uninterrupted one")
        processes.assert_exits({"eval": 0})
        seen = per_epoch(processes.lines("eval"))  # nothing, if it came after the last epoch
        assert min(seen, default=2) >= 2, f"the new server sampled epochs {sorted(seen)}"
        assert all(ids == Counter(range(EPOCH)) for ids in seen.values())
    finally:
        server.stop()


def test_a_ranked_group_whose_epoch_the_stream_dropped_is_refused_with_the_reason(
        processes: Processes, tmp_path: Path) -> None:
    # A buffer of 16 messages, a group dropped 1 s after its trainers left, and an
    # evaluation job of 20 ms a sample (30 s for its 5 epochs): it reads on to epoch 3,
    # the sampler ahead of it, while the job's ranks restart.
    server = started(epochs=5, group_buffer=16, group_timeout=1.0)
    try:
        processes.evaluation(server, "--step-ms", "20")
        checkpointed(processes, server, tmp_path)
        wait_until(lambda: len(processes.lines("eval")) >= 2 * EPOCH + 20, timeout=90,
                   what="the evaluation job in epoch 3")
        resume(processes, server, tmp_path)
        processes.assert_exits({"resumed0": 6, "resumed1": 6})
        for rank in range(2):
            [said] = processes.lines(f"resumed{rank}")  # nothing was dealt to it
            assert "group 'train' resumes from a checkpoint at epoch 2" in said
            assert "can no longer give epoch 2 whole" in said
            assert "the oldest epoch it can give whole is" in said
            assert ("resume the job on a server of its own (no group=), started with the "
                    "same --seed") in said
        processes.assert_exits({"eval": 0})  # the other group is not disturbed
        assert per_epoch(processes.lines("eval")) == {
            epoch: Counter(range(EPOCH)) for epoch in range(1, 6)}
    finally:
        server.stop()
