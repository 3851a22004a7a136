"""The hand-over of a restarted rank over real sockets: what its new holder is re-sent first."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from feedmux.protocol import Data, encode, read_tags
from feedmux.server._delivery.ledger import Ledger, Recovery
from feedmux.server._delivery.outbox import Outbox
from feedmux.server._delivery.ranksend import RankSender


def message(*positions: int) -> list[Any]:
    tags = np.array([[1, position] for position in positions])
    return list(encode(Data(tags, [f"1.{p}" for p in positions])))


@pytest.fixture
def sockets() -> Iterator[tuple[Any, Any, Any]]:
    """A data ROUTER, a control socket beside it, and the new holder's DEALER (``new``)."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    control = context.socket(zmq.ROUTER)
    holder = context.socket(zmq.DEALER)
    holder.setsockopt(zmq.IDENTITY, b"new")
    holder.connect(f"tcp://127.0.0.1:{port}")
    holder.send(b"hello")  # the ROUTER knows the peer once this arrived
    assert router.poll(10_000), "the holder's first message did not come within 10 s"
    router.recv_multipart()
    try:
        yield router, control, holder
    finally:
        for socket in (router, control, holder):
            socket.close(linger=0)
        context.term()


def test_a_hand_over_in_several_turns_logs_the_predecessor_s_mark_it_cut_at(
    sockets: tuple[Any, Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    router, control, holder = sockets
    ledger = Ledger(Recovery.REPLAY, limit=8)
    for positions in ((0, 1), (2, 3), (4, 5)):
        ledger.record(0, b"old", message(*positions))
    ledger.record_mark(0, b"old", (1, 0))
    room = [1]  # the new holder takes one message in the first turn, then all
    sender = RankSender(Outbox(router, control, lambda: None), ledger, lambda frames: None,
                        room=lambda target, held: held < room[0])
    assert not sender.replay(0, b"new")
    ledger.record_mark(0, b"new", (1, 1))  # the new holder handed out what it got so far
    room[0] = 8
    with caplog.at_level(logging.INFO, logger="feedmux.server"):
        assert sender.replay(0, b"new")
    got = []
    while holder.poll(1000):
        got += read_tags(holder.recv_multipart())[:, 1].tolist()
    assert got == [1, 2, 3, 4, 5]
    assert "from after (1, 0)" in caplog.text, caplog.text
