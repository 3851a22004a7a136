"""A fleet server killed mid-epoch: Ray restarts it, the trainers follow it, the epoch stays exact.

The restarted server comes up elsewhere under a new server id; the ranked
trainers find its new endpoints (``resolve``), drop what the old process sent
that they had not handed out, and say where each one stands; the new process
resumes its shard there (docs/resume.md). What is asserted: each rank's
positions of the interrupted epoch go on across the restart with no gap and no
repeat, each server epoch gives every rank the same steps, each fleet epoch
holds every value once, and the trainers were not restarted.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import ray

from feedmux.ray import SamplerFleet
from tests.integration.conftest import wait_until
from tests.ray.conftest import exhaustive_source, read_all

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

STREAMERS, ITEMS, EPOCHS = 4, 100, 2
SHARD = STREAMERS * ITEMS // 2  # each server's epoch size
PAYLOAD = 1 << 16  # bytes a sample: the sockets fill and the server waits for its trainers


def test_killed_server_restarts_and_trainers_follow_it(cluster: object) -> None:
    source = exhaustive_source(STREAMERS, ITEMS, payload_bytes=PAYLOAD)
    with SamplerFleet(source, num_servers=2, epochs=EPOCHS,
                      num_cpus=0.5, max_restarts=2, hwm=2, samples_per_message=4) as fleet:
        before = fleet.endpoints
        loaders = [fleet.loader(rank=rank, world_size=2, with_meta=True, timeout=90)
                   for rank in range(2)]
        # 5 ms of "training" per sample: the kill lands inside server 0's first epoch.
        trainers = [read_all.remote(loader, 0.005) for loader in loaders]

        def started_its_first_epoch() -> bool:
            stats = fleet.stats()[0]
            return stats["samples_sent"] >= 40 and stats["epochs_completed"] == 0

        wait_until(started_its_first_epoch, 60, "server 0 half-way into its first epoch")
        old_id = fleet.stats()[0]["server_id"]
        ray.kill(fleet.servers[0], no_restart=False)
        wait_until(lambda: fleet.starts() == [2, 1], 60, "Ray to restart server 0")
        ranks = ray.get(trainers, timeout=240)
        after = fleet.endpoints
        stats = fleet.stats()
    assert after[1] == before[1] and after[0] != before[0]  # server 0 listens elsewhere now
    new_id, other_id = stats[0]["server_id"], stats[1]["server_id"]
    assert len({old_id, new_id, other_id}) == 3
    positions: dict[tuple[str, int, int], list[int]] = defaultdict(list)  # (server, epoch, rank)
    values: dict[tuple[str, int], list[int]] = defaultdict(list)  # (server, epoch)
    for rank, seen in enumerate(ranks):
        for server_id, epoch, position, value in seen:
            server = "0" if server_id in (old_id, new_id) else "1"
            positions[(server, epoch, rank)].append(position)
            values[(server, epoch)].append(value)
    assert positions[("0", 1, 0)] and [key for key in positions if key[0] == "0"], "no data"
    for (server, epoch, rank), taken in positions.items():
        # Across the restart too: this rank's share of the epoch, in order, once each.
        assert taken == list(range(rank, SHARD, 2)), (server, epoch, rank)
    assert sorted(positions) == [(server, epoch, rank) for server in "01"
                                 for epoch in range(1, EPOCHS + 1) for rank in range(2)]
    for epoch in range(1, EPOCHS + 1):
        fleet_epoch = values[("0", epoch)] + values[("1", epoch)]
        assert sorted(fleet_epoch) == list(range(STREAMERS * ITEMS)), f"fleet epoch {epoch}"
    interrupted = [row for seen in ranks for row in seen if row[0] == old_id]
    assert 0 < len(interrupted) < SHARD, "the kill did not land inside server 0's first epoch"
