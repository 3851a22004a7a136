"""A map-style dataset served as it is: ``feedmux serve MODULE:ATTR`` on a torch ``Dataset``,
a list, a numpy array, real server processes and real torch.

The oracle of the order is :func:`feedmux.from_dataset` run here with the run's
seed: a served epoch is that permutation, whatever the number of workers; the
oracle of who loads what is the dataset's own log of every ``__getitem__``
(pid, shard, epoch, index) checked against the stripes of the permutation.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import feedmux  # noqa: E402
from feedmux.client.remote import RemoteLoader  # noqa: E402
from feedmux.sampling.datasets import DatasetStreamer  # noqa: E402
from feedmux.torch import RemoteDataset  # noqa: E402
from tests.integration.conftest import CheckedThread, Endpoints, Spawned  # noqa: E402
from tests.integration.dataset_samplers import LETTERS, ROWS, SIZE  # noqa: E402
from tests.integration.test_resume import Job, until_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(180)

MODULE = "tests.integration.dataset_samplers"
TORCH_MODULE = "tests.integration.torch_datasets"
SEED = 11
EPOCHS = 3
Record = tuple[int, int, int]  # (epoch, position, label)


#: Seconds a server that imports torch may take to bind (12 s measured for the import alone
#: with the machine's load at 14 on 2 cores).
TORCH_START_TIMEOUT = 120.0


@pytest.fixture
def serve_torch(spawn: Callable[..., Spawned]) -> Callable[..., Spawned]:
    """``feedmux serve`` of a torch dataset on port 0, waited for as long as torch imports."""

    def start(source: str, *args: str) -> Spawned:
        server = spawn("serve", source, *Endpoints.any_port().args(), *args)
        server.endpoints(timeout=TORCH_START_TIMEOUT)
        return server

    return start


def fetch(server: Spawned, **options: Any) -> list[Record]:
    """Every sample of the stream as (epoch, position, label); each tensor checked."""
    records = []
    with RemoteLoader(server.data, control=server.control, timeout=30, with_meta=True,
                      **options) as loader:
        for meta, (values, label) in loader:
            assert isinstance(values, np.ndarray) and values.dtype == np.float32
            assert values.tolist() == [float(label)] * 8, (label, values)
            records.append((meta.epoch, meta.position, int(label)))
    return records


def epochs_of(records: list[Record]) -> dict[int, list[int]]:
    """The labels of each epoch in position order."""
    ordered: dict[int, list[int]] = {}
    for epoch, _, label in sorted(records):
        ordered.setdefault(epoch, []).append(label)
    return ordered


def layout(stderr: str) -> tuple[int, int]:
    """(shards, samples per shard per turn) from the server's log."""
    match = re.search(r"(\d+) shard\(s\) \(.*?\), (\d+) samples per shard per turn", stderr)
    assert match is not None, stderr
    return int(match[1]), int(match[2])


def loads(log: Path) -> list[tuple[int, int, int, int]]:
    """Every ``__getitem__`` the dataset saw: (pid, shard, epoch, index)."""
    return [tuple(int(field) for field in line.split())  # type: ignore[misc]
            for line in log.read_text().splitlines()]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_torch_dataset_gives_seeded_permutations_each_loaded_by_its_own_worker(
        serve_torch: Callable[..., Spawned], tmp_path: Path, workers: int) -> None:
    log = tmp_path / "loads"
    server = serve_torch(f"{TORCH_MODULE}:TensorDataset", "--arg", f"log={log}",
                         "--seed", str(SEED), "--epochs", str(EPOCHS), "--workers", str(workers))
    records = fetch(server)
    assert server.wait(timeout=30) == 0
    by_epoch = epochs_of(records)
    oracle = DatasetStreamer(list(range(SIZE)), random_state=SEED)
    assert sorted(by_epoch) == list(range(1, EPOCHS + 1))
    for epoch, labels in by_epoch.items():
        assert sorted(position for e, position, _ in records if e == epoch) == list(range(SIZE))
        assert sorted(labels) == list(range(SIZE)), f"epoch {epoch}: not every index once"
        # The permutation of the run's seed and the epoch: the same with any worker count.
        assert labels == oracle.epoch_indices(epoch).tolist(), f"epoch {epoch}"
    assert len({tuple(labels) for labels in by_epoch.values()}) == EPOCHS, "epochs repeat"
    # Who loaded what: each index once per epoch, by the worker that runs its shard, and
    # a shard loads only the indices of its stripe of the epoch's permutation.
    shards, block = layout(server.stderr)
    stripes = oracle.stripes(shards, block)
    seen = loads(log)
    assert Counter((epoch, index) for _, _, epoch, index in seen) == Counter(
        {(epoch, index): 1 for epoch in by_epoch for index in range(SIZE)})
    for shard, stripe in enumerate(stripes):
        for epoch in by_epoch:
            loaded = [index for _, part, e, index in seen if part == shard and e == epoch]
            assert loaded == stripe.epoch_indices(epoch).tolist(), (shard, epoch)
    owners: dict[int, set[int]] = {}
    for pid, shard, _, _ in seen:
        owners.setdefault(shard, set()).add(pid)
    assert all(len(pids) == 1 for pids in owners.values()), "a shard moved between workers"
    pids = {pid for pid, _, _, _ in seen}
    if workers == 1:
        assert pids == {server.process.pid}
    else:  # the server's own process loads nothing; the two workers share the shards
        assert len(pids) == 2 and server.process.pid not in pids


