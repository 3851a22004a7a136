"""A rank killed with SIGKILL mid-epoch and restarted with the same rank (what torchrun does).

The restarted trainer must receive the rest of its rank's share right after the
last sample its predecessor handed out: together the two take exactly the
rank's share of every epoch, the other rank is not disturbed, and every sample
of every epoch is delivered exactly once. "Handed out" is what the server was told:
a rank SIGKILLed within a few tens of milliseconds of its last samples may die
before its acknowledging thread told the server (docs/ddp.md), and its successor
then gets those samples again (never a gap). So the predecessors here die once
their thread sent the mark of their last sample, or the tests name the mark the
server cut at.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from feedmux.client._markfile import mark_path
from tests.integration.conftest import ROOT, kill_remaining

pytestmark = pytest.mark.timeout(120)

SAMPLER = "tests.integration.samplers:numbered"
EPOCH = 200  # 2 streams x 100: each of the 2 ranks gets 100 samples per epoch
EPOCHS = 2


Start = Callable[..., "subprocess.Popen[bytes]"]


def ranked_trainers(server: Any, folder: Path, *options: str, world_size: int = 2) -> Start:
    """``start(rank, name, *flags)``: a ranked trainer process of ``server`` that records
    what it hands out in ``folder / name``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(rank: int, name: str, *flags: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.trainers", server.data, server.control,
             str(folder / name), "--rank", str(rank), "--world-size", str(world_size),
             *options, *flags], env=env, cwd=ROOT)

    return start


def killed_and_restarted(server: Any, start: Start, processes: list[subprocess.Popen[bytes]],
                         rank: int, timeout: float, exit_code: int = -9) -> None:
    """The last of ``processes`` (rank ``rank``'s doomed trainer) ends with ``exit_code``,
    a new trainer ``restarted`` takes its rank, and every trainer and the server end 0."""
    try:
        assert processes[-1].wait(timeout=timeout) == exit_code
        processes.append(start(rank, "restarted"))  # a new client id, the same rank
        for process in processes[:-2] + processes[-1:]:
            assert process.wait(timeout=timeout) == 0
        assert server.wait(timeout=timeout / 2) == 0
    finally:
        kill_remaining(processes)


def read_ranked(path: Path) -> list[tuple[int, int, int]]:
    """(epoch, id, position) per line of a ranked trainer's record."""
    return [tuple(int(field) for field in line.split())  # type: ignore[misc]
            for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("workers", "width"), [
    ("1", "4"), ("2", "4"), ("1", "8192"), ("2", "8192")],
    ids=["workers1", "workers2", "shm-pool", "shm-pool-workers2"])
def test_a_restarted_rank_continues_right_after_its_predecessor(
    serve: Any, tmp_path: Path, workers: str, width: str
) -> None:
    # width 8192: 16 samples of 32 KiB make a 512 KiB array frame, which goes to the
    # ranks (same host) through the shared-memory pool, in place: the server keeps the
    # message's frames for a successor, and their runs stay pinned until it lets go
    # (with 2 workers: written into the pool by them, dealt from a copy out of it).
    # Every loader grants credit now (what --reliable asked for before): a rank's holder
    # is sent no more than its credit, with the same guarantees.
    server = serve(SAMPLER, "--arg", "streams=2", "--arg", "per_stream=100", "--arg",
                   f"width={width}", "--epochs", str(EPOCHS), "--epoch-size", str(EPOCH),
                   "--samples-per-message", "16", "--workers", workers)
    trainer = ranked_trainers(server, tmp_path)
    # Rank 1 dies inside its 3rd message of epoch 1 (16 samples a message), after a step.
    killed_and_restarted(server, trainer, [
        trainer(0, "rank0", "--step-ms", "1"),
        trainer(1, "doomed", "--die-after", "37", "--step-ms", "1")], rank=1, timeout=60)

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


#: The server's line when a rank's new holder got its predecessor's rest: the mark it cut at.
TAKEN_OVER = re.compile(
    r"rank 0 taken over: re-sent \d+ message\(s\) from after \((\d+), (-?\d+)\)")


