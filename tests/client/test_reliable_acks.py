"""A reliable loader's acknowledgements: several messages at once, the rest from its thread."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import pytest
import zmq

from feedmux.client._acks import HandOutAcks
from feedmux.client._data import DataSockets
from feedmux.protocol import Ack, decode


class RecordingSocket:
    """Stands for a data DEALER: keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
        self.sent.append(decode(frames))


def hand_out(data: DataSockets, server_id: str, seq: int) -> None:
    """What receive() does once every sample of message ``seq`` was handed out."""
    data.pending_ack = (0, server_id, seq)
    data._finished()


def test_messages_handed_out_whole_are_acknowledged_a_batch_at_a_time() -> None:
    socket = RecordingSocket()
    data = DataSockets([socket], reliable=True, client_id="c", addresses=["x"],
                       tune_malloc=False, ack_batch=3)
    for seq in (1, 2):
        hand_out(data, "s", seq)
    assert socket.sent == [] and list(data.finished[0]) == [("s", 1), ("s", 2)]
    hand_out(data, "s", 3)
    assert socket.sent == [Ack(seqs=(1, 2, 3), client_id="c")]
    assert not data.finished[0]
    hand_out(data, "s", 4)
    data.forget_ack(0)  # a new server: the old one's sequence numbers mean nothing to it
    assert not data.finished[0] and data.pending_ack is None


@pytest.mark.timeout(30)
def test_the_thread_acknowledges_what_the_loader_left_waiting(tmp_path: Path) -> None:
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    address = f"ipc://{tmp_path}/control"
    router.bind(address)
    finished: deque[tuple[str, int]] = deque([("s", 4), ("s", 5)])
    acks = HandOutAcks([address], client_id="c", rank=-1, progress=lambda: None,
                       finished=[finished])
    try:
        assert router.poll(10_000), "no acknowledgement within 10 s"
        message = decode(router.recv_multipart()[1:])
        # No position: handed out whole (the server acknowledges them as on the data socket).
        assert message == Ack(seqs=(4, 5), client_id="c", server_id="s")
        assert not finished
    finally:
        acks.stop()
        assert not acks._thread.is_alive()
        router.close()
        context.term()