def test_no_shuffle_serves_the_indices_in_order_with_workers_and_no_seed(
        serve_torch: Callable[..., Spawned]) -> None:
    server = serve_torch(f"{TORCH_MODULE}:TensorDataset", "--no-shuffle", "--workers", "2",
                         "--epochs", "2", "--samples-per-message", "3")
    records = fetch(server)
    assert server.wait(timeout=30) == 0
    assert epochs_of(records) == {1: list(range(SIZE)), 2: list(range(SIZE))}
    assert "epoch size 100" in server.stderr  # known from len(), before the first epoch


def test_two_ranks_get_disjoint_halves_of_equal_size(
        serve_torch: Callable[..., Spawned]) -> None:
    server = serve_torch(f"{TORCH_MODULE}:TensorDataset", "--seed", str(SEED),
                         "--workers", "2", "--epochs", "2", "--min-trainers", "2")
    ranks = [CheckedThread(functools.partial(fetch, server, rank=rank, world_size=2))
             for rank in range(2)]
    shares = [rank.join(120) for rank in ranks]
    assert server.wait(timeout=30) == 0
    for epoch in (1, 2):
        halves = [[label for e, _, label in share if e == epoch] for share in shares]
        assert [len(half) for half in halves] == [SIZE // 2] * 2
        assert not set(halves[0]) & set(halves[1])
        assert sorted(halves[0] + halves[1]) == list(range(SIZE))


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    started = Job(tmp_path)
    yield started
    started.close()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_resumed_ranked_job_continues_exactly_from_its_state_dict(
        serve: Callable[..., Spawned], job: Job, tmp_path: Path, workers: str) -> None:
    # 240 dict samples of 64 KiB: the stream cannot sit whole in the socket buffers.
    command = (f"{MODULE}:NumberedRows", "--arg", "size=240", "--arg", "width=16384",
               "--seed", str(SEED), "--epochs", "3", "--workers", workers,
               "--samples-per-message", "8")
    uninterrupted = job.run(serve(*command), "whole", 2)
    server = serve(*command)
    crashed = job.crash(server, "crashed", 2)
    server.kill()
    server = serve(*command)
    resumed = job.run(server, "resumed", 2, "--resume", str(tmp_path / "state{rank}.json"))
    for rank in range(2):
        assert until_checkpoint(crashed[rank]) + resumed[rank] == uninterrupted[rank], rank
    assert server.wait(timeout=30) == 0


def test_a_list_an_array_and_a_factory_of_one_are_served(
        serve: Callable[..., Spawned]) -> None:
    def samples(server: Spawned) -> list[Any]:
        with RemoteLoader(server.data, control=server.control, timeout=30) as loader:
            items = list(loader)
        assert server.wait(timeout=30) == 0
        return items

    letters = samples(serve(f"{MODULE}:LETTERS", "--no-shuffle", "--epochs", "1"))
    assert letters == LETTERS
    rows = samples(serve(f"{MODULE}:ROWS", "--seed", "3", "--epochs", "1", "--workers", "2"))
    assert sorted(int(row[0]) for row in rows) == list(range(SIZE))
    assert all(row.tolist() == [row[0]] * 3 for row in rows)
    assert [int(row[0]) for row in rows] == feedmux.from_dataset(ROWS, random_state=3) \
        .epoch_indices(1).tolist()
    made = samples(serve(f"{MODULE}:make_rows", "--arg", "size=7", "--no-shuffle",
                         "--epochs", "1"))
    assert [row.tolist() for row in made] == ROWS[:7].tolist()


def test_dict_samples_come_back_as_tensors_through_remote_dataset(
        serve_torch: Callable[..., Spawned]) -> None:
    server = serve_torch(f"{TORCH_MODULE}:DictDataset", "--no-shuffle", "--epochs", "1")
    dataset = RemoteDataset(server.data, control=server.control, timeout=30)
    batches = list(DataLoader(dataset, batch_size=10))
    assert server.wait(timeout=30) == 0
    assert len(batches) == SIZE // 10
    first = batches[0]
    assert isinstance(first["x"], torch.Tensor) and first["x"].shape == (10, 4)
    assert first["id"].tolist() == list(range(10))
    assert first["x"][:, 0].tolist() == [float(index) for index in range(10)]
    assert first["name"] == [f"item{index}" for index in range(10)]


def test_no_shuffle_is_refused_for_a_mux(spawn: Callable[..., Spawned]) -> None:
    server = spawn("serve", "tests.integration.samplers:numbered", "--no-shuffle",
                   "--bind", "tcp://127.0.0.1:0", "--control", "tcp://127.0.0.1:0")
    assert server.wait(timeout=30) == 2
    assert "--no-shuffle (shuffle=False) keeps the order of a map-style dataset" in server.stderr