@pytest.mark.parametrize("run", range(2))
def test_a_rank_killed_right_after_its_first_samples_is_continued_not_replayed(
    serve: Any, tmp_path: Path, run: int
) -> None:
    # The loader acknowledges from a thread, which a busy machine may schedule late (played
    # here: it starts 3 s late, past the doomed rank's life). The loader does not hand out
    # a sample before its acknowledgements can reach the server, so a rank SIGKILLed 100 ms
    # after its 10th sample of epoch 1 is continued right after the last mark the server
    # got, not from the start of the epoch. Which mark that is depends on the scheduler
    # (docs/ddp.md): the thread sends one per message, one within a message at least every
    # 100 ms, and a loaded machine may not run it at all in the doomed rank's last few
    # hundred ms. So the successor repeats exactly what was handed out after that mark, and
    # the mark is one of this epoch (the thread ran at least once in the doomed rank's
    # second of hand-outs). 32 KiB samples: the stream does not fit in the socket
    # buffers, the server is still sampling when the successor comes.
    server = serve(SAMPLER, "--arg", "streams=2", "--arg", "per_stream=100", "--arg",
                   "width=8192", "--epochs", "2", "--epoch-size", str(EPOCH),
                   "--samples-per-message", "4", "--log-level", "info")
    trainer = ranked_trainers(server, tmp_path, world_size=1)
    killed_and_restarted(server, trainer, [
        trainer(0, "doomed", "--die-after", "10", "--abrupt", "--step-ms", "100",
                "--acks-late-ms", "3000")], rank=0, timeout=60)
    doomed = read_ranked(tmp_path / "doomed")
    restarted = read_ranked(tmp_path / "restarted")
    assert [position for _, _, position in doomed] == list(range(10))
    taken_over = TAKEN_OVER.search(server.stderr)
    assert taken_over is not None, f"no take-over in the server's log:\n{server.stderr}"
    mark = (int(taken_over[1]), int(taken_over[2]))
    assert (1, 0) <= mark <= (1, 9), f"the server cut the rank's share at {mark}"
    first = [position for epoch, _, position in restarted if epoch == 1]
    assert first == list(range(mark[1] + 1, EPOCH)), (
        f"the restarted rank took epoch 1 from position {first[:1]}, expected {mark[1] + 1} "
        f"on (right after the server's mark {mark})"
    )


