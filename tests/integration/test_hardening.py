"""The measured attacks of the hardening issue, each against a live server on port 0.

Each one must leave the server's resident memory within bounds while it goes
on serving a trainer every sample, exactly. The peak RSS (``VmHWM``, reset
before the attack) is what is checked, not the RSS after: memory that was
taken and given back still counted against the machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest

from benchmarks.attacks import ask, flood, peak_rss, reset_peak, rss
from feedmux import RemoteLoader, Server
from feedmux.protocol import decode
from tests.integration.samplers import numbered

MiB = 1 << 20
#: The issue's bound on what any attack may add to the server's memory.
BOUND = 100 * MiB
N = 4 * 50


@pytest.fixture
def server() -> Iterator[Server]:
    instance = Server(numbered, bind="tcp://127.0.0.1:0", epochs=1,
                      factory_kwargs={"delay": 0.0})
    instance.start()
    try:
        yield instance
    finally:
        assert instance.stop() is not None


def _serve_one_epoch(server: Server) -> list[int]:
    with RemoteLoader(server.data_address, control=server.control_address,
                      timeout=20) as loader:
        return sorted(int(sample["id"]) for sample in loader)


def _attack_memory(server: Server, attack: Any) -> int:
    pid = server.pid
    assert pid is not None
    reset_peak(pid)
    start = rss(pid)
    attack()
    return peak_rss(pid) - start


def test_many_large_frames_at_either_port(server: Server) -> None:
    frame = b"\x00" * MiB
    # The data socket is a ROUTER: trainers send credit and acknowledgements there, and
    # what it takes in is bounded.
    targets = [server.control_address, server.data_address]

    def attack() -> None:
        for address in targets:
            flood(address, [frame] * 200, messages=2)
        # The server answers (and so has read past the attack) before we measure.
        assert ask(server.control_address, [b"\x81\xa1v\x01"]) is not None

    assert _attack_memory(server, attack) < BOUND
    assert _serve_one_epoch(server) == list(range(N))


def test_header_of_empty_maps(server: Server) -> None:
    # 10 MiB of 0x80 in a map that passes the version check: millions of dicts, if decoded.
    header = b"\x82\xa1v\x01\xa1x\xdd" + (10 * MiB).to_bytes(4, "big") + b"\x80" * (10 * MiB)
    targets = [server.control_address, server.data_address]

    def attack() -> None:
        for address in targets:
            flood(address, [header])
        assert ask(server.control_address, [b"\x81\xa1v\x01"]) is not None

    assert _attack_memory(server, attack) < BOUND
    assert _serve_one_epoch(server) == list(range(N))


def test_malformed_control_message_gets_no_traceback(server: Server) -> None:
    rng = np.random.default_rng(0)
    garbage = [rng.bytes(int(n)) for n in rng.integers(1, 300, 30)]
    garbage += [msgpack.packb({"v": 1, "k": 99}), msgpack.packb({"v": 1, "k": 1, "role": 7})]
    for frame in garbage:
        reply = ask(server.control_address, [frame])
        assert reply is not None, frame
        message = decode(reply)
        assert message.traceback == ""
        if message.type.endswith("VersionMismatchError"):
            assert message.message.startswith("expected protocol version 1, got ")
        else:
            assert message.message == "malformed control message"
        assert b"File " not in b"".join(reply) and b".py" not in b"".join(reply)


def test_control_floods_while_the_sampler_is_slow() -> None:
    # Control is served between samples: with a second per sample, what libzmq holds
    # for the control socket is all there is between the attacker and the server.
    server = Server(numbered, bind="tcp://127.0.0.1:0", factory_kwargs={"delay": 1.0})
    server.start()
    try:
        frame = b"\x00" * MiB

        def attack() -> None:
            flood(server.control_address, [frame] * 200, messages=10)
            assert ask(server.control_address, [b"\x81\xa1v\x01"], timeout=10) is not None

        assert _attack_memory(server, attack) < BOUND
    finally:
        assert server.stop() is not None
