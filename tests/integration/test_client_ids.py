"""A loader whose client id a live trainer holds is refused at once; the holder goes on."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from feedmux import RemoteLoader, Server
from feedmux.errors import ConfigurationError

pytestmark = pytest.mark.timeout(90)


def two_slow_epochs() -> Server:
    # 400 samples at 10 ms: the holder is still receiving when the duplicate says hello.
    return Server("tests.integration.samplers:numbered", bind="tcp://127.0.0.1:0",
                  factory_kwargs={"delay": 0.01}, epochs=2)


@pytest.fixture(params=["free", "ranked"])
def mode(request: pytest.FixtureRequest) -> Iterator[tuple[Server, dict[str, object]]]:
    options: dict[str, object] = {"free": {}, "ranked": {"rank": 0}}[request.param]
    server = two_slow_epochs()
    yield server.start(), options
    server.stop()


def test_a_second_loader_with_a_live_trainers_client_id_is_refused_at_once(
        mode: tuple[Server, dict[str, object]]) -> None:
    server, options = mode
    ids: list[int] = []
    with RemoteLoader(server.data_address, control=server.control_address, timeout=30,
                      client_id="trainer-7", **options) as holder:  # type: ignore[arg-type]
        for sample in holder:
            ids.append(int(sample["id"]))
            if len(ids) == 20:
                break
        started = time.monotonic()
        # Before: the duplicate's data connection was refused by ZeroMQ without a word and
        # its control connection took the holder's over; it waited for its timeout.
        with RemoteLoader(server.data_address, control=server.control_address, timeout=30,
                          client_id="trainer-7", **options) as duplicate, \
                pytest.raises(ConfigurationError, match="client_id 'trainer-7' is in use"):
            next(duplicate)
        assert time.monotonic() - started < 10, "refused, but not at once"
        ids.extend(int(sample["id"]) for sample in holder)  # the holder ends normally
    assert sorted(ids) == sorted(list(range(200)) * 2)


def test_a_closed_loaders_client_id_is_free_again_at_once() -> None:
    # What the first loader had not handed out goes to the second.
    server = two_slow_epochs().start()
    try:
        ids: list[int] = []
        for _ in range(2):  # a loader per epoch, each under the same id
            with RemoteLoader(server.data_address, control=server.control_address, timeout=30,
                              client_id="trainer-7") as loader:
                ids.extend(int(sample["id"]) for sample in loader.iter_epoch())
        assert sorted(ids) == sorted(list(range(200)) * 2)
    finally:
        server.stop()