#: The scenario of a seeded exhaustive StochasticMux of 7 streamers x 13 items (3 active):
#: epochs of 91 samples, dealt to 2 ranks with the default padding: 46 steps each.
SCENARIO_EPOCH = 91
SCENARIO_STEPS = 46  # ceil(91 / 2): rank 1's last step repeats position 0 as position 91
SCENARIO_EPOCHS = 3
SCENARIO_SEED = 38


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", ["1", "2"], ids=["workers1", "workers2"])
@pytest.mark.parametrize("declared", [False, True], ids=["measured", "declared"])
@pytest.mark.parametrize("kill_epoch", [1, 2, 3], ids=["epoch1", "epoch2", "epoch3"])
def test_a_rank_killed_at_step_10_continues_with_default_messages(
    serve: Any, tmp_path: Path, kill_epoch: int, declared: bool, workers: str
) -> None:
    # The loaders' and the server's defaults (samples per message, hwm, no --epoch-size: the
    # epoch size is only known once the first epoch was sampled), 1 or 2 sampling workers.
    # Rank 1 stops reading at step 10 of epoch ``kill_epoch`` and is SIGKILLed once its
    # acknowledging thread sent the mark of that step (docs/ddp.md: what it handed out after
    # its last mark reached the server comes again); a new process takes rank 1.
    print(f"seed {SCENARIO_SEED}")
    size = ["--epoch-size", str(SCENARIO_EPOCH)] if declared else []
    server = serve(SAMPLER, "--arg", "streams=7", "--arg", "per_stream=13", "--arg",
                   "n_active=3", "--arg", f"seed={SCENARIO_SEED}", "--seed", str(SCENARIO_SEED),
                   "--epochs", str(SCENARIO_EPOCHS), "--workers", workers, "--log-level", "info",
                   *size)
    trainer = ranked_trainers(server, tmp_path, "--hwm", "0")
    handed = (kill_epoch - 1) * SCENARIO_STEPS + 10
    killed_and_restarted(server, trainer, [
        trainer(0, "rank0"), trainer(1, "doomed", "--die-after", str(handed))],
        rank=1, timeout=40)

    rank0 = read_ranked(tmp_path / "rank0")
    doomed = read_ranked(tmp_path / "doomed")
    restarted = read_ranked(tmp_path / "restarted")
    assert len(doomed) == handed
    epochs = range(1, SCENARIO_EPOCHS + 1)
    steps = range(SCENARIO_STEPS)
    # The successor's steps continue its predecessor's: together, the uninterrupted rank 1.
    taken = [(epoch, position) for epoch, _, position in restarted]
    expected = [(epoch, 2 * step + 1) for epoch in epochs for step in steps]
    assert taken == expected[handed:], (
        f"the restarted rank 1 took {taken[:3]}...: expected {expected[handed:handed + 3]}... "
        f"(right after its predecessor's last step, {expected[handed - 1]}); the server's "
        f"log:\n{server.stderr}"
    )
    assert [(epoch, position) for epoch, _, position in rank0] == [
        (epoch, 2 * step) for epoch in epochs for step in steps]
    for epoch in epochs:
        shares = [[row for row in record if row[0] == epoch] for record in (rank0,
                                                                            doomed + restarted)]
        assert [len(share) for share in shares] == [SCENARIO_STEPS, SCENARIO_STEPS], (
            f"epoch {epoch}: rank 0 and rank 1 took unequal steps (DDP would hang)")
        ids = Counter(sample_id for share in shares for _, sample_id, position in share
                      if position < SCENARIO_EPOCH)
        assert sorted(ids) == list(range(SCENARIO_EPOCH)) and set(ids.values()) == {1}, (
            f"epoch {epoch}: not every sample exactly once")


#: A rank killed while it hands out as fast as it can: epochs of 1000, 500 per rank.
FAST_EPOCH = 1000


@pytest.mark.parametrize("kill_at", [137, 611], ids=["epoch1", "epoch2"])
def test_a_rank_killed_mid_hand_out_is_continued_exactly(
    serve: Any, tmp_path: Path, kill_at: int
) -> None:
    # Rank 1 reads with no step at all (small samples, several messages queued) and is
    # SIGKILLed right after its ``kill_at``-th hand-out, whatever its acknowledging thread
    # told the server: the marks go out every 20 to 100 ms, so the server's last mark lags
    # the hand-outs by dozens of samples here. The loader's mark file (docs/ddp.md) keeps
    # the last hand-out across the SIGKILL: the successor continues right after it, and
    # the union of the two records is the uninterrupted rank 1 (no repeat, no gap).
    server = serve(SAMPLER, "--arg", "streams=4", "--arg", "per_stream=250", "--epochs", "2",
                   "--epoch-size", str(FAST_EPOCH), "--samples-per-message", "16",
                   "--log-level", "info")
    trainer = ranked_trainers(server, tmp_path)
    killed_and_restarted(server, trainer, [
        trainer(0, "rank0"), trainer(1, "doomed", "--die-after", str(kill_at), "--abrupt")],
        rank=1, timeout=60)
    doomed = read_ranked(tmp_path / "doomed")
    restarted = read_ranked(tmp_path / "restarted")
    assert len(doomed) == kill_at
    for rank in (0, 1):  # the successor replaced its predecessor's; a clean close removes it
        assert not os.path.exists(mark_path([server.data], [server.control], "", rank, 2))
    taken = [(epoch, position) for epoch, _, position in doomed + restarted]
    expected = [(epoch, position) for epoch in (1, 2) for position in range(1, FAST_EPOCH, 2)]
    repeated = len(taken) - len(set(taken))
    assert taken == expected, (
        f"rank 1 took {len(taken)} samples, {repeated} of them twice: the successor started "
        f"at {restarted[:1]}, its predecessor's last was {doomed[-1:]}; the server's "
        f"log:\n{server.stderr}")
