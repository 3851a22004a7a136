"""Consumer groups end to end: one server process, trainer processes in several groups.

Every group must receive the whole stream, every epoch complete, sampled once;
a slow group holds the others back without loss; a group that joins mid-stream
starts at the next epoch; a group whose trainers all died stops holding the
others back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from feedmux.client.remote import fetch_stats
from tests.integration.conftest import ROOT, Spawned, wait_until

SAMPLER = "tests.integration.samplers:numbered"
#: 4 streams x 50 samples: ids 0 .. 199 once per epoch.
EPOCH = 200


class Trainers:
    """Trainer processes (``tests.integration.trainers``), each killed by pid at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, server: Spawned, name: str, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.trainers", server.data, server.control,
             str(self.folder / name), *args], env=env, cwd=ROOT)

    def wait(self, name: str, timeout: float = 60) -> int:
        return self.processes[name].wait(timeout=timeout)

    def seen(self, name: str) -> list[tuple[int, int]]:
        """(epoch, id) of every sample trainer ``name`` was handed, in order."""
        path = self.folder / name
        if not path.exists():
            return []
        return [(int(e), int(i)) for e, i in
                (line.split() for line in path.read_text().splitlines() if line.strip())]

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[Trainers]:
    started = Trainers(tmp_path)
    yield started
    started.close()


def per_epoch(seen: list[tuple[int, int]]) -> dict[int, Counter[int]]:
    epochs: dict[int, Counter[int]] = {}
    for epoch, sample in seen:
        epochs.setdefault(epoch, Counter())[sample] += 1
    return epochs


WHOLE_EPOCH = Counter(range(EPOCH))


def test_three_groups_each_see_every_sample_once_per_epoch(
        serve: Callable[..., Spawned], trainers: Trainers) -> None:
    server = serve(SAMPLER, "--epochs", "3", "--samples-per-message", "8",
                   "--group-buffer", "16", "--min-trainers", "4")
    trainers.start(server, "a", "--group", "a")
    trainers.start(server, "b0", "--group", "b", "--world-size", "2")
    trainers.start(server, "b1", "--group", "b", "--world-size", "2")
    trainers.start(server, "default")
    for name in ("a", "b0", "b1", "default"):
        assert trainers.wait(name) == 0, f"trainer {name} failed"
    assert server.wait(timeout=30) == 0
    groups = {"a": trainers.seen("a"), "b": trainers.seen("b0") + trainers.seen("b1"),
              "default": trainers.seen("default")}
    for name, seen in groups.items():
        assert per_epoch(seen) == {1: WHOLE_EPOCH, 2: WHOLE_EPOCH, 3: WHOLE_EPOCH}, name
    # Both trainers of group b took part: the group split the stream.
    assert trainers.seen("b0") and trainers.seen("b1")
    # Sampled once: the server's log counts 3 epochs of EPOCH samples, not one per group.
    assert server.stderr.count(f"complete: {EPOCH} samples") == 3


def test_a_slow_group_holds_the_others_back_without_loss(
        serve: Callable[..., Spawned], trainers: Trainers) -> None:
    # Large samples (80 kB), so that socket buffers cannot hide the slow trainer's lag.
    server = serve(SAMPLER, "--arg", "width=20000", "--epochs", "2", "--samples-per-message",
                   "5", "--hwm", "2", "--group-buffer", "4", "--min-trainers", "2")
    trainers.start(server, "fast", "--group", "fast")
    trainers.start(server, "slow", "--group", "slow", "--step-ms", "5")

    def held_back() -> bool:
        stats = fetch_stats(server.control, timeout=5)
        return stats.get("lagging_group") == "slow" and stats.get("group_buffer_full") == 1

    wait_until(held_back, timeout=30, what="the stats to name group slow as holding back")
    stats = fetch_stats(server.control, timeout=5)
    # The fast group is held back: it got less than the whole run while slow works.
    assert int(stats["group.fast.delivered_samples"]) < 2 * EPOCH
    for name in ("fast", "slow"):
        assert trainers.wait(name) == 0
        assert per_epoch(trainers.seen(name)) == {1: WHOLE_EPOCH, 2: WHOLE_EPOCH}, name
    assert server.wait(timeout=30) == 0
    assert "group slow lags" in server.stderr


@pytest.mark.slow
def test_a_group_joining_in_epoch_2_starts_at_epoch_3_with_whole_epochs(
        serve: Callable[..., Spawned], trainers: Trainers, tmp_path: Path) -> None:
    # Epochs of 400 large samples, paced by group first's trainer (3 ms a sample): the
    # late group joins early in epoch 2, well before the sampler reaches epoch 3.
    server = serve(SAMPLER, "--arg", "per_stream=100", "--arg", "width=20000",
                   "--epochs", "4", "--samples-per-message", "5", "--hwm", "2",
                   "--group-buffer", "4", "--min-trainers", "1")
    whole = Counter(range(400))
    go = tmp_path / "go"
    # The late trainer is up (imports done) but connects only on the go.
    trainers.start(server, "late", "--group", "late", "--start-file", str(go))
    trainers.start(server, "first", "--group", "first", "--step-ms", "3")

    def early_in_epoch_2() -> bool:
        stats = fetch_stats(server.control, timeout=5)
        return stats.get("group.first.epoch") == 2 and int(
            stats.get("group.first.position") or 0) < 100

    wait_until(early_in_epoch_2, timeout=30, what="group first early in epoch 2")
    go.touch()
    for name in ("first", "late"):
        assert trainers.wait(name) == 0
    assert server.wait(timeout=30) == 0
    assert per_epoch(trainers.seen("first")) == {e: whole for e in (1, 2, 3, 4)}
    late = trainers.seen("late")
    assert late[0][0] == 3, f"the late group started in epoch {late[0][0]}"
    assert per_epoch(late) == {3: whole, 4: whole}


@pytest.mark.slow
def test_a_group_that_disappears_stops_holding_the_others_back(
        serve: Callable[..., Spawned], trainers: Trainers) -> None:
    server = serve(SAMPLER, "--arg", "width=20000", "--epochs", "2", "--samples-per-message",
                   "5", "--hwm", "2", "--group-buffer", "4", "--group-timeout", "1",
                   "--min-trainers", "2")
    trainers.start(server, "stay", "--group", "stay")
    trainers.start(server, "gone", "--group", "gone", "--die-after", "30")
    assert trainers.wait("gone") == -9  # it killed itself mid-epoch
    assert trainers.wait("stay") == 0
    assert per_epoch(trainers.seen("stay")) == {1: WHOLE_EPOCH, 2: WHOLE_EPOCH}
    assert server.wait(timeout=30) == 0
    # It held the sampler back until it was dropped: before that, stay could not finish.
    assert "group gone lags" in server.stderr
    assert "group gone dropped" in server.stderr
