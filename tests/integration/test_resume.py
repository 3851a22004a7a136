"""A ranked job resumed from its checkpoint gets exactly what an uninterrupted run would have.

Every test records each rank's sequence in an uninterrupted run of a seeded
exhaustive mux, then interrupts a second run (each rank saves its
``Stream.state_dict()`` at a step of epoch 2 and is SIGKILLed a little later,
with or without its server) and resumes it from the saved states. For every
rank, its samples up to the checkpoint plus its samples after the restart must
be its uninterrupted sequence: nothing the checkpointed model trained on
again, nothing it never saw skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ROOT, Endpoints, Spawned, wait_until

pytestmark = pytest.mark.timeout(180)

SAMPLER = "tests.integration.samplers:numbered"
PER_STREAM = 60
EPOCH = 4 * PER_STREAM  # 240 samples
EPOCHS = 3
SAVE_STEP = 37  # the step of epoch 2 each rank checkpoints at
Row = tuple[int, int, int]  # (epoch, id, position)


def read(path: Path) -> list[Row]:
    return [tuple(int(field) for field in line.split())  # type: ignore[misc]
            for line in path.read_text().splitlines()]


class Job:
    """Starts ranked trainer processes; every one is killed at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: list[subprocess.Popen[bytes]] = []

    def rank(self, server: Spawned, name: str, rank: int, world_size: int,
             *flags: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.resume_trainer", server.data,
             server.control, str(self.tmp_path / name), "--rank", str(rank), "--world-size",
             str(world_size), *flags],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
        self.processes.append(process)
        return process

    def run(self, server: Spawned, prefix: str, world_size: int, *flags: str) -> list[list[Row]]:
        """Every rank to its end (exit 0); their records."""
        ranks = [self.rank(server, f"{prefix}{r}", r, world_size, *flags)
                 for r in range(world_size)]
        assert [process.wait(timeout=120) for process in ranks] == [0] * world_size
        return [read(self.tmp_path / f"{prefix}{r}") for r in range(world_size)]

    def crash(self, server: Spawned, prefix: str, world_size: int) -> list[list[Row]]:
        """Every rank saves its state at SAVE_STEP of epoch 2 and dies 5 samples later."""
        ranks = [self.rank(server, f"{prefix}{r}", r, world_size, "--save-at",
                           f"2:{SAVE_STEP}", "--state", str(self.tmp_path / f"state{r}.json"),
                           "--die-after-save", "5", "--step-ms", "1")
                 for r in range(world_size)]
        assert [process.wait(timeout=120) for process in ranks] == [-9] * world_size
        return [read(self.tmp_path / f"{prefix}{r}") for r in range(world_size)]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture
def job(tmp_path: Path) -> Any:
    started = Job(tmp_path)
    yield started
    started.close()


def until_checkpoint(record: list[Row]) -> list[Row]:
    """The samples a rank had handed out when it saved its state (SAVE_STEP of epoch 2)."""
    steps = sum(1 for row in record if row[0] == 1) + SAVE_STEP
    return record[:steps]


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("restart_server", [True, False], ids=["server-too", "trainers-only"])
def test_a_resumed_job_continues_exactly_where_its_checkpoint_was(
    serve: Callable[..., Spawned], job: Job, tmp_path: Path, workers: str, restart_server: bool
) -> None:
    # 64 KiB samples: the stream cannot fit in the socket buffers, so a server that kept
    # running is still sampling (not draining) when the job comes back.
    command = (SAMPLER, "--arg", f"per_stream={PER_STREAM}", "--arg", "width=16384",
               "--epochs", str(EPOCHS), "--workers", workers, "--samples-per-message", "8")
    uninterrupted = job.run(serve(*command), "whole", 2)
    server = serve(*command)
    crashed = job.crash(server, "crashed", 2)
    if restart_server:
        server.kill()
        server = serve(*command)
    resumed = job.run(server, "resumed", 2, "--resume", str(tmp_path / "state{rank}.json"))
    for rank in range(2):
        assert until_checkpoint(crashed[rank]) + resumed[rank] == uninterrupted[rank], (
            f"rank {rank}: the resumed run is not the uninterrupted one"
        )
    assert server.wait(timeout=30) == 0


