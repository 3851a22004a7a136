"""Batches stacked by real server processes: exact epochs, equal steps per rank, resume.

Every server here is a real process (``Server(...).start()``, bound to port 0 on
127.0.0.1) and every trainer a real ``RemoteLoader`` over its sockets; the
ranks of one job run side by side in threads, each joined with a bound.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any

import numpy as np
import pytest

from feedmux import BatchMeta, RemoteLoader, Server, Stream
from tests.integration.conftest import CheckedThread, first_error

pytestmark = pytest.mark.timeout(120)

NUMBERED = "tests.integration.samplers:numbered"
EPOCH = 100  # 4 streams x 25 samples
EPOCHS = 2
BATCH = 16


def started(source: str = NUMBERED, **options: Any) -> Server:
    options = {"factory_kwargs": {"streams": 4, "per_stream": EPOCH // 4}, "epochs": EPOCHS,
               "epoch_size": EPOCH, "bind": "tcp://127.0.0.1:0",
               "control": "tcp://127.0.0.1:0", **options}
    return Server(source, **options).start()


def loader_of(server: Server, **options: Any) -> RemoteLoader:
    return RemoteLoader(server.data_address, control=server.control_address,
                        **{"timeout": 30, **options})


def epochs_of(loader: RemoteLoader, epochs: int = EPOCHS) -> list[list[list[int]]]:
    """Each epoch's batches, as the ids of their samples; the loader closed afterwards."""
    try:
        return [[batch["id"].tolist() for batch in loader.iter_epoch()] for _ in range(epochs)]
    finally:
        loader.close()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_free_trainer_gets_every_sample_once_per_epoch_in_batches(
    servers: list[Server], workers: int, drop_last: bool
) -> None:
    servers.append(server := started(workers=workers))
    loader = loader_of(server, batch_size=BATCH, drop_last=drop_last)
    steps = EPOCH // BATCH if drop_last else math.ceil(EPOCH / BATCH)
    assert len(loader) == steps
    for batches in epochs_of(loader):
        sizes = [len(batch) for batch in batches]
        ids = [i for batch in batches for i in batch]
        if drop_last:
            assert sizes == [BATCH] * steps
            assert len(set(ids)) == len(ids) == steps * BATCH and set(ids) <= set(range(EPOCH))
        else:
            assert sizes == [BATCH] * (steps - 1) + [EPOCH % BATCH]
            assert sorted(ids) == list(range(EPOCH))


def test_nested_samples_arrive_stacked_with_every_number_an_array(servers: list[Server]) -> None:
    servers.append(server := started("tests.integration.samplers:shaped",
                                     factory_kwargs={"streams": 3, "per_stream": 10},
                                     epoch_size=30, epochs=1))
    loader = loader_of(server, batch_size=8, with_meta=True)
    seen = []
    for meta, (fields, listed) in loader.iter_epoch():
        assert isinstance(meta, BatchMeta) and meta.epoch == 1
        ids = fields["id"]
        assert ids.dtype == np.int64 and meta.positions.shape == ids.shape
        assert fields["image"].shape == (len(ids), 2, 3) and fields["image"].dtype == np.uint8
        assert (fields["image"] == ids.astype(np.uint8)[:, None, None]).all()
        assert fields["weight"].dtype == np.float64 and (fields["weight"] == ids / 4).all()
        assert fields["name"] == [f"s{i}" for i in ids]
        assert listed[0].dtype == np.int64 and (listed[0] == ids).all()
        assert listed[1].shape == ids.shape and (listed[1] == ids).all()
        seen += ids.tolist()
    loader.close()
    assert sorted(seen) == list(range(30))


def test_a_stream_counts_batches(servers: list[Server]) -> None:
    servers.append(server := started())
    loader = loader_of(server, batch_size=BATCH)
    stream = Stream(loader)
    sizes = [[len(batch["id"]) for batch in epoch] for epoch in stream.epochs(EPOCHS)]
    loader.close()
    assert sizes == [[BATCH] * 6 + [4]] * EPOCHS
    assert stream.iteration == 2 * 7 and stream.epoch == EPOCHS


def ranked_job(server: Server, world_size: int, **options: Any) -> list[Any]:
    """Every rank's (len, epochs of batches), the ranks run side by side."""
    def rank(index: int) -> tuple[int, list[list[list[int]]]]:
        loader = loader_of(server, rank=index, world_size=world_size, **options)
        return len(loader), epochs_of(loader)

    threads = [CheckedThread(rank, index) for index in range(world_size)]
    return [thread.join(90) for thread in threads]


