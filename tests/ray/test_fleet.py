"""SamplerFleet on a real two-node Ray cluster: placement, exact epochs, stats, shutdown."""

from __future__ import annotations

import pickle
from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest
import ray

from feedmux import RemoteLoader
from feedmux.errors import ConfigurationError
from feedmux.ray import SamplerFleet
from tests.integration.conftest import wait_until
from tests.ray.conftest import exhaustive_source, read_all

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

STREAMERS, ITEMS, EPOCHS = 4, 5, 3


def by_server_epoch(seen: list[tuple[str, int, int, int]]) -> dict[tuple[str, int], list[int]]:
    grouped: dict[tuple[str, int], list[int]] = defaultdict(list)
    for server_id, epoch, _, value in seen:
        grouped[(server_id, epoch)].append(value)
    return grouped


def test_two_servers_two_ranked_trainers_three_exact_epochs(cluster: object) -> None:
    with SamplerFleet(exhaustive_source(STREAMERS, ITEMS), num_servers=2, workers_per_server=2,
                      epochs=EPOCHS, num_cpus=0.5, hwm=4) as fleet:
        addresses = fleet.addresses
        hosts = {address.split("//")[1].rsplit(":", 1)[0] for address in addresses}
        assert hosts == {"127.0.0.2", "127.0.0.3"}, addresses  # SPREAD: one per node
        loaders = [fleet.loader(rank=rank, world_size=2, with_meta=True, timeout=60)
                   for rank in range(2)]
        ranks = ray.get([read_all.remote(loader) for loader in loaders], timeout=180)
        # The servers end on their own after the last epoch; asked after that (or while
        # they end), each still reports its figures: the ones it had as it stopped.
        wait_until(lambda: all(s["exit_code"] is not None for s in fleet.stats()), 60,
                   "both fleet servers to end after their last epoch")
        stats = fleet.stats()
    # Every rank takes the same number of steps (DDP would not hang) ...
    assert len(ranks[0]) == len(ranks[1]) == EPOCHS * STREAMERS * ITEMS // 2
    # ... and each server's epochs, over both ranks, hold its shard once, disjoint shards.
    grouped = by_server_epoch(ranks[0] + ranks[1])
    server_ids = {server_id for server_id, _ in grouped}
    assert len(server_ids) == 2 and {s["server_id"] for s in stats} == server_ids
    for epoch in range(1, EPOCHS + 1):
        values = [v for sid in server_ids for v in grouped[(sid, epoch)]]
        assert sorted(values) == list(range(STREAMERS * ITEMS)), f"fleet epoch {epoch}"
    assert [s["index"] for s in stats] == [0, 1]
    assert all(s["workers"] == 2 and s["starts"] == 1 for s in stats)
    assert all(s["epochs_completed"] == EPOCHS for s in stats)


def test_loader_pickles_unconnected_and_follows_the_fleet(cluster: object) -> None:
    fleet = SamplerFleet(exhaustive_source(2, 3), num_servers=2, epochs=1, num_cpus=0.25)
    try:
        loader = fleet.loader(world_size=1)
        copy = pickle.loads(pickle.dumps(loader))
        assert isinstance(copy, RemoteLoader) and copy.addresses == fleet.addresses
        assert copy.client_id != loader.client_id  # each process is its own trainer
        assert loader._book is not None and loader._book.resolve() == fleet.endpoints
        with pytest.raises(TypeError, match="stays in its driver"):
            pickle.dumps(fleet)
        values = sorted(int(value) for value in copy)
        assert values == list(range(6))
        copy.close()
    finally:
        fleet.shutdown()
    fleet.shutdown()  # idempotent
    assert not [actor for actor in ray.util.list_named_actors() if "feedmux" in actor]


def test_shutdown_leaves_no_server_actor(cluster: object) -> None:
    fleet = SamplerFleet(exhaustive_source(2, 3), num_servers=2, num_cpus=0.25)
    servers = fleet.servers
    assert sum(Counter(s["exit_code"] for s in fleet.stats()).values()) == 2
    fleet.shutdown()
    for server in servers:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(server.endpoints.remote(), timeout=30)


def test_reliable_warns_once_in_the_driver() -> None:
    # No cluster: the options are checked before Ray is asked for anything. reliable= went
    # to every server actor, each of which warned in its own process, never in the driver.
    with pytest.warns(DeprecationWarning, match=r"does nothing.*exactly once by default") as (
            caught), pytest.raises(ConfigurationError, match="num_servers"):
        SamplerFleet(exhaustive_source(STREAMERS, ITEMS), num_servers=0, reliable=True)
    assert [warning.filename for warning in caught] == [__file__]
    # A fleet's loader: warned at its caller (from inside feedmux.ray, the default filters
    # hid it), once.
    fleet = SimpleNamespace(endpoints=[("tcp://127.0.0.1:9", "tcp://127.0.0.1:10")],
                            registry_name="feedmux-fleet-none", namespace="none")
    with pytest.warns(DeprecationWarning, match=r"does nothing.*exactly once by default") as (
            caught):
        SamplerFleet.loader(fleet, reliable=False).close()  # type: ignore[arg-type]
    assert [warning.filename for warning in caught] == [__file__]
