"""The acknowledging thread of a loader over several servers: each link on its own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from feedmux._plumbing.sockets import HEARTBEAT_INTERVAL
from feedmux.client._acks import HandOutAcks
from feedmux.protocol import Ack, decode

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def two_routers(tmp_path: Path) -> Iterator[list[tuple[zmq.Socket[Any], str]]]:
    """Two ROUTERs on ipc paths in the test's folder, standing for two servers' control."""
    context: zmq.Context[Any] = zmq.Context()
    routers = []
    try:
        for name in ("first", "second"):
            router = context.socket(zmq.ROUTER)
            router.linger = 0
            address = f"ipc://{tmp_path}/{name}"
            router.bind(address)
            routers.append((router, address))
        yield routers
    finally:
        for router, _ in routers:
            router.close()
        context.term()


def acks_until(router: zmq.Socket[Any], until: float) -> list[Ack]:
    """The ``Ack`` messages ``router`` gets before ``until``."""
    got = []
    while (remaining := until - time.monotonic()) > 0 and router.poll(int(remaining * 1000)):
        message = decode(router.recv_multipart()[1:])
        assert isinstance(message, Ack)
        got.append(message)
    return got


def test_a_long_step_on_one_servers_message_is_a_sign_of_life_to_the_other(
        two_routers: list[tuple[zmq.Socket[Any], str]]) -> None:
    # A free trainer over two servers, in a long step on the first one's message: the
    # thread repeated its mark there and said nothing to the second, which took it for
    # lost after its silence grace and dealt what it held to the others.
    (first, first_address), (second, second_address) = two_routers
    tags = np.array([[1, 0], [1, 1]], dtype=np.int64)
    acks = HandOutAcks([first_address, second_address], client_id="c", rank=-1,
                       progress=lambda: (0, "s1", tags, 7, 1))
    try:
        until = time.monotonic() + 2.5 * HEARTBEAT_INTERVAL
        to_second = acks_until(second, until)
        to_first = acks_until(first, time.monotonic() + 0.2)  # (queued meanwhile)
    finally:
        acks.stop()
    assert len(to_second) >= 2, "no sign of life to the second server"
    assert all(ack.position == -1 and not ack.seqs for ack in to_second)  # no mark
    assert to_first and all(ack.server_id == "s1" and ack.position == 0 for ack in to_first)


def test_told_is_the_last_mark_of_any_link(
        two_routers: list[tuple[zmq.Socket[Any], str]]) -> None:
    (_, first_address), (second, second_address) = two_routers
    tags = np.array([[1, 4], [1, 5]], dtype=np.int64)
    acks = HandOutAcks([first_address, second_address], client_id="c", rank=0,
                       progress=lambda: (1, "s2", tags, 0, 2))
    try:
        deadline = time.monotonic() + 10
        while not acks.told(("s2", 1, 5)) and time.monotonic() < deadline:
            time.sleep(0.001)  # the poll interval of a bounded wait
        assert acks.told(("s2", 1, 5)) and not acks.told(("s2", 1, 4))
        assert [(ack.epoch, ack.position) for ack in acks_until(second, time.monotonic() + 1)
                if ack.position >= 0][:1] == [(1, 5)]
    finally:
        acks.stop()