@pytest.mark.parametrize(("world_size", "uneven", "drop_last", "workers"), [
    (2, "pad", False, 1), (3, "pad", False, 1), (3, "pad", True, 1), (2, "drop", True, 1),
    (3, "drop", False, 2), (2, "pad", True, 2),
])
def test_every_rank_takes_the_same_batches_per_epoch(
    servers: list[Server], world_size: int, uneven: str, drop_last: bool, workers: int
) -> None:
    servers.append(server := started(uneven=uneven, workers=workers))
    results = ranked_job(server, world_size, batch_size=BATCH, drop_last=drop_last)
    share = math.ceil(EPOCH / world_size) if uneven == "pad" else EPOCH // world_size
    steps = share // BATCH if drop_last else math.ceil(share / BATCH)
    for epoch in range(EPOCHS):
        sizes = {tuple(len(batch) for batch in result[1][epoch]) for result in results}
        assert len(sizes) == 1, sizes  # step k has the same size on every rank
        assert [result[0] for result in results] == [steps] * world_size
        assert all(len(result[1][epoch]) == steps for result in results)
        counts = Counter(i for result in results for batch in result[1][epoch] for i in batch)
        if uneven == "pad" and not drop_last:
            assert set(counts) == set(range(EPOCH))  # every sample; the pad repeats a few
            assert sum(counts.values()) == world_size * share
        else:
            assert max(counts.values()) == 1 and set(counts) <= set(range(EPOCH))


def test_ranks_asking_for_different_batches_are_refused_clearly(servers: list[Server]) -> None:
    servers.append(server := started(rank_timeout=5))

    def rank(index: int, batch_size: int) -> str:
        return first_error(loader_of(server, rank=index, world_size=2, batch_size=batch_size,
                                     timeout=30))

    # Whichever rank's hello comes first fixes the job's batches; the other rank is refused,
    # naming both values, and the job's first rank is told why (it would otherwise wait for
    # a rank never coming).
    said = [thread.join(60) for thread in [CheckedThread(rank, 0, 16), CheckedThread(rank, 1, 8)]]
    refused = [text for text in said if re.search(
        r"the ranks of this job are dealt batches of batch_size=(16|8), drop_last=False \(its "
        r"first rank asked for them\): expected the same from rank [01] \(trainer \S+\), got "
        r"batch_size=(8|16), drop_last=False", text)]
    # The refused rank hears why; the other rank's error says which rank was refused, and why.
    assert len(refused) == 2, said
    assert sum("was refused" in text for text in said) == 1, said


def test_a_ranked_job_resumes_mid_epoch_at_the_next_batch(servers: list[Server]) -> None:
    world_size, taken = 2, 2  # each rank checkpoints after 2 batches of epoch 1
    options = {"seed": 3}
    servers.append(server := started(**options))
    whole = ranked_job(server, world_size, batch_size=8)

    servers.append(server := started(**options))

    def first_part(index: int) -> tuple[list[list[int]], dict[str, Any]]:
        loader = loader_of(server, rank=index, world_size=world_size, batch_size=8)
        stream = Stream(loader)
        try:
            batches = [batch["id"].tolist() for batch in stream.data(taken)]
            return batches, stream.state_dict()
        finally:
            loader.close()

    parts = [thread.join(90) for thread in
             [CheckedThread(first_part, index) for index in range(world_size)]]
    server.stop()
    servers.append(server := started(**options))  # the job and its server restart

    def rest(index: int) -> list[list[int]]:
        loader = loader_of(server, rank=index, world_size=world_size, batch_size=8)
        stream = Stream(loader)
        stream.load_state_dict(parts[index][1])
        assert stream.iteration == taken
        try:
            return [batch["id"].tolist() for epoch in range(EPOCHS)
                    for batch in loader.iter_epoch()]
        finally:
            loader.close()

    resumed = [thread.join(90) for thread in
               [CheckedThread(rest, index) for index in range(world_size)]]
    for index in range(world_size):
        uninterrupted = [batch for epoch in whole[index][1] for batch in epoch]
        assert parts[index][0] + resumed[index] == uninterrupted


def test_an_audit_log_records_the_batches_samples_by_key(servers: list[Server],
                                                         tmp_path: Any) -> None:
    servers.append(server := started(epochs=1))
    path = tmp_path / "audit.log"
    loader = loader_of(server, batch_size=BATCH, audit_log=str(path), audit_key="id")
    handed = [i for batch in epochs_of(loader, 1)[0] for i in batch]
    recorded = [key for line in path.read_text().splitlines() if line.startswith("H ")
                for key in json.loads(line.split(" ")[5])]
    assert recorded == handed and sorted(handed) == list(range(EPOCH))
