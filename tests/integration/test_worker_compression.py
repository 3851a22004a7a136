"""``--workers 2 --compress``: the sampling workers compress, the server sends their frames on.

Real server, worker and trainer processes on this host. A trainer that does not map the
shared-memory pool (``shm=False``: a socket link, as a trainer on another host) gets the
workers' compressed messages as they are, exact epochs with their contents intact, and
the server compresses none itself; a trainer that maps the pool, ``auto`` with such a
trainer, and ranks (whose shares the server cuts) get raw messages, the workers
compressing none or the server inflating what they did.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from feedmux import RemoteLoader, Server, fetch_stats
from tests.integration.conftest import CheckedThread
from tests.integration.test_shm import in_pool

pytestmark = pytest.mark.timeout(120)

SAMPLER = "tests.integration.samplers:numbered"  # 32 KiB of one value: compresses ~1000x
EPOCH, EPOCHS, PER_MESSAGE = 64, 2, 16  # a 512 KiB array frame: the pool takes it
SHAPE = {"streams": 4, "per_stream": EPOCH // 4, "width": 8192}


def serve(compress: str, **options: Any) -> Server:
    return Server(SAMPLER, bind="tcp://127.0.0.1:0", epochs=EPOCHS, seed=3, workers=2,
                  samples_per_message=PER_MESSAGE, compress=compress,
                  shm_size=64 << 20, factory_kwargs=SHAPE, **options).start()


def consume(server: Server, **options: Any) -> tuple[list[tuple[int, int]], dict[str, Any]]:
    """Every sample's (epoch, id), its contents checked, and the server's statistics after."""
    seen: list[tuple[int, int]] = []
    with RemoteLoader(server.data_address, control=server.control_address, timeout=30,
                      **options) as loader:
        for sample in loader:
            assert sample["x"].shape == (SHAPE["width"],)
            assert (sample["x"] == sample["id"]).all(), "a sample's content is not its id's"
            seen.append((int(loader.last_epoch or 0), int(sample["id"])))
            del sample
        stats = fetch_stats(server.control_address)
    return seen, stats


def assert_exact(seen: list[tuple[int, int]]) -> None:
    assert len(seen) == EPOCH * EPOCHS
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(sample_id for e, sample_id in seen if e == epoch)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, epoch


def test_the_workers_compress_and_the_server_sends_their_frames_on() -> None:
    server = serve("lz4")
    try:
        seen, stats = consume(server, shm=False)
        assert_exact(seen)
        messages = EPOCH * EPOCHS // PER_MESSAGE
        assert stats["compressed_by_workers"] == messages, stats
        assert stats["compressed_by_server"] == 0 and stats["inflated_by_server"] == 0, stats
        assert server.join(30) == 0
    finally:
        server.stop()


def test_a_trainer_that_maps_the_pool_gets_raw_views_with_a_fixed_codec() -> None:
    server = serve("lz4")
    try:
        pooled: list[bool] = []
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=30) as loader:
            seen = []
            for sample in loader:
                assert (sample["x"] == sample["id"]).all()
                epoch = int(loader.last_epoch or 0)
                seen.append((epoch, int(sample["id"])))
                if epoch == EPOCHS:
                    pooled.append(in_pool(sample["x"]))
                del sample
            stats = fetch_stats(server.control_address)
        assert_exact(seen)
        # Drawn once the trainer mapped the pool: references, not compressed frames.
        assert pooled and all(pooled)
        # What the workers compressed before the trainer mapped the pool (its first
        # messages, if any) went to it compressed: a socket link under a fixed codec.
        assert stats["compressed_by_server"] == 0, stats
        assert server.join(30) == 0
    finally:
        server.stop()


def test_auto_with_a_trainer_that_maps_the_pool_asks_the_workers_for_no_compression() -> None:
    server = serve("auto")
    try:
        seen, stats = consume(server)
        assert_exact(seen)
        assert stats["compressed_by_workers"] == 0 and stats["compressed_by_server"] == 0
        assert server.join(30) == 0
    finally:
        server.stop()


def test_ranks_get_exact_shares_and_the_workers_compress_nothing_for_them() -> None:
    # The server cuts each rank's share out of the workers' messages: no codec for them.
    server = serve("lz4")
    seen: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    stats: dict[int, dict[str, Any]] = {}

    def rank(index: int) -> None:
        seen[index], stats[index] = consume(server, shm=False, rank=index, world_size=2)

    try:
        threads = [CheckedThread(rank, index) for index in (0, 1)]
        for thread in threads:
            thread.join(90)
        assert_exact(seen[0] + seen[1])
        assert all(stat["compressed_by_workers"] == 0 for stat in stats.values()), stats
        assert server.join(30) == 0
    finally:
        server.stop()


def test_the_compressed_stream_is_the_raw_one_sample_for_sample() -> None:
    # The same seeded run with the workers compressing and without: the same order.
    orders = []
    for compress in ("lz4", "off"):
        server = serve(compress)
        try:
            seen, _ = consume(server, shm=False)
            orders.append(seen)
            assert server.join(30) == 0
        finally:
            server.stop()
    assert orders[0] == orders[1]
    assert np.array(orders[0]).shape == (EPOCH * EPOCHS, 2)
