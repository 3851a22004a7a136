"""Acknowledged delivery (every free trainer's; once asked with ``--reliable``): a trainer
that dies mid-epoch loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zmq

import feedmux
from feedmux.client.remote import RemoteLoader
from feedmux.protocol import Hello, decode
from tests.integration.conftest import (
    ROOT,
    CheckedThread,
    Endpoints,
    Spawned,
    kill_remaining,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)

SAMPLER = "tests.integration.samplers"


def read_record(path: Path) -> list[tuple[int, int]]:
    pairs = []
    for line in path.read_text().splitlines():
        epoch, sample_id = line.split()
        pairs.append((int(epoch), int(sample_id)))
    return pairs


def spawn_reliable(server: Spawned, tmp_path: Path, names: list[str],
                   flags: list[list[str]]) -> list[subprocess.Popen[bytes]]:
    """One trainer process per name (its record in ``tmp_path / name``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [subprocess.Popen(
        [sys.executable, "-m", "tests.integration.trainers", server.data, server.control,
         str(tmp_path / name), *extra], env=env, cwd=ROOT)
        for name, extra in zip(names, flags, strict=True)]


def assert_each_once(rows: list[tuple[int, int]], epochs: int, epoch_size: int) -> None:
    """Every sample id of each epoch handed out exactly once across the records."""
    for epoch in range(1, epochs + 1):
        ids = Counter(sample_id for row_epoch, sample_id in rows if row_epoch == epoch)
        lost = sorted(set(range(epoch_size)) - set(ids))
        repeated = sorted(i for i, n in ids.items() if n > 1)
        assert not repeated and set(ids) <= set(range(epoch_size)), (
            f"epoch {epoch}: repeated {repeated[:20]}")
        assert not lost, f"epoch {epoch}: lost {len(lost)}: {lost[:20]}"


def run_trainers(server: Spawned, tmp_path: Path, die_after: int = 0,
                 step_ms: float = 0.0, survivors: int = 1
                 ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """A trainer that dies after ``die_after`` samples (0: never) and ``survivors`` others;
    the doomed one's record and the others' records together."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data,
              server.control]
    doomed = subprocess.Popen([*common, str(tmp_path / "doomed"),
                               "--die-after", str(die_after), "--step-ms", str(step_ms)],
                              env=env, cwd=ROOT)
    others = [subprocess.Popen([*common, str(tmp_path / f"survivor{n}")], env=env,
                               cwd=ROOT) for n in range(survivors)]
    try:
        doomed_code = doomed.wait(timeout=60)
        assert doomed_code == (-9 if die_after else 0)
        for other in others:
            assert other.wait(timeout=60) == 0
    finally:
        for process in (doomed, *others):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    return read_record(tmp_path / "doomed"), [
        pair for n in range(survivors) for pair in read_record(tmp_path / f"survivor{n}")]


@pytest.mark.parametrize(("workers", "survivors"), [("1", 1), ("2", 1), ("1", 2)])
def test_a_dead_trainers_share_goes_to_the_others_exactly_once(
    serve: Any, tmp_path: Path, workers: str, survivors: int
) -> None:
    server = serve(f"{SAMPLER}:numbered", "--arg", "per_stream=500", "--epochs", "2",
                   "--samples-per-message", "10", "--min-trainers",
                   str(1 + survivors), "--workers", workers)
    # It dies inside a message (the 7th sample of its 31st), once it has acknowledged so far.
    doomed, others = run_trainers(server, tmp_path, die_after=307, survivors=survivors)
    assert len(doomed) == 307
    assert server.wait(timeout=30) == 0
    for epoch in (1, 2):
        # Every sample handed out exactly once across all trainers, the dead one included:
        # only the part of its messages it had not handed out went to the others.
        got = Counter(i for e, i in doomed + others if e == epoch)
        assert got == Counter(range(2000)), f"epoch {epoch}: lost or handed out twice"


def test_reliable_single_trainer_exactly_once_and_stats(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--epochs", "3")
    with RemoteLoader(server.data, control=server.control, timeout=20,
                      with_meta=True) as loader:
        seen = Counter((meta.epoch, int(sample["id"])) for meta, sample in loader)
    assert seen == Counter((e, i) for e in (1, 2, 3) for i in range(200))


def test_reliable_is_a_deprecated_no_op_at_both_ends(serve: Any) -> None:
    # Every free trainer is dealt by credit now: the old flags still work, and say so.
    server = serve(f"{SAMPLER}:numbered", "--epochs", "1", "--reliable")
    server.wait_for_stderr(lambda text: "--reliable is deprecated and does nothing" in text,
                           30, "the deprecation warning line")
    with pytest.warns(DeprecationWarning, match=r"reliable=\.\.\.\) is deprecated"):
        loader = RemoteLoader(server.data, control=server.control, timeout=20, reliable=True,
                              with_meta=True)
    with loader:
        seen = Counter((meta.epoch, int(sample["id"])) for meta, sample in loader)
    assert seen == Counter((1, i) for i in range(200))


def test_trainers_that_finish_at_different_times_both_stop_cleanly(
    serve: Any, tmp_path: Path
) -> None:
    """Regression: a drained trainer and the server must not ping-pong past the end."""
    server = serve(f"{SAMPLER}:numbered", "--arg", "per_stream=500", "--epochs", "2",
                   "--min-trainers", "2")
    slow, fast = run_trainers(server, tmp_path, step_ms=0.3)
    assert server.wait(timeout=30) == 0
    for epoch in (1, 2):
        got = Counter(i for e, i in slow + fast if e == epoch)
        assert got == Counter(range(2000)), f"epoch {epoch}"


def test_a_server_ends_soon_after_the_others_when_a_trainer_was_sigkilled(
    serve: Any, tmp_path: Path
) -> None:
    # What the killed trainer had not handed out goes to the survivor, and the server ends
    # once the survivor has acknowledged all of it. Once (with the at-most-once plain
    # delivery) the server waited the whole --drain-timeout: the dead trainer, asked a
    # question it never answered, was asked nothing more, so no send ever found it gone.
    server = serve(f"{SAMPLER}:numbered", "--arg", "per_stream=500", "--epochs", "2",
                   "--min-trainers", "2", "--drain-timeout", "120")
    doomed, others = run_trainers(server, tmp_path, die_after=307)
    assert len(doomed) == 307 and others
    # Not a speed bound: a server that waits for the dead trainer takes 120 s here.
    assert server.wait(timeout=40) == 0, "the server waited for the SIGKILLed trainer"
    assert_each_once(doomed + others, epochs=2, epoch_size=2000)


def test_a_restarted_server_deals_again_none_of_what_a_departed_trainer_handed_out(
    serve: Any, tmp_path: Path
) -> None:
    # Three trainers share the stream; one leaves cleanly early on, holding its credit's
    # worth of messages unhanded. The two others stop reading at 128 samples each (the
    # server dies at a known point, not after they finished) and outlive the server; each
    # reports its last 32 messages to the restarted one: those reach back past what the
    # third handed out, which nobody reports. The restarted server must resume after the
    # survivors' latest hand-outs, not at their oldest reported range, and deal again what
    # the leaver held (in the old server's re-deal queue, or queued unhanded at a survivor:
    # below the survivors' latest hand-outs, reported by nobody), which the old server's
    # summary of the hand-outs lists.
    command = (f"{SAMPLER}:numbered", "--arg", "per_stream=100", "--epochs", "2",
               "--samples-per-message", "8")
    endpoints = Endpoints.ipc(tmp_path)  # the restarted server binds the same endpoints
    server = serve(*command, "--min-trainers", "3", endpoints=endpoints)
    names = ["leaver", "a", "b"]
    hold = ["--step-ms", "5", "--hold-after", "128", "--go-file", str(tmp_path / "go")]
    trainers = spawn_reliable(server, tmp_path, names, [["--stop-after", "40"], hold, hold])
    try:
        assert trainers[0].wait(timeout=60) == 0
        # 88 steps of 5 ms after the leaver left: past a summary that lists what it held.
        wait_until(lambda: all(len(read_record(tmp_path / name)) >= 128 for name in "ab"),
                   60, "both survivors at 128 samples")
        server.kill()
        server.wait(timeout=10)
        server = serve(*command, "--min-trainers", "2", endpoints=endpoints)
        (tmp_path / "go").touch()
        assert [trainer.wait(timeout=90) for trainer in trainers[1:]] == [0, 0]
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining(trainers)
    rows = [pair for name in names for pair in read_record(tmp_path / name)]
    assert len(read_record(tmp_path / "leaver")) == 40
    # Epoch 1, cut by the crash, is whole too (what the leaver held was dealt again), and
    # nothing anyone handed out comes twice.
    assert_each_once(rows, epochs=2, epoch_size=400)


def test_a_restarted_server_deals_again_what_a_trainer_killed_with_the_old_one_held(
    serve: Any, tmp_path: Path
) -> None:
    # The holder hands out 40 samples (5 messages) and stops reading, holding its credit's
    # worth of messages; the two others go on. Server and holder are then SIGKILLed at once:
    # the holder's messages lie below the survivors' latest hand-outs and nobody reports
    # them. The old server's summary of the hand-outs, which the survivors read and give to
    # the restarted one, lists them as not handed out: they are dealt again.
    command = (f"{SAMPLER}:numbered", "--arg", "per_stream=200", "--epochs", "2",
               "--samples-per-message", "8")
    endpoints = Endpoints.ipc(tmp_path)  # the restarted server binds the same endpoints
    server = serve(*command, "--min-trainers", "3", endpoints=endpoints)
    names = ["holder", "a", "b"]
    trainers = spawn_reliable(server, tmp_path, names, [
        ["--hold-after", "40", "--go-file", str(tmp_path / "never")],
        ["--step-ms", "5"], ["--step-ms", "5"]])
    try:
        # 88 steps of 5 ms after the holder stopped: past a summary that lists what it holds.
        wait_until(lambda: all((tmp_path / name).exists() for name in names) and len(
            read_record(tmp_path / "holder")) == 40 and all(
            len(read_record(tmp_path / name)) >= 128 for name in "ab"), 60,
            "the holder at 40 samples, both others past 128")
        server.kill()
        trainers[0].kill()
        server.wait(timeout=10)
        trainers[0].wait(timeout=10)
        server = serve(*command, "--min-trainers", "2", endpoints=endpoints)
        assert [trainer.wait(timeout=90) for trainer in trainers[1:]] == [0, 0]
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining(trainers)
    rows = [pair for name in names for pair in read_record(tmp_path / name)]
    assert_each_once(rows, epochs=2, epoch_size=800)


def test_a_trainer_whose_hello_a_killed_server_swallowed_joins_the_restarted_one(
    serve: Any, tmp_path: Path
) -> None:
    # The trainer's hello reaches a server process that dies before it answers (here a
    # bare socket on the control endpoint that reads it and closes). The restarted server
    # on the same endpoints waits for one trainer: it gets that trainer's heartbeats but no
    # hello, and the trainer, welcomed for the first time, must say hello now.
    endpoints = Endpoints.ipc(tmp_path)
    context = zmq.Context()
    swallower = context.socket(zmq.ROUTER)
    swallower.linger = 0
    swallower.bind(endpoints.control)
    with RemoteLoader(endpoints.data, control=endpoints.control, timeout=30) as loader:
        samples = iter(loader)
        first = CheckedThread(next, samples)
        # The loader's acknowledging thread has a socket of its own on the control endpoint
        # and may speak first (a sign of life, once a second): the hello is what is awaited.
        deadline = time.monotonic() + 20
        hello = None
        while not isinstance(hello, Hello) and swallower.poll(
                max(0, int((deadline - time.monotonic()) * 1000))):
            hello = decode(swallower.recv_multipart()[1:])
        assert isinstance(hello, Hello) and hello.role == "trainer", "the trainer said no hello"
        swallower.close()
        context.term()
        serve(f"{SAMPLER}:numbered", "--min-trainers", "1", endpoints=endpoints)
        assert first.join(timeout=25) is not None  # a sample: the server admitted it


def test_shared_memory_with_reliable_delivery_loses_nothing_when_a_trainer_is_killed(
    serve: Any, tmp_path: Path
) -> None:
    # 256 KiB arrays travel as references to the server's shared-memory pool (it was once
    # off with --reliable); the server keeps its own copy of each in its ledger, so what the
    # killed trainer had not handed out (its pool runs taken back) goes to the other.
    server = serve(f"{SAMPLER}:numbered", "--arg", "per_stream=60", "--arg", "width=65536",
                   "--epochs", "2", "--samples-per-message", "4",
                   "--min-trainers", "2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data, server.control]
    processes = [
        subprocess.Popen([*common, str(tmp_path / "doomed"), "--die-after", "90",
                          "--step-ms", "2"], env=env, cwd=ROOT),
        subprocess.Popen([*common, str(tmp_path / "survivor"), "--step-ms", "1",
                          "--views-out", str(tmp_path / "survivor.views")], env=env, cwd=ROOT)]
    try:
        assert processes[0].wait(timeout=60) == -9
        stats = feedmux.fetch_stats(server.control, timeout=10)
        assert int(stats["shm_messages"]) > 0, "the large arrays did not go through the pool"
        assert processes[1].wait(timeout=60) == 0
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining(processes)
    doomed, survivor = read_record(tmp_path / "doomed"), read_record(tmp_path / "survivor")
    assert int((tmp_path / "survivor.views").read_text()) > 0, "no sample came as a view"
    assert len(doomed) == 90
    for epoch in (1, 2):
        got = Counter(i for e, i in doomed + survivor if e == epoch)
        assert got == Counter(range(240)), f"epoch {epoch}: lost or handed out twice"



def test_a_trainer_back_from_the_old_run_takes_nothing_of_the_new_runs_epochs(
    serve: Any, tmp_path: Path
) -> None:
    # A trainer outlives its server in epoch 4 (in a long step: it reads nothing); the
    # server restarts on the same endpoints and a new trainer starts the new run at epoch 1
    # before the old trainer says hello. That hello reports the old trainer's last 32
    # messages, the old run's epochs 1 to 4: none of that is the new run's, whose epochs
    # must each come whole to the two of them. The restarted server kept every reported
    # position out of its own epochs (here all of 2 and 3; in a long run, the burst of
    # the epoch where the old run had stopped, once the new run got there).
    command = (f"{SAMPLER}:numbered", "--arg", "per_stream=10", "--samples-per-message", "4")
    endpoints = Endpoints.ipc(tmp_path)
    server = serve(*command, endpoints=endpoints)
    old = spawn_reliable(server, tmp_path, ["old"], [
        ["--record-server", "--hold-after", "130", "--go-file", str(tmp_path / "go")]])[0]
    trainers = [old]
    try:
        wait_until(lambda: (tmp_path / "old").exists()
                   and len(read_lines(tmp_path / "old")) >= 130, 60, "the old run's trainer")
        server.kill()
        server.wait(timeout=10)
        server = serve(*command, "--epochs", "4", endpoints=endpoints)
        trainers += spawn_reliable(server, tmp_path, ["new"], [
            ["--record-server", "--step-ms", "20"]])
        wait_until(lambda: (tmp_path / "new").exists() and bool(read_lines(tmp_path / "new")),
                   60, "the new trainer's first sample of the new run")
        (tmp_path / "go").touch()
        assert [trainer.wait(timeout=60) for trainer in trainers] == [0, 0]
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining(trainers)
    new_run = read_lines(tmp_path / "new")[0][2]
    rows = [(int(epoch), int(sample_id)) for name in ("old", "new")
            for epoch, sample_id, server_id in read_lines(tmp_path / name)
            if server_id == new_run]
    assert_each_once(rows, epochs=4, epoch_size=40)


def read_lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()]
