"""RemoteLoader against real servers on 127.0.0.1, and its argument checks."""

from __future__ import annotations

import gc
import json
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

import feedmux
from feedmux.client.remote import RemoteLoader
from feedmux.protocol import PROTOCOL_VERSION, Hello, decode, encode

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ids_stream(start: int, stop: int) -> feedmux.Streamer[dict[str, Any]]:
    def generate() -> Iterator[dict[str, Any]]:
        for i in range(start, stop):
            yield {"id": np.int64(i), "x": np.arange(3, dtype=np.float32) + i}

    return feedmux.Streamer(generate)


@pytest.fixture
def addresses() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"address": []}, "expected a data endpoint"),
        ({"address": "tcp://127.0.0.1:1", "timeout": 0}, "expected timeout None or > 0"),
        ({"address": "tcp://127.0.0.1:1", "world_size": 0}, "expected world_size an int >= 1"),
        ({"address": "tcp://127.0.0.1:1", "hwm": 0}, "expected hwm an int >= 1"),
        ({"address": ["tcp://127.0.0.1:1"], "control": ["a", "b"]}, "one control endpoint per"),
        ({"address": "udp://nowhere"}, "cannot derive a control endpoint"),
    ],
)
def test_bad_arguments_say_what_was_expected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, feedmux.TransportError), match=message):
        RemoteLoader(**kwargs)


def test_a_server_object_in_a_background_process(addresses: tuple[str, str]) -> None:
    data, control = addresses
    with feedmux.Server(ids_stream(0, 10), bind=data, control=control, epochs=2) as server:
        with RemoteLoader(data, control=control, timeout=20, with_meta=True) as loader:
            received = [(meta.epoch, meta.position, int(s["id"])) for meta, s in loader]
        assert server.join(timeout=10) == 0
    assert received == [(e, i, i) for e in (1, 2) for i in range(10)]


def test_samples_arrive_intact_and_writable(addresses: tuple[str, str]) -> None:
    data, control = addresses
    with feedmux.Server(ids_stream(0, 5), bind=data, control=control, epochs=1):
        with RemoteLoader(data, control=control, timeout=20) as loader:
            samples = list(loader)
    assert [int(s["id"]) for s in samples] == list(range(5))
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(sample["x"], np.arange(3, dtype=np.float32) + i)
        assert sample["x"].flags.writeable


def test_one_loader_takes_from_several_servers(addresses: tuple[str, str]) -> None:
    first, second = addresses
    controls = [f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"]
    with feedmux.Server(ids_stream(0, 50), bind=first, control=controls[0], epochs=2), \
            feedmux.Server(ids_stream(50, 100), bind=second, control=controls[1], epochs=2):
        with RemoteLoader([first, second], control=controls, timeout=20,
                          with_meta=True) as loader:
            seen = Counter((meta.epoch, int(sample["id"])) for meta, sample in loader)
            assert len(loader) == 100
            assert all(loader.server_ids)
    assert seen == Counter((epoch, i) for epoch in (1, 2) for i in range(100))


def test_state_dict_is_plain_data_and_restores(addresses: tuple[str, str]) -> None:
    data, control = addresses
    with feedmux.Server(ids_stream(0, 20), bind=data, control=control):
        with RemoteLoader(data, control=control, timeout=20) as loader:
            stream = feedmux.Stream(loader)
            for _ in range(7):
                stream.next()
            state = json.loads(json.dumps(stream.state_dict()))
    assert state["iteration"] == 7
    assert state["loader"]["last_epoch"] == 1
    assert state["loader"]["last_position"] == 6
    restored = feedmux.Stream(RemoteLoader(data, control=control, timeout=1))
    restored.load_state_dict(state)
    assert restored.iteration == 7
    assert restored.loader.last_epoch == 1
    assert restored.loader.last_position == 6
    with pytest.raises(feedmux.StreamError, match="last_position"):
        restored.load_state_dict({**state, "loader": {"last_epoch": 1}})


def test_closed_loader_refuses_to_iterate() -> None:
    loader = RemoteLoader(f"tcp://127.0.0.1:{free_port()}", timeout=0.2)
    loader.close()
    with pytest.raises(feedmux.TransportClosedError, match="closed"):
        next(loader)


def test_garbage_collection_closes_the_sockets() -> None:
    loader = RemoteLoader(f"tcp://127.0.0.1:{free_port()}", timeout=0.1)
    with pytest.raises(feedmux.TransportTimeoutError):
        next(loader)
    finalizer = loader._finalizer
    assert finalizer is not None and finalizer.alive
    del loader
    gc.collect()
    assert not finalizer.alive


def test_a_peer_with_another_protocol_version_is_told_so(addresses: tuple[str, str]) -> None:
    data, control = addresses
    with feedmux.Server(ids_stream(0, 5), bind=data, control=control):
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        try:
            dealer.connect(control)
            header = msgpack.packb({**msgpack.unpackb(bytes(encode(Hello("x"))[0])),
                                    "v": PROTOCOL_VERSION + 6})
            dealer.send(header)
            assert dealer.poll(10_000), "no answer from the server"
            answer = decode(dealer.recv_multipart())
        finally:
            dealer.close()
            context.term()
    assert type(answer).__name__ == "Error"
    assert answer.type.endswith("VersionMismatchError")
    assert f"expected protocol version {PROTOCOL_VERSION}, got {PROTOCOL_VERSION + 6}" in (
        answer.message
    )


def test_a_loader_per_thread(addresses: tuple[str, str]) -> None:
    data, control = addresses
    results: list[list[int]] = [[], []]

    def trainer(rank: int) -> None:
        with RemoteLoader(data, control=control, timeout=20, world_size=2) as loader:
            results[rank] = [int(s["id"]) for s in loader]

    with feedmux.Server(ids_stream(0, 4000), bind=data, control=control, epochs=1,
                        samples_per_message=8, min_trainers=2):
        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=40)
    assert sorted(results[0] + results[1]) == list(range(4000))


