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

from feedmux import RemoteError, Stream
from feedmux.client.remote import RemoteLoader, fetch_stats
from tests.integration.conftest import ROOT, Spawned, kill_remaining, wait_until

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

    def ranked(self, name: str) -> list[tuple[int, int, int]]:
        """(epoch, id, position) of every sample ranked trainer ``name`` was handed, in order."""
        path = self.folder / name
        return [(int(e), int(i), int(p)) for e, i, p in
                (line.split() for line in path.read_text().splitlines() if line.strip())]

    def close(self) -> None:
        kill_remaining(list(self.processes.values()))


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


@pytest.mark.parametrize("buffer", [("--group-buffer", "16"), ()],
                         ids=["group-buffer", "any-server"])
def test_three_groups_each_see_every_sample_once_per_epoch(
        serve: Callable[..., Spawned], trainers: Trainers, buffer: tuple[str, ...]) -> None:
    # Any server serves groups; --group-buffer only sizes the buffer.
    server = serve(SAMPLER, "--epochs", "3", "--samples-per-message", "8", *buffer,
                   "--min-trainers", "4")
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
    assert server.stderr.count(f"sampled: {EPOCH} samples") == 3


#: An odd epoch (3 streams x 33 = 99 samples), so that two ranks must pad or drop.
ODD_EPOCH = 99


