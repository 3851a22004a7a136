"""A loader's waits against a real server: a trainer faster than its server waits first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from feedmux import Server
from feedmux.client._data import DataSockets
from feedmux.client.remote import RemoteLoader

pytestmark = pytest.mark.timeout(60)

MESSAGES = 40


@pytest.fixture
def slow_server() -> Iterator[Server]:
    """One sample per message, 20 ms apart: any trainer here waits for every one."""
    server = Server("tests.integration.samplers:numbered", bind="tcp://127.0.0.1:0",
                    factory_kwargs={"streams": 1, "per_stream": MESSAGES, "delay": 0.02},
                    epochs=1, samples_per_message=1, shm=False).start()
    yield server
    server.stop()


def test_a_trainer_faster_than_its_server_asks_its_data_sockets_once_per_message(
        slow_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = [0]
    receive = DataSockets.receive

    def counted(self: DataSockets, links: Any) -> Any:
        asked[0] += 1
        return receive(self, links)

    monkeypatch.setattr(DataSockets, "receive", counted)
    with RemoteLoader(slow_server.data_address, control=slow_server.control_address,
                      timeout=30) as loader:
        ids = [int(sample["id"]) for sample in loader]
    assert ids == list(range(MESSAGES))  # the same stream, in the same order
    # Waiting first, each message is one question to the data socket once it is there
    # (asking first, then waiting, took two). Slack for the first message, for the end of
    # the stream, and for a trainer the machine held back while messages queued.
    assert asked[0] <= MESSAGES + MESSAGES // 4 + 2, f"{asked[0]} receives for {MESSAGES}"
    assert slow_server.join(30) == 0
