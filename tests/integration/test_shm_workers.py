"""``--workers N`` with the shared-memory pool: real server, worker and trainer processes.

The workers write each large array into their region of the pool and forward
references; a trainer on this host gets views of the pool, also when the server
deals the workers' messages to ranks (it reads them in place and sends a rank's
share on as references to the workers' runs) or builds batches from them. A
worker SIGKILLed mid-epoch (or several, at random moments) fails nothing: its shards
go to a new worker forked in its place, every epoch stays exact and in the seeded
order, and the views a trainer holds stay valid (a killed trainer's runs, and a
trainer that does not map the pool: ``test_shm.py``, run with 2 workers too).
"""

from __future__ import annotations

import os
import random
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import worker_kills
from feedmux import RemoteLoader, Server, fetch_stats
from feedmux.errors import RemoteError
from tests.integration.conftest import (
    CheckedThread,
    Spawned,
    wait_until,
    worker_pids,
    zygote_pid,
)
from tests.integration.kill_restart import Trainers
from tests.integration.test_shm import in_pool

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
#: The pool of the tests that count the server's copies into it. A worker whose region is
#: full waits 1 s for room (WORKER_PATIENCE), then sends its sample whole and the server
#: copies it in: with 64 MiB (21 MiB a region) a loaded machine's stall of the trainer
#: did that in CI (8 MiB copied in epoch 2 of the batches test). A region of 85 MiB is
#: more than the runs in flight can take (the queues both ways, 16 messages of 1 MiB,
#: a batch being stacked, what is on its way to the trainer: 20-32 MiB).
POOL = 256 * MIB
SAMPLER = "tests.integration.samplers:large"  # 1 MiB samples whose values are their id
#: The server's log line that names its workers (docs/server.md).
_STARTED = re.compile(r"started \d+ sampling worker\(s\): pids ([\d, ]+)")


def views_of_two_epochs(server: Server,
                        check: Callable[[dict[str, Any]], None] = lambda stats: None,
                        ) -> dict[str, int]:
    """Read ``server``'s two epochs of 40 samples of :data:`SAMPLER`, each a view of the
    pool holding its id once the first one is (the first ones of epoch 1 may come whole,
    dealt before the server heard the trainer map the pool); check each epoch whole, and
    return the server's ``shm_bytes_copied`` at the first and last samples of epoch 2
    (``check`` sees the stats there)."""
    seen: list[tuple[int, int]] = []
    copied_at: dict[str, int] = {}
    mapped = False  # a sample dealt before the server heard the trainer's attach comes whole
    with RemoteLoader(server.data_address, control=server.control_address,
                      timeout=30) as loader:
        for sample in loader:
            assert (sample["x"] == sample["id"]).all(), "a sample's content is not its id's"
            mapped = mapped or in_pool(sample["x"])
            assert mapped or len(seen) < 40, "a large array of epoch 2 that is not a view"
            assert in_pool(sample["x"]) or not mapped, (
                "a large array that is not a view of the pool, after the trainer mapped it")
            seen.append((int(loader.last_epoch or 0), int(sample["id"])))
            if len(seen) in (41, 80):  # the first and last samples of epoch 2
                stats = fetch_stats(server.control_address)
                copied_at["start" if len(seen) == 41 else "end"] = stats["shm_bytes_copied"]
                check(stats)
            del sample
    for epoch in (1, 2):
        assert sorted(i for e, i in seen if e == epoch) == list(range(40))
    return copied_at


def test_two_workers_write_into_the_pool_and_the_trainer_gets_views_for_two_epochs() -> None:
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", epochs=2, samples_per_message=1,
                    shm_size=POOL, workers=2).start()
    try:
        copied_at = views_of_two_epochs(server)
        # Epoch 2 was drawn with the trainer mapping the pool: the workers wrote every
        # array into it, so the server copied none (before the trainer's attach, drawn
        # arrays went whole and the server copied them in).
        assert copied_at["end"] == copied_at["start"]
        assert server.join(30) == 0
    finally:
        server.stop()


