"""The end of a ranked stream waits for a restarted rank's hand-over: no sockets.

Issue: with the whole stream sampled before a killed rank's successor came (a short
run, or one the ranks read fast), the drain had been idle for longer than
``drain_idle`` by then; the successor's hello made its rank held again, so nothing
counted as owed any more, and the next tick ended the stream before the
predecessor's rest was re-sent (the successor got its rank's share short: 39 of its
82 remaining steps in one run, and the rest after the end in another).
"""

from __future__ import annotations

import numpy as np

from feedmux.protocol import Data, EndOfStream, Heartbeat, Hello, encode
from feedmux.server._control.core import ControlCore, Phase
from feedmux.server._control.ranks import RankTables
from feedmux.server.config import ServerConfig

RANK0, DOOMED, SUCCESSOR = b"c0", b"c1", b"c2"


def make_core() -> ControlCore:
    config = ServerConfig(source="unused:source", server_id="srv", drain_idle=1.0,
                          drain_timeout=30.0)
    return ControlCore(config, started=0.0, pid=1)


def message(*positions: int) -> list[object]:
    tags = np.array([[1, position] for position in positions])
    return list(encode(Data(tags, [str(p) for p in positions])))


def ended(sends: list[tuple[bytes, object]]) -> bool:
    return any(isinstance(sent, EndOfStream) for _, sent in sends)


def beat(sender: str, received: int) -> Heartbeat:
    return Heartbeat(sender_id=sender, received_messages=received)


def a_job_whose_rank_1_died_with_the_stream_sampled() -> ControlCore:
    """Ranks 0 and 1; rank 1 was sent 2 messages and died having handed out neither;
    the stream is sampled whole and the drain has been idle for 5 s (> drain_idle)."""
    core = make_core()
    core.begin()
    core.receive(RANK0, Hello("t0", world_size=2, rank=0), now=0.0)
    core.receive(DOOMED, Hello("t1", world_size=2, rank=1), now=0.0)
    for tenth in range(1, 20):  # welcomed, then counted: sampling starts
        core.tick(tenth / 100)
    assert core.phase is Phase.SAMPLING
    for rank, positions in ((0, (0, 2)), (1, (1, 3)), (0, (4, 6)), (1, (5, 7))):
        core.data_sent(len(positions), epoch=1)
        core.retention.record(rank, f"t{rank}".encode(), message(*positions))
    core.retention.record_mark(0, b"t0", (1, 6))  # rank 0 handed out all it got
    core.finish(now=0.5)
    core.peer_gone(DOOMED)
    now = 0.5
    while now < 5.5:
        now += 0.1
        core.receive(RANK0, beat("t0", 2), now=now)  # rank 0 waits: it answers each drain
        assert not ended(core.tick(now)), f"the stream ended at {now} with rank 1 owed"
    return core


def test_the_stream_does_not_end_between_a_successor_s_hello_and_its_hand_over() -> None:
    core = a_job_whose_rank_1_died_with_the_stream_sampled()
    sends = core.receive(SUCCESSOR, Hello("t2", world_size=2, rank=1), now=5.6)
    assert core.ranks.holder(1) == (SUCCESSOR, "t2")
    assert not ended(sends)
    # Its data connection takes a while (a loaded machine): nothing re-sent yet.
    now = 5.6
    while now < 8.0:
        now += 0.1
        core.receive(RANK0, beat("t0", 2), now=now)
        core.receive(SUCCESSOR, beat("t2", 0), now=now)
        assert not ended(core.tick(now)), f"the stream ended at {now:.1f} before the hand-over"


def test_a_hand_over_during_the_drain_is_progress_the_drain_waits_for() -> None:
    core = a_job_whose_rank_1_died_with_the_stream_sampled()
    core.receive(SUCCESSOR, Hello("t2", world_size=2, rank=1), now=5.6)
    # The hand-over: the predecessor's 2 messages re-sent to the successor (counted sent).
    for entry in core.retention.take_over(1, b"t2"):
        core.retention.resent(1, entry, b"t2")
        core.data_sent(len(entry.tags), epoch=1)
    # Sent, not yet received: the count has not moved for 5 s, but the sends have.
    core.receive(RANK0, beat("t0", 2), now=5.7)
    core.receive(SUCCESSOR, beat("t2", 0), now=5.7)
    assert not ended(core.tick(5.7))
    # The successor receives them and says so: every message but the 2 that died with
    # its predecessor is counted, and the drain ends once that count stays put.
    now = 5.7
    while core.phase is Phase.DRAINING and now < 20.0:
        now += 0.1
        core.receive(RANK0, beat("t0", 2), now=now)
        core.receive(SUCCESSOR, beat("t2", 2), now=now)
        core.tick(now)
    assert core.phase is not Phase.DRAINING and 6.7 < now < 7.5, now


def test_a_ranked_group_s_rank_is_owed_until_its_successor_had_its_hand_over() -> None:
    tables = RankTables(grouped=True, retention_limit=8)
    assert tables.admit(b"c0", Hello("t0", world_size=1, rank=0, group="g"),
                        alive=lambda identity: False) is None
    ledger = tables.retention_of("g")
    ledger.record(0, b"t0", message(0, 1))
    assert not tables.owed_to_a_successor()  # its holder is alive: nothing owed
    tables.release(b"c0")
    assert tables.owed_to_a_successor()  # nobody holds the rank
    assert tables.admit(b"c1", Hello("t1", world_size=1, rank=0, group="g"),
                        alive=lambda identity: False) is None
    assert tables.owed_to_a_successor()  # held again, not re-sent yet
    for entry in ledger.take_over(0, b"t1"):
        ledger.resent(0, entry, b"t1")
    assert not tables.owed_to_a_successor()
