"""A trainer that waits for data is told why, on its own side, against real servers."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedmux import RemoteLoader, Server, fetch_stats
from feedmux.errors import TransportTimeoutError


@pytest.fixture
def pool_of_4_mib() -> Iterator[Server]:
    server = Server("tests.integration.contact_samplers:blocks", bind="tcp://127.0.0.1:0",
                    shm_size=4 << 20)
    yield server.start()
    server.stop()


def test_a_rank_whose_views_fill_the_pool_is_told(
        pool_of_4_mib: Server, caplog: pytest.LogCaptureFixture) -> None:
    # A ranked job's path waits for room in the pool (its replay lane holds the runs), so a
    # rank that keeps every view stalls; it is told why on its own side.
    caplog.set_level(logging.WARNING, logger="feedmux.client")
    kept: list[Any] = []
    # Before: only "no data ... for 6 s"; the cause was in the server's log alone.
    with RemoteLoader(pool_of_4_mib.data_address, control=pool_of_4_mib.control_address,
                      rank=0, world_size=1, timeout=6) as loader, \
            pytest.raises(TransportTimeoutError) as caught:
        for sample in loader:
            kept.append(sample)  # every 512 KiB view kept: the pool fills
    said = "view(s) of the server's shared memory (4 MiB of its 4 MiB pool)"
    assert said in str(caught.value)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(said in message and "np.array(x)" in message for message in warnings)


def test_a_free_trainer_whose_views_fill_the_pool_gets_the_rest_over_the_socket(
        pool_of_4_mib: Server) -> None:
    # The free trainers' path (the group default) never waits for room: a message that finds
    # the pool full goes over the socket, so a trainer that keeps every view still gets the
    # whole epoch, each sample once.
    kept: list[Any] = []
    stats: dict[str, Any] = {}
    with RemoteLoader(pool_of_4_mib.data_address, control=pool_of_4_mib.control_address,
                      timeout=30) as loader:
        for sample in loader:
            kept.append(sample)  # every view kept: after 8 the pool is full
            if len(kept) == 500:
                stats = fetch_stats(pool_of_4_mib.control_address)
            if len(kept) == 1000:  # the first epoch (the server cycles the stream)
                break
    assert sorted(int(sample["id"]) for sample in kept) == list(range(1000))
    assert stats["shm_stalls"] >= 400, stats


def test_a_timeout_names_the_given_address_and_the_derived_control(tmp_path: Path) -> None:
    nowhere = f"ipc://{tmp_path}/nobody"
    with RemoteLoader(nowhere, timeout=1) as loader, pytest.raises(TransportTimeoutError) as caught:
        next(loader)
    assert str(caught.value).startswith(
        f"no data from {nowhere} for 1 s (control {nowhere}.control (derived from the data "
        "endpoint) never answered)")


@pytest.mark.timeout(60)
def test_a_loader_that_hears_nothing_warns_with_default_logging(tmp_path: Path) -> None:
    # A trainer script that sets up no logging: Python's last-resort handler shows WARNING
    # and above. Before: the loader said why it waited at INFO, so such a script showed
    # nothing for as long as it waited.
    data, control = f"ipc://{tmp_path}/nobody", f"ipc://{tmp_path}/nobody-control"
    script = ("import sys\n"
              "from feedmux import RemoteLoader\n"
              "from feedmux.errors import TransportTimeoutError\n"
              f"loader = RemoteLoader({data!r}, control={control!r}, timeout=11)\n"
              "try:\n"
              "    next(loader)\n"
              "except TransportTimeoutError:\n"
              "    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=50, check=False)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("no answer from")]
    assert lines == [f"no answer from data {data} / control {control} for 10 s: no feedmux "
                     "serve running there, a wrong host or port, a firewall in between, or "
                     "the server busy sampling (a slow first sample)"], done.stderr
