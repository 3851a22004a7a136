"""A rank's successor says what its dead predecessor handed out last (its mark file):
where the server cuts the rank's replay, and the hellos whose word it does not take."""

from __future__ import annotations

import numpy as np

from feedmux.protocol import Ack, Data, Hello, encode
from feedmux.server._control.ranks import RankTables

SERVER = "s1"


def predecessor_sent(tables: RankTables, *positions: int, group: str = "") -> None:
    """Rank 0 of a job of 1 (in ``group``) was sent ``positions`` of epoch 1 by trainer
    "old", which then died."""
    hello = Hello("old", world_size=1, rank=0, group=group)
    assert tables.admit(b"old", hello, alive=lambda identity: False) is None
    tags = np.array([[1, position] for position in positions])
    frames = list(encode(Data(tags, [{"p": position} for position in positions])))
    tables.retention_of(group).record(0, b"old", frames)
    tables.release(b"old")


def successor(tables: RankTables, **fields: object) -> Hello:
    hello = Hello("new", world_size=1, rank=0, **fields)  # type: ignore[arg-type]
    assert tables.admit(b"new", hello, alive=lambda identity: False) is None
    return hello


def replayed(tables: RankTables, group: str = "") -> list[list[int]]:
    return [entry.tags[:, 1].tolist()
            for entry in tables.retention_of(group).take_over(0, b"new")]


def test_the_replay_starts_after_the_predecessor_s_mark_file_when_it_is_further_on() -> None:
    tables = RankTables(grouped=False, retention_limit=8)
    predecessor_sent(tables, 0, 1, 2, 3, 4)
    tables.acknowledged("", Ack(client_id="old", rank=0, server_id=SERVER, epoch=1,
                                position=1))  # the last mark its thread sent
    hello = successor(tables, predecessor=(1, 3), predecessor_server=SERVER)
    assert tables.predecessor_said(hello, SERVER) == (1, 3)
    assert replayed(tables) == [[4]]


def test_a_mark_file_behind_the_marks_heard_changes_nothing() -> None:
    tables = RankTables(grouped=False, retention_limit=8)
    predecessor_sent(tables, 0, 1, 2, 3, 4)
    tables.acknowledged("", Ack(client_id="old", rank=0, server_id=SERVER, epoch=1,
                                position=3))
    hello = successor(tables, predecessor=(1, 1), predecessor_server=SERVER)
    assert tables.predecessor_said(hello, SERVER) is None
    assert replayed(tables) == [[4]]


def test_another_server_s_or_a_checkpoint_s_hello_is_not_taken() -> None:
    for fields in ({"predecessor": (1, 3), "predecessor_server": "an earlier server"},
                   {"predecessor": (1, 3), "predecessor_server": SERVER,
                    "resume": (1, 2, 1, 1)},
                   {"predecessor": (1, 3, 7), "predecessor_server": SERVER}):
        tables = RankTables(grouped=False, retention_limit=8)
        predecessor_sent(tables, 0, 1, 2, 3, 4)
        hello = Hello("new", world_size=1, rank=0, **fields)  # type: ignore[arg-type]
        assert tables.predecessor_said(hello, SERVER) is None, fields
        assert replayed(tables) == [[0, 1, 2, 3, 4]], fields


def test_a_ranked_group_s_successor_is_cut_in_its_group() -> None:
    tables = RankTables(grouped=True, retention_limit=8)
    predecessor_sent(tables, 0, 1, 2, group="job")
    hello = successor(tables, group="job", predecessor=(1, 0), predecessor_server=SERVER)
    assert tables.predecessor_said(hello, SERVER) == (1, 0)
    assert replayed(tables, "job") == [[1, 2]]


def test_a_mark_that_names_another_server_is_a_sign_of_life_only() -> None:
    # A loader over several servers marks each link with the server of the message it
    # left there: after a restart, the old process's mark reaches the new one. Its
    # positions are not this process's: taken, they released messages nobody handed out.
    tables = RankTables(grouped=False, retention_limit=8)
    hello = Hello("old", world_size=1, rank=0)
    assert tables.admit(b"old", hello, alive=lambda identity: False) is None
    tags = np.array([[1, position] for position in range(5)])
    frames = list(encode(Data(tags, [{"p": position} for position in range(5)])))
    tables.retention.record(0, b"old", frames)
    elsewhere = Ack(client_id="old", rank=0, server_id="the process before", epoch=1,
                    position=3)
    assert tables.acknowledged("", elsewhere, SERVER) == b"old"  # alive, all the same
    assert tables.retention.mark(0) is None
    tables.release(b"old")
    successor(tables)
    assert replayed(tables) == [[0, 1, 2, 3, 4]]
    # The same mark naming this server (or none) counts.
    for server_id in (SERVER, ""):
        tables = RankTables(grouped=False, retention_limit=8)
        assert tables.admit(b"old", hello, alive=lambda identity: False) is None
        tables.retention.record(0, b"old", frames)
        mark = Ack(client_id="old", rank=0, server_id=server_id, epoch=1, position=3)
        assert tables.acknowledged("", mark, SERVER) == b"old"
        tables.release(b"old")
        successor(tables)
        assert replayed(tables) == [[4]], server_id
