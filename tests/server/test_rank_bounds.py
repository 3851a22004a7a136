"""What a peer naming ranks can make the server hold: bounded, with no sockets."""

from __future__ import annotations

import numpy as np

from feedmux.protocol import Ack, Data, Hello, encode, read_tags
from feedmux.server._control.core import ControlCore
from feedmux.server._control.ranks import MAX_WORLD_SIZE, RankTable
from feedmux.server._delivery.ledger import Ledger, Recovery
from feedmux.server.config import ServerConfig


def test_a_world_size_beyond_the_bound_is_refused() -> None:
    table = RankTable()
    refused = table.admit(b"a", Hello("a", world_size=MAX_WORLD_SIZE + 1, rank=0),
                          alive=lambda identity: True)
    assert refused is not None and f"at most {MAX_WORLD_SIZE}" in refused[1]
    assert table.world_size is None  # the mode is still open


def test_acknowledgements_of_ranks_outside_the_job_keep_nothing() -> None:
    core = ControlCore(ServerConfig(source="m:a", server_id="s"), 0.0, 1)
    core.begin()
    core.receive(b"c0", Hello("t0", world_size=2, rank=0), 0.1)
    for rank in range(2, 10_000):
        core.receive(b"x", Ack(client_id="x", rank=rank, epoch=1, position=rank), 0.2)
    assert all(core.retention.mark(rank) is None for rank in range(10_000))


def test_a_mark_from_a_client_the_rank_s_data_never_went_to_is_ignored() -> None:
    retention = Ledger(Recovery.REPLAY, limit=8)
    frames = list(encode(Data(np.array([[1, 0], [1, 2]]), ["a", "b"])))
    retention.record(0, b"holder", frames)
    retention.record_mark(0, b"intruder", (99, 0))  # would cut everything
    retention.record_mark(0, b"holder", (1, 0))
    # The holder's own mark counted: the successor gets sample 2, not nothing.
    assert [read_tags(entry.frames).tolist()
            for entry in retention.take_over(0, b"successor")] == [[[1, 2]]]


def test_group_acknowledgements_of_ranks_outside_the_group_or_of_no_group_keep_nothing() -> None:
    core = ControlCore(ServerConfig(source="m:a", server_id="s", group_buffer=8), 0.0, 1)
    core.begin()
    core.receive(b"c0", Hello("t0", world_size=2, rank=0, group="g"), 0.1)
    core.receive(b"c1", Hello("t1", world_size=3, rank=2, group="h"), 0.1)
    for rank in range(2, 1000):  # rank 2 is one of group h's, not of g
        core.receive(b"x", Ack(client_id="t0", rank=rank, epoch=1, position=rank), 0.2)
    core.receive(b"x", Ack(client_id="stranger", rank=0, epoch=1, position=9), 0.2)
    for group in ("g", "h"):
        assert all(core.tables.retention_of(group).mark(rank) is None for rank in range(1000))
    assert sorted(core.tables._groups) == ["g", "h"]  # an acknowledgement creates no group