def check_ranked_group(shares: list[list[tuple[int, int, int]]], uneven: str,
                       epochs: int) -> None:
    """Every rank the same steps per epoch; together every sample of every epoch exactly
    once, plus the padding (repeats of the epoch's first samples) or minus the dropped
    remainder."""
    world_size = len(shares)
    steps = -(-ODD_EPOCH // world_size) if uneven == "pad" else ODD_EPOCH // world_size
    for epoch in range(1, epochs + 1):
        mine = [[row for row in share if row[0] == epoch] for share in shares]
        assert [len(rows) for rows in mine] == [steps] * world_size, f"epoch {epoch}"
        for rank, rows in enumerate(mine):
            assert [p for _, _, p in rows] == list(range(rank, steps * world_size, world_size))
        dealt = sorted((p, i) for rows in mine for _, i, p in rows)
        by_position = dict(dealt)
        ids = Counter(by_position[p] for p in range(min(ODD_EPOCH, steps * world_size)))
        assert set(ids.values()) == {1}, f"epoch {epoch}: a sample twice"
        if uneven == "pad":  # padding repeats the epoch's first samples, in order
            assert sorted(ids) == list(range(ODD_EPOCH)), f"epoch {epoch}: a sample missing"
            padded = [by_position[p] for p in range(ODD_EPOCH, steps * world_size)]
            assert padded == [by_position[p] for p in range(len(padded))]
        else:  # the last, partial round is not delivered
            assert len(ids) == steps * world_size


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_a_ranked_group_and_a_free_group_each_get_whole_epochs(
        serve: Callable[..., Spawned], trainers: Trainers, uneven: str) -> None:
    server = serve(SAMPLER, "--arg", "streams=3", "--arg", "per_stream=33", "--epochs", "3",
                   "--samples-per-message", "8", "--group-buffer", "16", "--min-trainers", "3",
                   "--uneven", uneven)
    for rank in range(2):
        trainers.start(server, f"r{rank}", "--group", "ddp", "--rank", str(rank),
                       "--world-size", "2")
    trainers.start(server, "free", "--group", "eval")
    for name in ("r0", "r1", "free"):
        assert trainers.wait(name) == 0, f"trainer {name} failed"
    assert server.wait(timeout=30) == 0
    check_ranked_group([trainers.ranked("r0"), trainers.ranked("r1")], uneven, epochs=3)
    whole = Counter(range(ODD_EPOCH))
    assert per_epoch(trainers.seen("free")) == {1: whole, 2: whole, 3: whole}
    assert server.stderr.count(f"sampled: {ODD_EPOCH} samples") == 3  # sampled once


def test_a_restarted_rank_of_a_group_continues_right_after_its_predecessor(
        serve: Callable[..., Spawned], trainers: Trainers) -> None:
    server = serve(SAMPLER, "--arg", "streams=3", "--arg", "per_stream=33", "--epochs", "2",
                   "--samples-per-message", "8", "--group-buffer", "16", "--min-trainers", "3")
    trainers.start(server, "r0", "--group", "ddp", "--rank", "0", "--world-size", "2",
                   "--step-ms", "1")
    trainers.start(server, "doomed", "--group", "ddp", "--rank", "1", "--world-size", "2",
                   "--die-after", "21", "--step-ms", "1")
    trainers.start(server, "free", "--group", "eval")
    assert trainers.wait("doomed") == -9
    trainers.start(server, "restarted", "--group", "ddp", "--rank", "1", "--world-size", "2")
    for name in ("r0", "restarted", "free"):
        assert trainers.wait(name) == 0, f"trainer {name} failed"
    assert server.wait(timeout=30) == 0
    doomed = trainers.ranked("doomed")
    assert len(doomed) == 21
    check_ranked_group([trainers.ranked("r0"), doomed + trainers.ranked("restarted")], "pad",
                       epochs=2)
    whole = Counter(range(ODD_EPOCH))
    assert per_epoch(trainers.seen("free")) == {1: whole, 2: whole}


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
    # At the oldest epoch it can still get whole: 3, or 2 if group first's lag kept epoch
    # 2's first message in the buffer when the late group joined.
    assert late[0][0] in (2, 3), f"the late group started in epoch {late[0][0]}"
    assert per_epoch(late) == {e: whole for e in range(late[0][0], 5)}


def test_a_group_that_joins_after_the_last_epoch_began_gets_the_end_and_the_log_says_so(
        serve: Callable[..., Spawned], trainers: Trainers, tmp_path: Path) -> None:
    # One epoch, group first holding after 10 samples: the sampler has begun (and finished)
    # the stream's only epoch, whose first message has left the buffer, when group late
    # joins. Before, it waited for an epoch 2 that never came and got an empty stream
    # without a word; it still gets nothing (sampling happens once), but the log says why.
    server = serve(SAMPLER, "--epochs", "1", "--samples-per-message", "5", "--hwm", "2",
                   "--min-trainers", "1")
    go, start = tmp_path / "go", tmp_path / "start"
    trainers.start(server, "first", "--group", "first", "--hold-after", "10",
                   "--go-file", str(go))
    trainers.start(server, "late", "--group", "late", "--start-file", str(start))
    wait_until(lambda: int(fetch_stats(server.control, timeout=5).get(
        "group.first.delivered_samples") or 0) >= 10, 30, "group first to hold")
    start.touch()
    wait_until(lambda: fetch_stats(server.control, timeout=5).get("groups") == 2, 30,
               "group late to join")
    go.touch()
    for name in ("first", "late"):
        assert trainers.wait(name) == 0, f"trainer {name} failed"
    assert server.wait(timeout=30) == 0
    assert per_epoch(trainers.seen("first")) == {1: WHOLE_EPOCH}
    assert trainers.seen("late") == []
    assert "group late joined after the last epoch it could get whole" in server.stderr


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


def test_a_group_joining_a_free_server_mid_run_leaves_its_free_trainer_whole(
        serve: Callable[..., Spawned], trainers: Trainers, tmp_path: Path) -> None:
    # Epochs of 400 large samples paced by the free trainer (3 ms a sample): the group's
    # trainer asks for its group early in epoch 2, while the server deals to the plain
    # trainer alone (through the shared-memory pool: it is on this host).
    server = serve(SAMPLER, "--arg", "per_stream=100", "--arg", "width=20000", "--epochs",
                   "4", "--samples-per-message", "5", "--hwm", "2", "--min-trainers", "1")
    whole = Counter(range(400))
    go = tmp_path / "go"
    trainers.start(server, "late", "--group", "late", "--start-file", str(go))
    trainers.start(server, "free", "--step-ms", "3")

    def early_in_epoch_2() -> bool:
        stats = fetch_stats(server.control, timeout=5)
        return stats.get("epoch") == 2 and int(stats.get("epoch_position") or 0) < 300

    wait_until(early_in_epoch_2, timeout=30, what="the free trainer early in epoch 2")
    # The free trainer is the group default from the start: its buffer is the only one,
    # and the late group's hello will add a cursor to it, nothing more.
    stats = fetch_stats(server.control, timeout=5)
    assert stats["groups"] == 1 and stats["group.default.members"] == 1
    go.touch()
    for name in ("free", "late"):
        assert trainers.wait(name) == 0, f"trainer {name} failed"
    assert server.wait(timeout=30) == 0
    # The free trainer (the group default) lost nothing and got nothing twice across the
    # late group's coming; the late group started at the next epoch boundary.
    assert per_epoch(trainers.seen("free")) == {e: whole for e in (1, 2, 3, 4)}
    # It started at a boundary after the one it asked in (under load it may ask later).
    late = trainers.seen("late")
    assert late and late[0][0] >= 3, f"the late group started in epoch {late[0][0]}"
    assert per_epoch(late) == {e: whole for e in range(late[0][0], 5)}


def test_a_ranked_group_missing_a_rank_for_the_rank_timeout_is_given_up(
        serve: Callable[..., Spawned], trainers: Trainers) -> None:
    # Group ddp's rank 1 never comes: without the timeout the group holds the shared
    # buffer, and so the group eval, back for ever.
    server = serve(SAMPLER, "--epochs", "2", "--samples-per-message", "4",
                   "--group-buffer", "4", "--min-trainers", "2", "--rank-timeout", "1")
    trainers.start(server, "r0", "--group", "ddp", "--rank", "0", "--world-size", "2")
    trainers.start(server, "eval", "--group", "eval")
    assert trainers.wait("eval") == 0
    assert per_epoch(trainers.seen("eval")) == {1: WHOLE_EPOCH, 2: WHOLE_EPOCH}
    assert trainers.wait("r0") == 1  # its loader raised the server's error
    # Until then it got its own share of the first rounds (rank 1's waited for nobody).
    assert all(epoch == 1 and position % 2 == 0 for epoch, _, position in trainers.ranked("r0"))
    assert server.wait(timeout=30) == 0
    assert ("rank(s) [1] of 2 in group 'ddp' not connected within the rank timeout of 1 s: "
            "the group is given up") in server.stderr


def test_a_ranked_group_resuming_from_an_epoch_the_stream_dropped_is_refused_naming_it(
        serve: Callable[..., Spawned], trainers: Trainers) -> None:
    # A sampler paced at 10 ms a sample (6 s in all), so that the stream is still being
    # sampled when the job's loaders come, whatever the load. The job joined mid-epoch
    # (--join now): the buffer never held its checkpoint's epoch from its first message.
    server = serve(SAMPLER, "--arg", "delay=0.01", "--epochs", "3", "--samples-per-message",
                   "4", "--min-trainers", "1", "--join", "now")
    trainers.start(server, "eval", "--group", "eval")
    wait_until(lambda: fetch_stats(server.control, timeout=5)["connected_trainers"] == 1,
               timeout=30, what="the group eval's trainer")  # it opens the groups
    with RemoteLoader(server.data, control=server.control, timeout=20, group="ddp", rank=0,
                      world_size=1) as loader:
        stream = Stream(loader)
        for _ in range(10):
            stream.next()
        state = stream.state_dict()
    with RemoteLoader(server.data, control=server.control, timeout=20, group="ddp", rank=0,
                      world_size=1) as restarted:
        stream = Stream(restarted)
        stream.load_state_dict(state)
        with pytest.raises(RemoteError, match=r"group 'ddp' resumes from a checkpoint at "
                                              r"epoch \d+, position \d+ \(taken with 1 ranks\), "
                                              r"and this server's stream can no longer give "
                                              r"epoch \d+ whole"):
            stream.next()
    # The other group is not disturbed: every epoch whole.
    assert trainers.wait("eval") == 0
    assert per_epoch(trainers.seen("eval")) == {1: WHOLE_EPOCH, 2: WHOLE_EPOCH, 3: WHOLE_EPOCH}
    assert server.wait(timeout=30) == 0


def test_a_group_on_a_server_dealing_a_ranked_job_is_refused_with_the_reason(
        serve: Callable[..., Spawned], trainers: Trainers) -> None:
    server = serve(SAMPLER, "--arg", "delay=0.01", "--epochs", "1", "--min-trainers", "1")
    trainers.start(server, "r0", "--rank", "0", "--world-size", "1")
    wait_until(lambda: fetch_stats(server.control, timeout=5).get("world_size") == 1,
               timeout=30, what="the ranked job")
    with RemoteLoader(server.data, control=server.control, timeout=20, group="eval") as loader:
        with pytest.raises(RemoteError, match="deals to a ranked job outside any group, and "
                                              "deals its ranks as the sampler draws"):
            next(loader)
    assert trainers.wait("r0") == 0  # the job goes on undisturbed
    assert sorted(i for _, i, _ in trainers.ranked("r0")) == list(range(EPOCH))
    assert server.wait(timeout=30) == 0


@pytest.mark.parametrize("buffer", [("--group-buffer", "16"), ()],
                         ids=["group-buffer", "any-server"])
def test_reliable_groups_each_get_every_sample_once_across_a_killed_member(
        serve: Callable[..., Spawned], trainers: Trainers, buffer: tuple[str, ...]) -> None:
    # Two members of group a, one SIGKILLed inside its 9th message (after its acknowledging
    # thread told the server how far it got); group b alone, unaffected.
    server = serve(SAMPLER, "--epochs", "2", "--samples-per-message", "8",
                   *buffer, "--min-trainers", "3")
    trainers.start(server, "a0", "--group", "a", "--die-after", "67", "--step-ms", "2")
    trainers.start(server, "a1", "--group", "a", "--step-ms", "1")
    trainers.start(server, "b", "--group", "b")
    assert trainers.wait("a0") == -9  # it killed itself mid-epoch
    assert trainers.wait("a1") == 0 and trainers.wait("b") == 0
    assert server.wait(timeout=30) == 0
    assert len(trainers.seen("a0")) == 67 and trainers.seen("a1")
    # Every sample once within each group, the dead member's hand-outs included: only
    # what it had not handed out went to the group's other member.
    whole = {1: WHOLE_EPOCH, 2: WHOLE_EPOCH}
    assert per_epoch(trainers.seen("a0") + trainers.seen("a1")) == whole
    assert per_epoch(trainers.seen("b")) == whole
    assert "trainer " in server.stderr and "went away holding" in server.stderr