def by_position(records: list[list[Row]]) -> dict[tuple[int, int], int]:
    """(epoch, position) -> id over every rank's record of a run."""
    return {(epoch, position): sample_id
            for record in records for epoch, sample_id, position in record}


def test_a_job_checkpointed_with_2_ranks_resumes_with_3(
    serve: Callable[..., Spawned], job: Job, tmp_path: Path
) -> None:
    command = (SAMPLER, "--arg", f"per_stream={PER_STREAM}", "--epochs", str(EPOCHS),
               "--samples-per-message", "8")
    uninterrupted = by_position(job.run(serve(*command), "whole", 2))
    server = serve(*command)
    job.crash(server, "crashed", 2)
    server.kill()
    # Every new rank loads rank 0's state: the position is the job's, not the rank's.
    resumed = job.run(serve(*command), "resumed", 3, "--resume", str(tmp_path / "state0.json"))
    start = 2 * SAVE_STEP  # the global position after SAVE_STEP rounds of 2 ranks
    rest = EPOCH - start
    steps = -(-rest // 3)  # pad: every rank gets ceil(rest / 3)
    for epoch, expected_steps, first in ((2, steps, start), (3, EPOCH // 3, 0)):
        shares = [[row for row in record if row[0] == epoch] for record in resumed]
        assert [len(share) for share in shares] == [expected_steps] * 3, f"epoch {epoch}"
        rows = [row for share in shares for row in share]
        real = sorted(position for _, _, position in rows if position < EPOCH)
        assert real == list(range(first, EPOCH)), (
            f"epoch {epoch}: not every position not consumed before the checkpoint, once"
        )
        assert len(rows) - len(real) == 3 * expected_steps - (EPOCH - first), "extra padding"
        for _, sample_id, position in rows:
            if position < EPOCH:
                assert uninterrupted[(epoch, position)] == sample_id, (
                    f"epoch {epoch} position {position}: another sample than the "
                    f"uninterrupted run's"
                )


def test_ranks_resuming_from_different_checkpoints_get_a_clear_error_and_nothing(
    serve: Callable[..., Spawned], job: Job, tmp_path: Path
) -> None:
    command = (SAMPLER, "--arg", f"per_stream={PER_STREAM}", "--epochs", str(EPOCHS),
               "--samples-per-message", "8")
    server = serve(*command)
    job.crash(server, "crashed", 2)
    server.kill()
    # Rank 1's checkpoint is from another step than rank 0's: a broken checkpoint.
    state = json.loads((tmp_path / "state1.json").read_text())
    state["loader"]["resume"] = [[2, 2 * SAVE_STEP + 10, 2]]
    (tmp_path / "state1.json").write_text(json.dumps(state))
    server = serve(*command)
    ranks = [job.rank(server, f"broken{r}", r, 2, "--resume", str(tmp_path / "state{rank}.json"))
             for r in range(2)]
    assert [process.wait(timeout=60) for process in ranks] == [1, 1]
    for rank in range(2):
        assert read(tmp_path / f"broken{rank}") == [], "a rank got samples"
    log = server.wait_for_stderr(lambda text: "different positions" in text, 30,
                                 "the server's error")
    assert f"rank 0: a checkpoint at epoch 2, position {2 * SAVE_STEP}" in log
    assert f"rank 1: a checkpoint at epoch 2, position {2 * SAVE_STEP + 10}" in log


def test_ranks_that_outlive_their_server_continue_where_each_is(
    serve: Callable[..., Spawned], job: Job, tmp_path: Path
) -> None:
    command = (SAMPLER, "--arg", f"per_stream={PER_STREAM}", "--epochs", str(EPOCHS),
               "--samples-per-message", "8")
    uninterrupted = job.run(serve(*command), "whole", 2)
    endpoints = Endpoints.ipc(tmp_path)  # the restarted server binds the same endpoints
    server = serve(*command, endpoints=endpoints)
    ranks = [job.rank(server, f"live{r}", r, 2, "--step-ms", "2") for r in range(2)]
    record = tmp_path / "live0"
    wait_until(lambda: record.exists() and len(read(record)) > EPOCH // 2 + 20, 60,
               "rank 0 in epoch 2")
    server.kill()
    server.wait(timeout=10)
    server = serve(*command, endpoints=endpoints)
    assert [process.wait(timeout=120) for process in ranks] == [0, 0]
    assert server.wait(timeout=30) == 0
    for rank in range(2):
        assert read(tmp_path / f"live{rank}") == uninterrupted[rank], (
            f"rank {rank}: samples lost or repeated across the server's restart"
        )


@pytest.mark.timeout(240)
def test_the_torchrun_example_checkpoints_crashes_and_resumes(
    serve: Callable[..., Spawned], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    # Samples (8 KiB) and epochs large enough that the stream does not fit in the socket
    # buffers: the server is still sampling when the job crashes.
    command = (SAMPLER, "--arg", "streams=2", "--arg", "per_stream=400", "--arg", "width=2048",
               "--epochs", "3", "--samples-per-message", "4", "--hwm", "4")

    def torchrun(server: Spawned, results: Path, *flags: str) -> tuple[int, str]:
        results.mkdir()
        done = subprocess.run(
            [str(Path(sys.executable).with_name("torchrun")), "--standalone",
             "--nproc_per_node", "2", str(ROOT / "examples" / "ddp_train.py"), "--address",
             server.data, "--control", server.control, "--results", str(results), *flags],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
            text=True, timeout=120)
        return done.returncode, done.stderr[-3000:]

    code, stderr = torchrun(serve(*command), tmp_path / "whole")
    assert code == 0, stderr
    whole = [json.loads((tmp_path / "whole" / f"rank{r}.json").read_text()) for r in range(2)]
    server = serve(*command)
    # 400 steps per epoch: checkpoints every 250 steps, the last at 500 (epoch 2, step 100),
    # a crash at step 600.
    flags = ("--checkpoint", str(tmp_path), "--every", "250")
    assert torchrun(server, tmp_path / "crashed", *flags, "--crash-at", "600")[0] != 0
    code, stderr = torchrun(server, tmp_path / "resumed", *flags, "--resume")  # the same server
    assert code == 0, stderr
    for rank in range(2):
        resumed = json.loads((tmp_path / "resumed" / f"rank{rank}.json").read_text())
        assert resumed == [whole[rank][1][100:], whole[rank][2]], (
            f"rank {rank} did not go on from its checkpoint"
        )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_free_reliable_trainers_that_outlive_their_server_lose_and_repeat_nothing(
    serve: Callable[..., Spawned], job: Job, tmp_path: Path, workers: str
) -> None:
    command = (SAMPLER, "--arg", f"per_stream={PER_STREAM}", "--arg", "width=16384",
               "--epochs", str(EPOCHS), "--workers", workers, "--samples-per-message", "8",
               "--min-trainers", "2")
    endpoints = Endpoints.ipc(tmp_path)  # the restarted server binds the same endpoints
    server = serve(*command, endpoints=endpoints)
    trainers = [subprocess.Popen(
        [sys.executable, "-m", "tests.integration.trainers", server.data, server.control,
         str(tmp_path / f"free{index}"), "--step-ms", "2"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT) for index in range(2)]
    job.processes += trainers  # killed at the end of the test if still running

    def in_epoch_2() -> bool:
        return any(line.startswith("2 ") for index in range(2)
                   if (tmp_path / f"free{index}").exists()
                   for line in (tmp_path / f"free{index}").read_text().splitlines())

    wait_until(in_epoch_2, 60, "a trainer in epoch 2")
    server.kill()
    server.wait(timeout=10)
    server = serve(*command, endpoints=endpoints)
    assert [trainer.wait(timeout=120) for trainer in trainers] == [0, 0]
    assert server.wait(timeout=30) == 0
    rows = [tuple(int(field) for field in line.split()) for index in range(2)
            for line in (tmp_path / f"free{index}").read_text().splitlines()]
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(sample_id for row_epoch, sample_id in rows if row_epoch == epoch)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, (
            f"epoch {epoch}: a sample lost or repeated across the server's restart: "
            f"{sorted(i for i in range(EPOCH) if ids[i] != 1)[:20]}"
        )
