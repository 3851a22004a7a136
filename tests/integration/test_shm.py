"""The same-host shared-memory path with real server processes and sockets."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedmux import RemoteLoader, Server, fetch_stats
from feedmux._plumbing.shm import SHM_DIR
from tests.integration.conftest import Spawned, wait_until

MIB = 1 << 20


def segments_of(pid: int | None) -> list[Path]:
    return sorted(Path(SHM_DIR).glob(f"feedmux-{pid}-*"))


def in_pool(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a shared-memory segment (not of a received frame)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def consume(server: Server, *, shm: bool = True, hold: int = 0, last: bool = False,
            **options: Any) -> tuple[list[int], list[np.ndarray]]:
    """The ids of every sample; the first ``hold`` arrays kept (or only the last one)."""
    ids, held = [], []
    with RemoteLoader(server.data_address, control=server.control_address, timeout=30,
                      shm=shm, **options) as loader:
        for sample in loader:
            assert (sample["x"] == sample["id"]).all()
            ids.append(int(sample["id"]))
            if len(held) < hold:
                held.append(sample["x"])
            elif last:
                held[:] = [sample["x"]]
    return ids, held


def consume_side_by_side(server: Server, loaders: dict[Any, dict[str, Any]]
                         ) -> dict[Any, tuple[list[int], list[np.ndarray]]]:
    """:func:`consume` for each loader's options at once, a thread each (the last array
    kept: the first may come before the trainer's attach does); bounded, and any
    trainer's error raised here."""
    results: dict[Any, tuple[list[int], list[np.ndarray]]] = {}
    errors: list[BaseException] = []

    def train(key: Any) -> None:
        try:
            results[key] = consume(server, last=True, **loaders[key])
        except BaseException as error:  # raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=train, args=(key,)) for key in loaders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a trainer did not finish in 60 s"
    if errors:
        raise errors[0]
    return results


def test_same_host_trainers_get_views_and_the_fallback_the_same_samples() -> None:
    runs = {}
    for shm in (True, False):
        server = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0", epochs=1,
                        samples_per_message=1, shm_size=64 * MIB).start()
        try:
            runs[shm], _ = consume(server, shm=shm)
            assert server.join(30) == 0
        finally:
            server.stop()
        assert segments_of(server.pid) == []  # removed at a normal exit
    assert runs[True] == runs[False] == list(range(40))


def test_views_held_beyond_the_pool_stall_the_server_without_corruption() -> None:
    server = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0", epochs=1,
                    samples_per_message=1, shm_size=8 * MIB, hwm=2).start()
    try:
        with RemoteLoader(server.data_address, control=server.control_address, timeout=30) as ld:
            # Hold the whole pool's worth (8 views of 1 MiB), and more if some of the first
            # samples came over the socket (a busy machine: the loader had not mapped the
            # pool yet when they were sent), until the server stalls.
            held = []
            for sample in ld:
                held.append(sample)
                if len(held) >= 8 and fetch_stats(server.control_address)["shm_stalls"] >= 1:
                    break
                if len(held) == 8:  # the whole pool, if all came through it
                    try:
                        wait_until(lambda: fetch_stats(server.control_address)["shm_stalls"]
                                   >= 1, 5, "the server to stall on a full pool")
                        break
                    except AssertionError:
                        continue  # some came over the socket: hold more
            assert fetch_stats(server.control_address)["shm_stalls"] >= 1, (
                f"no stall with {len(held)} samples held")
            count = len(held)
            assert [int(s["x"][0]) for s in held] == list(range(count))
            assert all((s["x"] == s["id"]).all() for s in held)
            del held, sample
            rest = [int(s["id"]) for s in ld]
        assert rest == list(range(count, 40))
    finally:
        server.stop()


def test_the_pool_of_a_sigkilled_server_is_removed_without_another_start() -> None:
    server = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0").start()
    try:
        wait_until(lambda: len(segments_of(server.pid)) == 1, 10, "the pool")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        server.join(10)
        # Nothing of the server ran after the signal: its reaper removes the segment.
        wait_until(lambda: segments_of(server.pid) == [], 10, "the killed server's pool removed")
    finally:
        server.stop()


def test_a_segment_left_behind_is_removed_by_the_next_start() -> None:
    # A segment whose reaper was killed too: named for a process that is gone.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    leftover = Path(SHM_DIR) / f"feedmux-{gone.pid}-000000000000"
    leftover.write_bytes(b"")
    successor = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0").start()
    try:
        wait_until(lambda: not leftover.exists(), 10, "the left-over segment removed")
    finally:
        successor.stop()
        leftover.unlink(missing_ok=True)
    assert segments_of(successor.pid) == []


_HOLDING_TRAINER = """
import sys
from feedmux import RemoteLoader
held = []
loader = RemoteLoader(sys.argv[1], control=sys.argv[2], timeout=30)
for sample in loader:  # more than the pool holds: the rest came over the socket
    held.append(sample)
    if len(held) == int(sys.argv[3]):
        break
print(len(held), flush=True)
sys.stdin.read()  # holding every view until killed (the test closes stdin at the latest)
"""


@pytest.mark.parametrize(("workers", "size"), [(1, 8 * MIB), (2, 12 * MIB)],
                         ids=["workers1", "workers2"])