@pytest.mark.parametrize("pool", [True, False], ids=["pool", "no-pool"])
def test_a_worker_sigkilled_mid_epoch_is_replaced_by_a_new_one_and_the_run_goes_on(
        serve: Callable[..., Spawned], pool: bool) -> None:
    epoch_size = 60
    server = serve(SAMPLER, "--arg", f"count={epoch_size}", "--workers", "2", "--epochs", "3",
                   "--seed", "1", "--samples-per-message", "1",
                   *(("--shm-size", str(POOL // MIB)) if pool else ("--no-shm",)))
    started = server.wait_for_stderr(lambda text: _STARTED.search(text) is not None, 30,
                                     "the workers' pids")
    match = _STARTED.search(started)
    assert match is not None
    victim = int(match[1].split(",")[0])
    seen: list[tuple[int, int]] = []
    held: list[tuple[int, np.ndarray]] = []
    before: list[int] = []
    successor: list[int] = []
    with RemoteLoader(server.data, control=server.control, timeout=60) as loader:
        for sample in loader:
            ident, x = int(sample["id"]), sample["x"]
            assert (x == ident).all(), "a sample's content is not its id's"
            seen.append((int(loader.last_epoch or 0), ident))
            if in_pool(x) and len(held) < 8 and len(seen) % 3 == 0:
                held.append((ident, x))  # views of the pool, kept across the death
            if len(seen) == epoch_size + epoch_size // 3:  # a third into epoch 2
                assert seen[-1][0] == 2 and (held or not pool), "no view of the pool"
                before = worker_pids(server.pid)
                assert victim in before and len(before) == 2, before
                os.kill(victim, signal.SIGKILL)
            elif before and not successor:  # read on: the server's loop sees the death
                successor = sorted(set(worker_pids(server.pid)) - set(before))
            del sample, x
        stats = fetch_stats(server.control)
    assert server.wait(60) == 0, server.stderr
    assert f"(pid {victim}) exited unexpectedly with code -9; its shards" in server.stderr
    # A new worker, forked by the zygote, took the dead one's shards.
    assert len(successor) == 1 and victim not in successor, (before, successor)
    assert (f"(pid {victim}) exited unexpectedly with code -9; its shards" in server.stderr
            and f"go to a new worker (pid {successor[0]})" in server.stderr), server.stderr
    assert stats["workers_replaced"] == 1 and stats["workers"] == 2, stats
    assert stats["shards_moved"] >= 1, stats
    assert not pool or stats["shm_messages"] > 0, stats
    for epoch in (1, 2, 3):
        assert sorted(i for e, i in seen if e == epoch) == list(range(epoch_size)), (
            f"epoch {epoch}: samples lost or repeated")
    assert all((array == ident).all() for ident, array in held), "a held view changed"


def test_the_zygote_and_then_every_worker_sigkilled_fail_the_run_and_runs_come_back(
) -> None:
    # Without its zygote the server replaces no worker: it goes on with those it has
    # (here none), so the run fails, and every run of the pool nobody holds comes back.
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", samples_per_message=1,
                    shm_size=64 * MIB, workers=2, factory_kwargs={"count": 100_000}).start()
    try:
        assert server.pid is not None
        held = []
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=30) as loader:
            with pytest.raises(RemoteError, match=r"sampling worker .* exited unexpectedly"):
                after_kill = None
                for sample in loader:
                    assert (sample["x"] == sample["id"]).all()
                    # Samples drawn before the trainer attached to the pool came whole:
                    # only views of the pool are held (a sample that came whole first
                    # used to keep the kill from ever happening: 100,000 samples later
                    # the test's time was up).
                    if len(held) < 3 and in_pool(sample["x"]):
                        held.append(sample["x"])
                    if len(held) == 3 and after_kill is None:
                        zygote = zygote_pid(server.pid)
                        assert zygote is not None
                        workers = worker_pids(server.pid)
                        os.kill(zygote, signal.SIGKILL)  # nobody forks a new worker now
                        for pid in workers:  # every worker: none is left
                            os.kill(pid, signal.SIGKILL)
                        after_kill = 0
                    elif after_kill is not None:
                        after_kill += 1
                        assert after_kill < 5000, "the worker's death never reached the trainer"
                    del sample
            # The server took back every run no trainer holds:
            # what is in use is what this trainer's live views hold (the 3 kept here and
            # those the loader decoded ahead) and what was on its way to it (sent before
            # the failure, not decoded: the error came on the control socket), to the byte.
            stats = fetch_stats(server.control_address)
            views, view_bytes, _ = loader._data.views_held()
            assert views >= 3
            assert stats["shm_bytes_in_use"] == view_bytes + stats["shm_bytes_in_transit"]
            assert all((array == array[0]).all() for array in held)
        server.join(30)
    finally:
        server.stop()


def test_without_its_zygote_the_server_goes_on_with_the_workers_it_has(
        serve: Callable[..., Spawned]) -> None:
    # The zygote SIGKILLed: logged, the two workers go on; then one of them SIGKILLed:
    # nobody can fork its successor, so its shards go to the other, and every epoch
    # stays exact (with the pool: the dead worker's runs come back as before).
    epoch_size = 60
    server = serve(SAMPLER, "--arg", f"count={epoch_size}", "--workers", "2", "--epochs", "3",
                   "--seed", "1", "--samples-per-message", "1", "--shm-size", str(POOL // MIB))
    wait_until(lambda: len(worker_pids(server.pid)) == 2, 30, "two workers")
    zygote, workers = zygote_pid(server.pid), worker_pids(server.pid)
    assert zygote is not None
    seen: list[tuple[int, int]] = []
    with RemoteLoader(server.data, control=server.control, timeout=60) as loader:
        for sample in loader:
            ident = int(sample["id"])
            assert (sample["x"] == ident).all(), "a sample's content is not its id's"
            seen.append((int(loader.last_epoch or 0), ident))
            if len(seen) == epoch_size // 2:
                os.kill(zygote, signal.SIGKILL)
            if len(seen) == epoch_size + epoch_size // 3:
                os.kill(workers[0], signal.SIGKILL)
            del sample
        stats = fetch_stats(server.control)
    assert server.wait(60) == 0, server.stderr
    assert re.search(rf"the zygote \(pid {zygote}\) exited with code -9: no sampling worker "
                     "can be started or replaced from now on; the run goes on with the "
                     "workers it has", server.stderr), server.stderr
    assert (f"(pid {workers[0]}) exited unexpectedly (its exit code is unknown" in server.stderr
            and "go to the other workers (no zygote to fork a new one)" in server.stderr), (
        server.stderr)
    assert stats["zygote_alive"] == 0 and stats["workers"] == 1, stats
    assert stats["workers_replaced"] == 0, stats
    for epoch in (1, 2, 3):
        assert sorted(i for e, i in seen if e == epoch) == list(range(epoch_size)), (
            f"epoch {epoch}: samples lost or repeated")


def test_workers_sigkilled_at_random_moments_lose_and_repeat_nothing() -> None:
    # The bounded form of benchmarks.worker_kills: 4 workers, 3 of them SIGKILLed at drawn
    # sample counts (the seed printed), 1,200 samples of 1 MiB through the pool.
    seed = random.randrange(1 << 30)
    print(f"worker kills seed {seed}")
    outcome = worker_kills.run(workers=4, kills=3, seconds=0, seed=seed, samples=1200,
                               shm_size=POOL // MIB)
    assert len(outcome.killed) == 3
    assert not outcome.misses, (outcome.misses, outcome.stderr[-3000:])
    assert outcome.rows == worker_kills.reference(4, len(outcome.rows), POOL // MIB), (
        "the order differs from the uninterrupted run's")


def in_a_workers_region(loader: RemoteLoader, array: np.ndarray, workers: int) -> bool:
    """Whether ``array`` lies in a sampling worker's region of the pool: the worker's own
    copy, sent on as it is (the server's region, the first ``1 / (workers + 1)`` of the
    granules, holds what the server copied in)."""
    views = loader._data.views
    assert views is not None
    for attachment in views.attachments.values():
        segment = attachment.segment
        offset = int(array.ctypes.data) - segment.base
        if 0 <= offset < len(segment.data):
            return offset // segment.granule >= segment.granules // (workers + 1)
    return False


def test_two_workers_and_two_ranks_get_the_workers_own_copies_with_exact_epochs() -> None:
    # The forwarder deals the workers' messages to the ranks: it reads them in place (no
    # copy out of the pool), and a rank's share of whole samples goes on as references to
    # the runs the workers wrote (no copy into the pool either).
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", epochs=2, samples_per_message=1,
                    shm_size=POOL, workers=2, min_trainers=2).start()
    try:
        loaders = [RemoteLoader(server.data_address, control=server.control_address,
                                timeout=30, with_meta=True, rank=rank, world_size=2)
                   for rank in (0, 1)]
        try:
            seen: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
            copied: dict[int, int] = {0: 0, 1: 0}

            def train(rank: int) -> None:
                stream = iter(loaders[rank])
                for _ in range(40):  # 20 samples per rank per epoch; a loader each, as DDP
                    meta, sample = next(stream)
                    assert (sample["x"] == sample["id"]).all()
                    # Drawn once the ranks had mapped the pool: views of the workers' own
                    # copies. (Epoch 1's first messages may be dealt before a rank's word
                    # that it mapped the pool arrives, under load: they come whole.)
                    if meta.epoch == 2:
                        assert in_pool(sample["x"]), "a rank's large array is not a pool view"
                        if not in_a_workers_region(loaders[rank], sample["x"], workers=2):
                            copied[rank] += 1
                    seen[rank].append((meta.epoch, int(sample["id"]), meta.position))
                    del sample

            ranks = [CheckedThread(train, rank) for rank in (0, 1)]
            for rank in ranks:
                rank.join(60)
            assert copied == {0: 0, 1: 0}, "a rank's array of epoch 2 was copied by the server"
            for rank in (0, 1):
                assert [(e, p) for e, _, p in seen[rank]] == [
                    (epoch, position) for epoch in (1, 2) for position in range(rank, 40, 2)]
            for epoch in (1, 2):
                assert sorted(i for rank in (0, 1) for e, i, _ in seen[rank]
                              if e == epoch) == list(range(40))

            def in_use_is_held() -> bool:
                held = sum(loader._data.views_held()[1] for loader in loaders)
                return bool(fetch_stats(server.control_address)["shm_bytes_in_use"] == held)

            # What the ranks handed out comes back once the server's copies for a successor
            # go (their hand-out marks): only what the loaders decoded ahead stays in use.
            wait_until(in_use_is_held, 20, "the pool's use down to the views the loaders hold")
        finally:
            for loader in loaders:
                loader.close()
    finally:
        server.stop()


def test_two_groups_get_views_of_the_workers_own_copies_with_exact_epochs() -> None:
    # The groups' buffer shares a worker's runs as they are: a member of each group holds
    # a claim cell of the worker's copy (no copy into the server's region: the worker's is
    # the only one in the pool; the buffer and the members' ledgers keep one copy out, to
    # deal again). Before, a large array was copied three times with --workers N and
    # groups, and once each group's members were dealt by credit, they were sent the
    # server's copy instead of a view of the worker's.
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", epochs=2, samples_per_message=1,
                    shm_size=POOL, workers=2, min_trainers=2).start()
    try:
        loaders = {group: RemoteLoader(server.data_address, control=server.control_address,
                                       timeout=30, with_meta=True, group=group)
                   for group in ("a", "b")}
        try:
            seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
            copied: dict[str, int] = {"a": 0, "b": 0}
            copied_at: dict[str, int] = {}

            def train(group: str) -> None:
                loader = loaders[group]
                for meta, sample in loader:
                    assert (sample["x"] == sample["id"]).all()
                    assert in_pool(sample["x"]), "a member's large array is not a pool view"
                    if meta.epoch == 2 and not in_a_workers_region(loader, sample["x"], 2):
                        copied[group] += 1
                    seen[group].append((meta.epoch, int(sample["id"])))
                    if group == "a" and len(seen[group]) in (41, 80):
                        stats = fetch_stats(server.control_address)
                        copied_at["start" if len(seen[group]) == 41 else "end"] = (
                            stats["shm_bytes_copied"])
                    del sample

            members = [CheckedThread(train, group) for group in ("a", "b")]
            for member in members:
                member.join(60)
            assert copied == {"a": 0, "b": 0}, "a member's array of epoch 2 was copied"
            assert copied_at["end"] == copied_at["start"], "the server copied into the pool"
            for group in ("a", "b"):
                for epoch in (1, 2):
                    assert sorted(i for e, i in seen[group] if e == epoch) == list(range(40))
            assert server.join(30) == 0
        finally:
            for loader in loaders.values():
                loader.close()
    finally:
        server.stop()


def test_two_workers_build_batches_into_the_pool_with_exact_epochs() -> None:
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", epochs=2, samples_per_message=1,
                    shm_size=POOL, workers=2).start()
    try:
        seen: list[tuple[int, int]] = []
        copied_at: dict[int, int] = {}
        with RemoteLoader(server.data_address, control=server.control_address, timeout=30,
                          batch_size=4, with_meta=True) as loader:
            for meta, batch in loader:
                assert batch["x"].shape == (4, MIB // 4)
                assert (batch["x"] == batch["id"][:, None]).all()
                assert in_pool(batch["x"]), "a batch that is not a view of the pool"
                seen += [(meta.epoch, int(i)) for i in batch["id"]]
                if len(seen) in (44, 80):  # the first and the last batch of epoch 2
                    copied_at[len(seen)] = fetch_stats(server.control_address)[
                        "shm_bytes_copied"]
                del batch
        for epoch in (1, 2):
            assert sorted(i for e, i in seen if e == epoch) == list(range(40))
        # The server stacks each batch straight into the pool (the stacking is the batch's
        # one copy, its arrays sent as references to it): it copied nothing into the pool.
        assert copied_at[80] == copied_at[44], "the server copied batches into the pool"
        assert server.join(30) == 0
    finally:
        server.stop()


def test_a_sigkilled_rank_restarted_continues_exactly_through_the_pool(
        serve: Callable[..., Spawned], tmp_path: Path) -> None:
    server = serve(SAMPLER, "--arg", "count=40", "--epochs", "2", "--samples-per-message", "1",
                   "--workers", "2", "--min-trainers", "2", "--shm-size", "64")
    trainers = Trainers(server, tmp_path)
    go = tmp_path / "go"
    ranked = ["--world-size", "2", "--rank"]
    try:
        # Held early, so that most of rank 1's share is dealt after its successor mapped the
        # pool (held at 30, a loaded machine's run had nearly all of it in the replay lane).
        trainers.start("survivor", *ranked, "0", "--hold-after", "10", "--go-file", str(go))
        trainers.start("doomed", *ranked, "1", "--die-after", "7", "--step-ms", "1")
        assert trainers.exit_code("doomed") == -9
        trainers.start("restarted", *ranked, "1")
        wait_until(lambda: bool(trainers.record("restarted")), 60,
                   "the restarted rank's first sample")
        go.touch()
        for name in ("restarted", "survivor"):
            assert trainers.exit_code(name) == 0, f"trainer {name} was killed"
        assert server.wait(timeout=60) == 0, server.stderr
    finally:
        trainers.kill_remaining()
    survivor, successor = trainers.record("survivor"), trainers.record("restarted")
    doomed = trainers.record("doomed")
    assert len(doomed) == 7
    for rank, record in ((0, survivor), (1, doomed + successor)):
        assert [(row[0], row[2]) for row in record] == [
            (epoch, position) for epoch in (1, 2) for position in range(rank, 40, 2)]
    for epoch in (1, 2):
        assert sorted(row[1] for row in survivor + doomed + successor
                      if row[0] == epoch) == list(range(40))
    # Its predecessor's rest came over the socket (how much of it depends on what was on
    # its way when it died: up to the rank's lane of the ledger); what was dealt to the
    # restarted rank after that, through the pool.
    assert trainers.views("restarted") > 0, "the restarted rank got no view of the pool"
    assert trainers.views("survivor") > 0, "the surviving rank got no view of the pool"


def _ranks(server: Spawned, kill: list[int]) -> dict[int, list[tuple[int, int]]]:
    """Each of 2 ranks' (epoch, id) in order, read through the pool to the end of the
    stream (some as views of it, at least); rank 0 SIGKILLs a worker of ``kill`` after
    each 40 samples it read."""
    got: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    pooled = []

    def read(rank: int) -> None:
        with RemoteLoader(server.data, control=server.control, timeout=60, rank=rank,
                          world_size=2) as loader:
            for sample in loader:
                ident, x = int(sample["id"]), sample["x"]
                assert (x == ident).all(), "a sample's content is not its id's"
                got[rank].append((int(loader.last_epoch or 0), ident))
                if in_pool(x):
                    pooled.append(ident)
                if rank == 0 and kill and len(got[0]) % 40 == 0:
                    os.kill(kill.pop(0), signal.SIGKILL)
                del sample, x

    threads = [CheckedThread(read, rank) for rank in (0, 1)]
    for thread in threads:
        thread.join(120)
    assert pooled, "no sample came as a view of the pool"
    return got


def test_workers_sigkilled_under_two_ranks_leave_each_ranks_sequence_unchanged(
        serve: Callable[..., Spawned]) -> None:
    options = ("--seed", "1", "--shards", "4", "--epochs", "3", "--min-trainers", "2",
               "--samples-per-message", "1", "--shm-size", str(POOL // MIB))
    reference = _ranks(serve(worker_kills.SOURCE, *options, "--workers", "1"), [])
    server = serve(worker_kills.SOURCE, *options, "--workers", "4")
    started = server.wait_for_stderr(lambda text: _STARTED.search(text) is not None, 30,
                                     "the workers' pids")
    match = _STARTED.search(started)
    assert match is not None
    victims = [int(pid) for pid in match[1].split(",")][1:]  # 3 of the 4, one by one
    got = _ranks(server, list(victims))
    assert server.wait(60) == 0, server.stderr
    for pid in victims:
        assert f"(pid {pid}) exited unexpectedly with code -9; its shards" in server.stderr
    assert got == reference, "a rank's sequence changed with the deaths"
    epoch_size = worker_kills.STREAMS * worker_kills.PER_STREAM
    for epoch in (1, 2, 3):
        ids = sorted(i for rank in (0, 1) for e, i in got[rank] if e == epoch)
        assert ids == list(range(epoch_size)), f"epoch {epoch}: samples lost or repeated"
