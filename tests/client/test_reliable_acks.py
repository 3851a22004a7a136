"""A loader's acknowledgements: several messages at once, the rest from its thread."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.client._acks import HandOutAcks, SeenPositions
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
    data = DataSockets([socket], client_id="c", addresses=["x"],
                       tune_malloc=False, ack_batch=3)
    for seq in (1, 2):
        hand_out(data, "s", seq)
    assert socket.sent == [] and list(data.finished[0]) == [("s", 1), ("s", 2)]
    hand_out(data, "s", 3)
    assert socket.sent == [Ack(seqs=(1, 2, 3), client_id="c", server_id="s")]
    assert not data.finished[0]
    hand_out(data, "s", 4)
    data.forget_ack(0)  # a new server: the old one's sequence numbers mean nothing to it
    assert not data.finished[0] and data.pending_ack is None


def test_each_server_process_s_messages_are_acknowledged_under_its_id() -> None:
    # A message of the old process still queued when its server restarted is dropped and
    # finished like any other: its number, in the new process's numbering, is another
    # message, which must not be taken for handed out.
    socket = RecordingSocket()
    data = DataSockets([socket], client_id="c", addresses=["x"],
                       tune_malloc=False, ack_batch=3)
    hand_out(data, "old", 7)
    hand_out(data, "new", 1)
    hand_out(data, "new", 2)
    assert socket.sent == [Ack(seqs=(7,), client_id="c", server_id="old"),
                           Ack(seqs=(1, 2), client_id="c", server_id="new")]


@pytest.mark.timeout(30)
def test_the_thread_acknowledges_what_the_loader_left_waiting(
        control_router: tuple[zmq.Socket[Any], str]) -> None:
    router, address = control_router
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


class SetOfPositions:
    """The obvious model: every position taken, in a set."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], set[int]] = {}

    def fresh(self, server_id: str, tags: Any) -> list[int] | None:
        epoch = int(tags[0, 0])
        if (server_id, epoch) not in self.seen:
            for key in [k for k in self.seen if k[0] == server_id and k[1] < epoch - 1]:
                del self.seen[key]
        seen = self.seen.setdefault((server_id, epoch), set())
        positions = tags[:, 1].tolist()
        rows = [row for row, position in enumerate(positions) if position not in seen]
        seen.update(positions)
        return None if len(rows) == len(positions) else rows


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["s", "t"]), st.integers(1, 4),
    st.one_of(  # a run of positions (the usual message), or any positions in any order
        st.tuples(st.integers(0, 60), st.integers(1, 12)).map(lambda r: list(range(r[0], sum(r)))),
        st.lists(st.integers(0, 60), min_size=1, max_size=12, unique=True),
    )), max_size=25))
def test_seen_positions_as_ranges_answer_as_a_set_would(
        messages: list[tuple[str, int, list[int]]]) -> None:
    ranges, model = SeenPositions(), SetOfPositions()
    for server_id, epoch, positions in messages:
        tags = np.array([[epoch, position] for position in positions], dtype=np.int64)
        assert ranges.fresh(server_id, tags) == model.fresh(server_id, tags)