def test_iter_epoch_yields_one_server_epoch_at_a_time(addresses: tuple[str, str]) -> None:
    data, control = addresses
    with feedmux.Server(ids_stream(0, 10), bind=data, control=control, epochs=3,
                        samples_per_message=4):
        with RemoteLoader(data, control=control, timeout=20) as loader:
            epochs = [[int(s["id"]) for s in loader.iter_epoch()] for _ in range(4)]
    assert epochs == [list(range(10))] * 3 + [[]]


def test_min_trainers_holds_sampling_until_they_connect(addresses: tuple[str, str]) -> None:
    data, control = addresses
    with feedmux.Server(ids_stream(0, 100), bind=data, control=control, epochs=1,
                        min_trainers=2, samples_per_message=10):
        first = RemoteLoader(data, control=control, timeout=0.5)
        with first, pytest.raises(feedmux.TransportTimeoutError):
            next(first)  # alone: nothing is sent
        assert feedmux.fetch_stats(control)["samples_sent"] == 0
        results: list[list[int]] = [[], []]

        def trainer(rank: int) -> None:
            with RemoteLoader(data, control=control, timeout=20) as loader:
                results[rank] = [int(s["id"]) for s in loader]

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=40)
    assert sorted(results[0] + results[1]) == list(range(100))
    assert results[0] and results[1]


def test_a_wrong_control_address_is_reported(addresses: tuple[str, str],
                                              monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import time

    from feedmux.client import remote

    monkeypatch.setattr(remote, "CONTROL_SILENCE_WARNING", 0.3)
    data, control = addresses
    nobody = f"tcp://127.0.0.1:{free_port()}"
    with feedmux.Server(ids_stream(0, 50), bind=data, control=control), \
            RemoteLoader(data, control=nobody, timeout=20) as loader, \
            caplog.at_level(logging.WARNING, logger="feedmux.client"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not caplog.records:
            next(loader)
    assert any(nobody in r.getMessage() and "never answered" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("tune", [True, False])
def test_large_messages_tune_malloc_once_unless_told_not_to(
    addresses: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tune: bool
) -> None:
    from feedmux.client import remote

    calls: list[int] = []
    monkeypatch.setattr(remote, "keep_freed_memory", lambda: calls.append(1) or True)

    def big() -> Iterator[dict[str, Any]]:
        while True:
            yield {"X": np.ones(1 << 19, np.float32)}  # 2 MiB

    data, control = addresses
    with feedmux.Server(feedmux.Streamer(big), bind=data, control=control), \
            RemoteLoader(data, control=control, timeout=20, tune_malloc=tune) as loader:
        for _ in range(5):
            assert next(loader)["X"].shape == (1 << 19,)
    assert calls == ([1] if tune else [])


def test_keep_freed_memory_is_idempotent() -> None:
    from feedmux._transport import keep_freed_memory

    first = keep_freed_memory()
    assert keep_freed_memory() == first
