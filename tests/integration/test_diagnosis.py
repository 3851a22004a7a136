"""The trainer's input-bound diagnosis against real servers: a very slow and a fast sampler."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from feedmux.client.remote import RemoteLoader
from feedmux.server.server import Server

pytestmark = pytest.mark.timeout(60)

WINDOW = 1.0


def started(**factory_kwargs: object) -> Server:
    return Server("tests.integration.samplers:numbered", factory_kwargs=factory_kwargs,
                  bind="tcp://127.0.0.1:0").start()


@pytest.fixture
def slow_server() -> Iterator[Server]:
    # 0.1 s per sample: the trainer waits for nearly all of every window, however loaded
    # the machine is.
    server = started(delay=0.1)
    yield server
    assert server.stop() is not None


@pytest.fixture
def fast_server() -> Iterator[Server]:
    server = started(per_stream=1000)
    yield server
    assert server.stop() is not None


def test_a_very_slow_sampler_makes_the_trainer_say_add_workers(
    slow_server: Server, caplog: pytest.LogCaptureFixture,
) -> None:
    deadline = time.monotonic() + 30
    with caplog.at_level(logging.WARNING, logger="feedmux.client"), RemoteLoader(
        slow_server.data_address, control=slow_server.control_address, timeout=20,
        diagnose_window=WINDOW,
    ) as loader:
        for _ in loader:
            if any("waited for data" in m for m in caplog.messages):
                break
            assert time.monotonic() < deadline, "no diagnosis within 30 s"
        stats = loader.stats()
    [verdict] = [m for m in caplog.messages if "waited for data" in m]
    assert "the server is sampling" in verdict and "add --workers" in verdict
    assert stats["wait_fraction"] is not None and stats["wait_fraction"] > 0.5
    assert stats["server_busy_fraction"] is not None and stats["server_busy_fraction"] > 0.5


def test_a_fast_sampler_keeps_the_trainer_quiet(
    fast_server: Server, caplog: pytest.LogCaptureFixture,
) -> None:
    windows_ended = 0
    with caplog.at_level(logging.WARNING, logger="feedmux.client"), RemoteLoader(
        fast_server.data_address, control=fast_server.control_address, timeout=20,
        diagnose_window=WINDOW, diagnose_threshold=0.5,
    ) as loader:
        deadline = time.monotonic() + 3.5 * WINDOW
        for _ in loader:
            time.sleep(0.002)  # the training step: far slower than the sampler
            if time.monotonic() > deadline:
                break
        stats = loader.stats()
        windows_ended = stats["window_s"] is not None
    assert windows_ended
    assert [m for m in caplog.messages if "waited for data" in m] == []
    assert stats["wait_fraction"] is not None and stats["wait_fraction"] < 0.5
    assert stats["server_blocked_fraction"] is not None
