"""``--workers N`` with the shared-memory pool: real server, worker and trainer processes.

The workers write each large array into their region of the pool and forward
references; a trainer on this host gets views of the pool. A killed worker's runs
come back to the pool (a killed trainer's, and a trainer that does not map the pool:
``test_shm.py``, run with 2 workers too).
"""

from __future__ import annotations

import os
import signal

import pytest

from feedmux import RemoteLoader, Server, fetch_stats
from feedmux.errors import RemoteError
from tests.integration.conftest import child_pids
from tests.integration.test_shm import in_pool

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
SAMPLER = "tests.integration.samplers:large"  # 1 MiB samples whose values are their id


def test_two_workers_write_into_the_pool_and_the_trainer_gets_views_for_two_epochs() -> None:
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", epochs=2, samples_per_message=1,
                    shm_size=64 * MIB, workers=2).start()
    try:
        seen: list[tuple[int, int]] = []
        copied_at: dict[str, int] = {}
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=30) as loader:
            for sample in loader:
                assert (sample["x"] == sample["id"]).all(), "a sample's content is not its id's"
                assert in_pool(sample["x"]), "a large array that is not a view of the pool"
                seen.append((int(loader.last_epoch or 0), int(sample["id"])))
                if len(seen) in (41, 80):  # the first and last samples of epoch 2
                    stats = fetch_stats(server.control_address)
                    copied_at["start" if len(seen) == 41 else "end"] = stats["shm_bytes_copied"]
                del sample
        for epoch in (1, 2):
            assert sorted(i for e, i in seen if e == epoch) == list(range(40))
        # Epoch 2 was drawn with the trainer mapping the pool: the workers wrote every
        # array into it, so the server copied none (before the trainer's attach, drawn
        # arrays went whole and the server copied them in).
        assert copied_at["end"] == copied_at["start"]
        assert server.join(30) == 0
    finally:
        server.stop()


def test_a_sigkilled_worker_fails_the_run_and_its_runs_come_back() -> None:
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", samples_per_message=1,
                    shm_size=64 * MIB, workers=2, factory_kwargs={"count": 100_000}).start()
    try:
        assert server.pid is not None
        held = []
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=30) as loader:
            with pytest.raises(RemoteError, match=r"sampling worker .* exited unexpectedly"):
                for sample in loader:
                    assert (sample["x"] == sample["id"]).all()
                    if len(held) < 3:
                        held.append(sample["x"])
                    if len(held) == 3 and in_pool(held[0]) and sample["id"] == 10:
                        os.kill(child_pids(server.pid)[0], signal.SIGKILL)
                    del sample
            # The server stopped its other worker and took back every run no trainer holds:
            # what is in use is what this trainer's live views hold (the 3 kept here and
            # those the loader decoded ahead), to the byte.
            stats = fetch_stats(server.control_address)
            views, view_bytes, _ = loader._data.views_held()
            assert views >= 3 and stats["shm_bytes_in_use"] == view_bytes
            assert all((array == array[0]).all() for array in held)
        server.join(30)
    finally:
        server.stop()
