"""A rank killed with SIGKILL mid-epoch and restarted with the same rank (what torchrun does).

The restarted trainer must receive the rest of its rank's share right after the
last sample its predecessor handed out: together the two take exactly the
rank's share of every epoch, the other rank is not disturbed, and every sample
of every epoch is delivered exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ROOT, kill_remaining

pytestmark = pytest.mark.timeout(120)

SAMPLER = "tests.integration.samplers:numbered"
EPOCH = 200  # 2 streams x 100: each of the 2 ranks gets 100 samples per epoch
EPOCHS = 2


def read_ranked(path: Path) -> list[tuple[int, int, int]]:
    """(epoch, id, position) per line of a ranked trainer's record."""
    return [tuple(int(field) for field in line.split())  # type: ignore[misc]
            for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("workers", "width", "reliable"), [
    ("1", "4", False), ("2", "4", False), ("1", "8192", False), ("2", "8192", False),
    ("1", "4", True), ("2", "8192", True)],
    ids=["workers1", "workers2", "shm-pool", "shm-pool-workers2", "reliable",
         "reliable-workers2-shm-pool"])
def test_a_restarted_rank_continues_right_after_its_predecessor(
    serve: Any, tmp_path: Path, workers: str, width: str, reliable: bool
) -> None:
    # width 8192: 16 samples of 32 KiB make a 512 KiB array frame, which goes to the
    # ranks (same host) through the shared-memory pool, in place: the server keeps the
    # message's frames for a successor, and their runs stay pinned until it lets go
    # (with 2 workers: written into the pool by them, dealt from a copy out of it).
    # Reliable: ranked loaders on a --reliable server (they were refused), with the same
    # guarantees.
    mode = ["--reliable"] if reliable else []
    server = serve(SAMPLER, "--arg", "streams=2", "--arg", "per_stream=100", "--arg",
                   f"width={width}", "--epochs", str(EPOCHS), "--epoch-size", str(EPOCH),
                   "--samples-per-message", "16", "--workers", workers, *mode)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def trainer(rank: int, name: str, *flags: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.trainers", server.data, server.control,
             str(tmp_path / name), "--rank", str(rank), "--world-size", "2", *mode, *flags],
            env=env, cwd=ROOT)

    # Rank 1 dies inside its 3rd message of epoch 1 (16 samples a message), after a step.
    processes = [trainer(0, "rank0", "--step-ms", "1"),
                 trainer(1, "doomed", "--die-after", "37", "--step-ms", "1")]
    try:
        assert processes[1].wait(timeout=60) == -9
        processes.append(trainer(1, "restarted"))  # a new client id, the same rank
        assert processes[0].wait(timeout=60) == 0
        assert processes[2].wait(timeout=60) == 0
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining(processes)

    rank0 = read_ranked(tmp_path / "rank0")
    doomed = read_ranked(tmp_path / "doomed")
    restarted = read_ranked(tmp_path / "restarted")
    assert len(doomed) == 37
    # The successor starts right after the predecessor's last sample: no gap, no repeat.
    rank1 = doomed + restarted
    assert [position for _, _, position in rank1] == [
        position for epoch in range(1, EPOCHS + 1) for position in range(1, EPOCH, 2)
    ], "rank 1 took positions out of order, twice or not at all"
    for epoch in range(1, EPOCHS + 1):
        shares = [[row for row in record if row[0] == epoch] for record in (rank0, rank1)]
        assert [len(share) for share in shares] == [EPOCH // 2, EPOCH // 2]
        ids = Counter(sample_id for share in shares for _, sample_id, _ in share)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, (
            f"epoch {epoch}: not every sample exactly once"
        )


@pytest.mark.parametrize("run", range(2))
def test_a_rank_killed_right_after_its_first_samples_is_continued_not_replayed(
    serve: Any, tmp_path: Path, run: int
) -> None:
    # The loader acknowledges from a thread, which a busy machine may schedule late (played
    # here: it starts 3 s late, past the doomed rank's life). A rank SIGKILLed 100 ms after
    # its 10th sample of epoch 1 must still be continued right after it: the loader does
    # not hand out a sample before its acknowledgements can reach the server. 32 KiB
    # samples: the stream does not fit in the socket buffers, the server is still sampling
    # when the successor comes.
    server = serve(SAMPLER, "--arg", "streams=2", "--arg", "per_stream=100", "--arg",
                   "width=8192", "--epochs", "2", "--epoch-size", str(EPOCH),
                   "--samples-per-message", "4")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def trainer(name: str, *flags: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.trainers", server.data, server.control,
             str(tmp_path / name), "--rank", "0", "--world-size", "1", *flags],
            env=env, cwd=ROOT)

    processes = [trainer("doomed", "--die-after", "10", "--abrupt", "--step-ms", "100",
                         "--acks-late-ms", "3000")]
    try:
        assert processes[0].wait(timeout=60) == -9
        processes.append(trainer("restarted"))
        assert processes[1].wait(timeout=60) == 0
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining(processes)
    doomed = read_ranked(tmp_path / "doomed")
    restarted = read_ranked(tmp_path / "restarted")
    assert [position for _, _, position in doomed] == list(range(10))
    first = [position for epoch, _, position in restarted if epoch == 1]
    assert first == list(range(10, EPOCH)), (
        f"the restarted rank took epoch 1 from position {first[:1]}, expected 10 on"
    )
