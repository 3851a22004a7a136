"""The link between the hosts taken down for 5 s and brought up again, mid-epoch.

The server runs in host A, two trainers in host B (two ranks of one job, or two free
trainers). Before the fix, in most runs the ranks received the rest of epoch 1
and then nothing: the trainers' control connections timed out (ZMTP heartbeats, 3 s),
came back under fresh random identities the server did not know, the server's next control
send (the epoch size, at the end of epoch 1) failed on the old identities and forgot both
ranks, and their rest waited for successors that never came. Now a control DEALER keeps its
identity across reconnects (``<client id>/control``, taken over by ``ROUTER_HANDOVER``) and a
failed control send does not cost a recently heard rank its rank (``CONTROL_GRACE``).
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.conftest import Spawned, wait_until
from tests.multihost.hosts import TwoHosts
from tests.multihost.test_two_hosts import serve_in, trainer_in

pytestmark = pytest.mark.timeout(240)

EPOCH = 2000  # 4 streams x 500 samples of 32 KiB: 64 MB an epoch, more than the buffers hold
EPOCHS = 3
OUTAGE = 5.0


def lines(path: Path) -> list[list[int]]:
    return [[int(field) for field in line.split()] for line in path.read_text().splitlines()]


def run_with_outage(hosts: TwoHosts, tmp_path: Path, mode: list[str],
                    trainer_flags: list[list[str]]) -> tuple[Spawned, list[Path]]:
    """Serve 3 epochs in host A (the epoch size measured, so the server tells it to the
    trainers mid-run), start the trainers in host B, take the link down for 5 s once the
    first has 200 samples, bring it up, and wait for everyone to finish (bounded)."""
    server = serve_in(hosts, "--arg", "streams=4", "--arg", "per_stream=500", "--arg",
                      "width=8192", "--epochs", str(EPOCHS), "--samples-per-message", "16",
                      "--shm-size", "64", *mode)
    outs = [tmp_path / f"trainer{index}" for index in range(len(trainer_flags))]
    trainers = [trainer_in(hosts, "b", server, out, "--step-ms", "1", *mode, *flags,
                           stderr=subprocess.PIPE)
                for out, flags in zip(outs, trainer_flags, strict=True)]
    wait_until(lambda: outs[0].exists() and len(outs[0].read_text().splitlines()) > 200,
               60, "the first 200 samples")
    hosts.link(up=False)
    down = time.monotonic()
    wait_until(lambda: time.monotonic() - down >= OUTAGE, OUTAGE + 5, "the outage to pass")
    hosts.link(up=True)
    for trainer in trainers:
        code = trainer.wait(timeout=120)
        assert trainer.stderr is not None
        assert code == 0, f"a trainer failed ({code}):\n{trainer.stderr.read().decode()[-2000:]}"
    assert server.wait(timeout=60) == 0, server.stderr
    return server, outs


def test_two_ranks_lose_and_repeat_nothing_across_a_5_s_link_outage(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    flags = [["--rank", str(rank), "--world-size", "2"] for rank in range(2)]
    server, outs = run_with_outage(hosts, tmp_path, [], flags)
    records = [lines(out) for out in outs]
    for rank, record in enumerate(records):
        # Each rank: its positions of every epoch, in order, once (lines: epoch id position).
        assert [(epoch, position) for epoch, _, position in record] == [
            (epoch, position) for epoch in range(1, EPOCHS + 1)
            for position in range(rank, EPOCH, 2)], f"rank {rank} lost or repeated samples"
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(i for record in records for e, i, _ in record if e == epoch)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, (
            f"epoch {epoch}: not every sample exactly once")
    assert "unconfirmed" not in server.stderr, server.stderr  # the drain heard both ranks


def test_free_reliable_trainers_lose_and_repeat_nothing_across_a_5_s_link_outage(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    _, outs = run_with_outage(hosts, tmp_path, [], [[], []])
    records = [lines(out) for out in outs]
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(i for record in records for e, i in record if e == epoch)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, (
            f"epoch {epoch}: {EPOCH - len(ids)} lost, "
            f"{sum(c - 1 for c in ids.values())} repeated")

