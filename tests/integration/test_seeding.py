"""Seeded servers are deterministic: the same (epoch, position, sample) run after run."""

from __future__ import annotations

import re
from typing import Any

import pytest

from feedmux.client.remote import RemoteLoader
from tests.integration.conftest import CheckedThread

pytestmark = pytest.mark.timeout(90)

SOURCE = "tests.integration.samplers:augmented"
EPOCHS = 2
IDS = 120  # 4 streams of 30

Record = tuple[int, int, int, float, float, int, int, str]


def run(serve: Any, *args: str) -> tuple[list[Record], str]:
    """Serve ``EPOCHS`` epochs to one trainer; every sample by (epoch, position), and stderr."""
    server = serve(SOURCE, "--epochs", str(EPOCHS), *args)
    records: list[Record] = []
    with RemoteLoader(server.data, control=server.control, timeout=30,
                      with_meta=True) as loader:
        for meta, sample in loader:
            records.append((meta.epoch, meta.position, int(sample["id"]),
                            float(sample["noise"]), float(sample["py"]), int(sample["worker"]),
                            int(sample["epoch"]), sample["seed"]))
    assert server.wait(timeout=30) == 0
    records.sort()
    for epoch in range(1, EPOCHS + 1):
        in_epoch = [record for record in records if record[0] == epoch]
        assert [record[1] for record in in_epoch] == list(range(IDS)), "positions not 0..n-1"
        assert sorted(record[2] for record in in_epoch) == list(range(IDS)), "ids not once each"
        assert {record[6] for record in in_epoch} == {epoch}, "worker_info().epoch is off"
    return records, server.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_seeded_run_is_the_same_sequence_every_time(serve: Any, workers: int) -> None:
    args = ("--seed", "5", "--workers", str(workers))
    first, _ = run(serve, *args)
    second, _ = run(serve, *args)
    assert first == second
    # worker_info().id is the shard (4 streams, 2 active: 2 shards), whoever draws it.
    assert {record[5] for record in first} == set(range(2))
    assert {record[7] for record in first} == {"5"}
    orders = [[record[2] for record in first if record[0] == epoch] for epoch in (1, 2)]
    assert orders[0] != orders[1], "every epoch should have its own order"


def test_augmentations_differ_across_workers_and_epochs_and_repeat_across_runs(
        serve: Any) -> None:
    first, _ = run(serve, "--seed", "9", "--workers", "2")
    second, _ = run(serve, "--seed", "9", "--workers", "2")
    draws = {(record[0], record[2]): (record[3], record[4]) for record in first}
    assert draws == {(record[0], record[2]): (record[3], record[4]) for record in second}
    by_worker: dict[int, set[float]] = {0: set(), 1: set()}
    by_epoch: dict[int, set[float]] = {1: set(), 2: set()}
    for record in first:
        by_worker[record[5]].add(record[3])
        by_epoch[record[0]].add(record[3])
    # Forked workers inherit one numpy state: without reseeding they draw the same values.
    assert by_worker[0] and by_worker[1] and not by_worker[0] & by_worker[1]
    assert not by_epoch[1] & by_epoch[2]
    third, _ = run(serve, "--seed", "10", "--workers", "2")
    assert not {record[3] for record in first} & {record[3] for record in third}


def by_sample(records: list[Record]) -> dict[tuple[int, int], Record]:
    """Each (epoch, id)'s record without its position (arrival order decides that)."""
    return {(record[0], record[2]): record[:1] + record[2:] for record in records}


def test_an_unseeded_run_draws_fresh_entropy_and_logs_it_for_a_repeat(serve: Any) -> None:
    unseeded = ("--arg", "seed=null", "--workers", "2")
    first, log = run(serve, *unseeded)
    second, _ = run(serve, *unseeded)
    assert by_sample(first) != by_sample(second)
    match = re.search(r"seed (\d+) \(fresh entropy\); workers merged in arrival order", log)
    assert match is not None, log
    # The logged seed repeats every worker's samples and draws; --seed also fixes the order.
    repeat, log = run(serve, *unseeded, "--seed", match[1])
    assert by_sample(repeat) == by_sample(first)
    assert f"seed {match[1]} (seed option); workers merged in a fixed order" in log


def test_an_unseeded_run_with_two_workers_has_every_sample_once_per_epoch(serve: Any) -> None:
    server = serve(SOURCE, "--arg", "seed=null", "--workers", "2", "--epochs", "3",
                   "--samples-per-message", "3")
    seen: dict[int, list[tuple[int, int]]] = {1: [], 2: [], 3: []}
    with RemoteLoader(server.data, control=server.control, timeout=30,
                      with_meta=True) as loader:
        for meta, sample in loader:
            seen[meta.epoch].append((meta.position, int(sample["id"])))
    assert server.wait(timeout=30) == 0
    assert "workers merged in arrival order" in server.stderr
    for epoch, pairs in seen.items():
        assert sorted(position for position, _ in pairs) == list(range(IDS)), epoch
        assert sorted(sample for _, sample in pairs) == list(range(IDS)), epoch


RankRecord = tuple[int, int, int, float]


def run_ranked(serve: Any, *args: str) -> list[list[RankRecord]]:
    """Serve ``EPOCHS`` epochs to ranks 0 and 1 of one job; each rank's samples as it got them."""
    server = serve(SOURCE, "--epochs", str(EPOCHS), *args)

    def rank_records(rank: int) -> list[RankRecord]:
        with RemoteLoader(server.data, control=server.control, timeout=30, rank=rank,
                          world_size=2, with_meta=True) as loader:
            return [(meta.epoch, meta.position, int(sample["id"]), float(sample["noise"]))
                    for meta, sample in loader]

    ranks = [CheckedThread(rank_records, rank) for rank in range(2)]
    records: list[list[RankRecord]] = [rank.join(60) for rank in ranks]
    assert server.wait(timeout=30) == 0
    for rank, got in enumerate(records):
        assert {position % 2 for _, position, _, _ in got} == {rank}, "dealt by p % n"
    for epoch in range(1, EPOCHS + 1):
        ids = sorted(record[2] for got in records for record in got if record[0] == epoch)
        assert ids == list(range(IDS)), "ids not once each across the ranks"
    return records


def test_a_seeded_ranked_run_with_two_workers_gives_each_rank_the_same_sequence(
        serve: Any) -> None:
    args = ("--seed", "5", "--workers", "2")
    first = run_ranked(serve, *args)
    second = run_ranked(serve, *args)
    assert first[0] == second[0]
    assert first[1] == second[1]