def test_a_sigkilled_trainers_slots_come_back(workers: int, size: int) -> None:
    # With 2 workers, a region of 4 MiB each for the server and the workers: the workers
    # take the dead trainer's runs back in theirs. Three epochs of 40 samples of 1 MiB; a
    # buffer of 4 messages, so that the sampler runs little ahead of the trainers.
    server = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0", epochs=3,
                    samples_per_message=1, shm_size=size, hwm=2, workers=workers,
                    group_buffer=4, seed=0).start()
    trainer = subprocess.Popen(
        [sys.executable, "-c", _HOLDING_TRAINER, server.data_address, server.control_address,
         str(size // MIB + 4)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout is not None
        held = int(trainer.stdout.readline())  # bounded by the child's timeout
        # The trainer holds more views than the pool has room for: the server found it
        # full (a stall; what it could not place went over the socket) and its own
        # region, at least, is the trainer's.
        wait_until(lambda: fetch_stats(server.control_address)["shm_stalls"] > 0,
                   30, "the server finding the pool full")
        stats = fetch_stats(server.control_address)
        assert stats["shm_bytes_in_use"] >= size // (workers + 1)
        placed_before = stats["shm_messages"]
        trainer.kill()
        trainer.wait(10)  # reaped: its pid is gone
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=30) as loader:
            rest, placed_after = [], placed_before
            for sample in loader:
                assert (sample["x"] == sample["id"]).all()
                rest.append(int(sample["id"]))
                # 20 ms a sample: the stream outlasts the server's next heartbeat to the dead
                # trainer (1 s), which finds it gone; until then the messages it had not
                # acknowledged hold their runs (they may be dealt again). A stream that went
                # by in 0.3 s, on a quiet machine, ended before that.
                time.sleep(0.02)
                if len(rest) % 10 == 0 and len(rest) <= 90:  # the server still runs
                    placed_after = fetch_stats(server.control_address)["shm_messages"]
        # Everything the dead trainer had not handed out arrives once, intact. What it
        # handed out in its last moment, before its marks reached the server, may come
        # again (at a SIGKILL's edge: at least once); nothing else does.
        expected = Counter(i % 40 for i in range(held, 120))
        assert not expected - Counter(rest), (held, rest)
        again = Counter(rest) - expected
        assert set(again) <= set(range(held)) and max(again.values(), default=0) <= 1, (
            held, rest)
        # The dead trainer's runs came back and were placed again (the pool was full of them).
        assert placed_after > placed_before, "nothing placed in the pool after the kill"
        assert server.join(30) == 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)
        for pipe in (trainer.stdin, trainer.stdout):
            if pipe is not None:
                pipe.close()
        server.stop()


@pytest.mark.parametrize("workers", [1, 2], ids=["workers1", "workers2"])
def test_a_trainer_that_cannot_map_the_pool_gets_the_same_messages_by_socket(
        workers: int) -> None:
    # A trainer on another host (here: shm=False) beside one on this host: each message
    # goes to one of them, as references or whole (with workers: the bytes they wrote into
    # the pool, copied out by the server); together they get every sample once.
    server = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0", epochs=1,
                    samples_per_message=1, shm_size=64 * MIB, min_trainers=2, workers=workers,
                    factory_kwargs={"count": 200}).start()
    try:
        runs = consume_side_by_side(server, {True: {"shm": True}, False: {"shm": False}})
        assert sorted(runs[True][0] + runs[False][0]) == list(range(200))
        assert runs[True][0] and runs[False][0]  # each was dealt some
        assert in_pool(runs[True][1][0]) and not in_pool(runs[False][1][0])
        assert server.join(30) == 0
    finally:
        server.stop()


def test_the_ranks_of_a_job_on_this_host_get_views_and_equal_steps() -> None:
    server = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0", epochs=1,
                    samples_per_message=1, shm_size=64 * MIB, factory_kwargs={"count": 41}).start()
    try:
        runs = consume_side_by_side(
            server, {rank: {"rank": rank, "world_size": 2} for rank in (0, 1)})
        # 41 samples dealt p % 2, the last round padded: 21 steps each, every sample once.
        assert len(runs[0][0]) == len(runs[1][0]) == 21
        assert set(runs[0][0]) | set(runs[1][0]) == set(range(41))
        assert in_pool(runs[0][1][0]) and in_pool(runs[1][1][0])
        assert server.join(30) == 0
    finally:
        server.stop()


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "true"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare --pid (root)")
def test_a_server_in_another_pid_namespace_keeps_the_trainer_on_the_sockets() -> None:
    # A container with ipc: host but its own pids: the trainer's pid in the pool's claims
    # is one the server cannot see. Before, the server took the trainer for dead, took its
    # runs back and wrote the next samples over the arrays the trainer still held (3 of
    # 4 held arrays overwritten); now it keeps that trainer on the sockets.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-m",
         "feedmux", "serve", "tests.integration.samplers:large", "--arg", "count=200",
         "--bind", "tcp://127.0.0.1:0", "--control", "tcp://127.0.0.1:0", "--epochs", "1",
         "--samples-per-message", "1", "--shm-size", "8", "--hwm", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    server = Spawned(process)
    try:
        data, control = server.endpoints().data, server.endpoints().control
        held: list[tuple[int, np.ndarray]] = []
        ids = []
        with RemoteLoader(data, control=control, timeout=30) as loader:
            for sample in loader:
                ids.append(int(sample["id"]))
                if len(held) < 4:
                    held.append((int(sample["id"]), sample["x"]))
        assert ids == list(range(200))
        assert [(i, bool((x == i).all())) for i, x in held] == [(i, True) for i, _ in held]
        assert not any(in_pool(x) for _, x in held)
        server.wait_for_stderr(lambda text: "another PID namespace" in text, 10,
                               "the server's word on the trainer's PID namespace")
    finally:
        server.kill()
        process.wait(timeout=10)
