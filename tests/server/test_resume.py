"""Resuming a ranked job: the announcements, the agreement, the dealing and the core's part."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedmux.protocol import RESUME_CHECKPOINT, RESUME_LIVE, Error, Heartbeat, Hello, Welcome
from feedmux.server._control.core import Phase, Sends
from feedmux.server._control.resume import Handed, Start, agreed_start, check_announcement
from feedmux.server._delivery.dealing import RankDealer
from tests.server.test_core import A, B, C, kinds, make_core

CKPT, LIVE = RESUME_CHECKPOINT, RESUME_LIVE


def rank_hello(client: str, rank: int, world_size: int = 2, resume: tuple[int, ...] = ()) -> Hello:
    return Hello(client_id=client, world_size=world_size, rank=rank, resume=resume)


def test_a_malformed_announcement_is_refused_with_what_was_expected() -> None:
    for bad in [(1, 2, 3), (0, 0, 2, CKPT), (1, -1, 2, CKPT), (1, 0, 0, LIVE), (1, 0, 2, 7)]:
        assert "expected resume (epoch >= 1" in (check_announcement(bad) or "")
    core = make_core()
    core.begin()
    [(_, error)] = core.receive(A, rank_hello("a", 0, resume=(1, -1, 2, CKPT)), now=0.0)
    assert isinstance(error, Error) and "got (1, -1, 2, 1) from rank 0" in error.message


def test_checkpointed_ranks_must_agree_and_live_ones_start_at_the_earliest() -> None:
    same = {0: (2, 40, 2, CKPT), 1: (2, 40, 2, CKPT)}
    assert agreed_start(same, 3) == (Start((2, 40), {}), "")
    start, why = agreed_start({0: (2, 40, 2, CKPT), 1: ()}, 2)
    assert start is None and "rank 1: no position (a fresh start)" in why
    mixed = {0: (2, 40, 2, CKPT), 1: (2, 40, 2, LIVE)}
    assert agreed_start(mixed, 2)[0] is None
    live = {0: (3, 2, 2, LIVE), 1: (2, 238, 2, LIVE), 2: ()}
    # A live rank that had nothing yet starts at the beginning (epoch 1, position 0).
    assert agreed_start(live, 3)[0] is None  # the world size of live ranks cannot change
    live = {0: (3, 2, 2, LIVE), 1: (2, 238, 2, LIVE)}
    assert agreed_start(live, 2) == (Start((2, 238), {0: (3, 2)}), "")


def share_rows(shares: list) -> list[tuple[int, list[int], list[str]]]:
    return [(s.rank, s.tags[:, 1].tolist(), list(s.items)) for s in shares]


def test_a_resumed_epoch_is_dealt_from_its_position_and_padded_with_its_first_items() -> None:
    epoch = list("abcdefghij")  # 10 items, resumed at position 3 with 3 ranks
    dealer = RankDealer(3, "pad")
    dealer.resume(2, 3, head=epoch[:2])
    shares = dealer.deal(2, epoch[3:]) + dealer.finish_epoch(2)
    assert share_rows(shares) == [
        (0, [3, 6], ["d", "g"]), (1, [4, 7], ["e", "h"]), (2, [5, 8], ["f", "i"]),
        (0, [9], ["j"]), (1, [10], ["a"]), (2, [11], ["b"]),
    ]
    dropping = RankDealer(3, "drop")
    dropping.resume(2, 3)
    assert sum(len(s.items) for s in dropping.deal(2, epoch[3:]) + dropping.finish_epoch(2)) == 6
    # The next epoch is dealt from its start again.
    assert share_rows(dealer.deal(3, list("xyz"))) == [(0, [0], ["x"]), (1, [1], ["y"]),
                                                        (2, [2], ["z"])]


def test_a_rank_ahead_gets_nothing_it_already_had() -> None:
    dealer = RankDealer(2, "pad")
    dealer.ahead = {0: (1, 4)}  # rank 0 had positions 0 and 2 of epoch 1
    shares = dealer.deal(1, list("abcdef"))
    assert share_rows(shares) == [(0, [4], ["e"]), (1, [1, 3, 5], ["b", "d", "f"])]
    assert share_rows(dealer.deal(2, list("gh"))) == [(0, [0], ["g"]), (1, [1], ["h"])]
    assert dealer.ahead == {}


def gather(core: Any, hellos: list[tuple[bytes, Hello]], now: float) -> Sends:
    """Every hello received, then two ticks (the welcomes, then the start); the second's sends."""
    for identity, hello in hellos:
        core.receive(identity, hello, now=now)
    core.tick(now=now)
    return core.tick(now=now + 0.1)


def test_the_core_starts_where_the_checkpointed_ranks_agree() -> None:
    core = make_core()
    core.begin()
    core.receive(A, rank_hello("a", 0, resume=(2, 40, 2, CKPT)), now=0.0)
    core.tick(now=0.0)
    assert core.phase is Phase.WAITING  # rank 1 is missing
    gather(core, [(B, rank_hello("b", 1, resume=(2, 40, 2, CKPT)))], now=0.1)
    assert core.phase is Phase.SAMPLING and core.start_at == (2, 40)


def test_ranks_announcing_different_checkpoints_fail_the_start_naming_both() -> None:
    core = make_core()
    core.begin()
    sends = gather(core, [(A, rank_hello("a", 0, resume=(2, 40, 2, CKPT))),
                          (B, rank_hello("b", 1, resume=(2, 44, 2, CKPT)))], now=0.0)
    assert core.phase is Phase.LAST_WORD
    [message] = {message for _, message in sends}
    assert isinstance(message, Error)
    assert "rank 0: a checkpoint at epoch 2, position 40" in message.message
    assert "rank 1: a checkpoint at epoch 2, position 44" in message.message


def test_a_checkpoint_announced_while_the_job_runs_restarts_it() -> None:
    core = make_core()
    core.begin()
    gather(core, [(A, rank_hello("a", 0)), (B, rank_hello("b", 1))], now=0.0)
    assert core.phase is Phase.SAMPLING and core.start_at is None
    core.data_sent(8, 1)
    # The job restarts with 3 ranks from a checkpoint its 2 ranks took.
    sends = core.receive(C, rank_hello("c", 0, 3, resume=(1, 6, 2, CKPT)), now=0.2)
    assert kinds(sends) == [(A, Error), (B, Error), (C, Welcome)]
    assert core.restarting and core.phase is Phase.WAITING and core.messages_sent == 0
    assert core.ranks.world_size == 3 and core.ranks.missing() == [1, 2]
    # A member of the new job saying hello again does not restart it again.
    core.receive(C, rank_hello("c", 0, 3, resume=(1, 6, 2, CKPT)), now=0.3)
    assert core.ranks.missing() == [1, 2]
    gather(core, [(identity, rank_hello(identity.decode(), rank, 3, (1, 6, 2, CKPT)))
                  for identity, rank in ((b"d", 1), (b"e", 2))], now=0.4)
    assert core.phase is Phase.SAMPLING and core.start_at == (1, 6)


def test_a_heartbeat_while_waiting_does_not_make_a_free_trainer() -> None:
    # A rank that outlived its server beats before it learns the server is new: it must
    # not start a run of free trainers before its hello says it is a rank.
    core = make_core()
    core.begin()
    assert kinds(core.receive(A, Heartbeat(sender_id="a", received_messages=3), now=0.0)) == [
        (A, Welcome)]
    core.tick(now=0.0)
    core.tick(now=0.1)
    assert core.phase is Phase.WAITING and core.trainers == {}
    assert np.int64(core.received_total()) == 0


def test_free_reliable_trainers_resume_at_the_first_position_nobody_handed_out() -> None:
    core = make_core(min_trainers=2)
    core.begin()
    sends = gather(core, [(A, Hello(client_id="a", handed=(2, 10, 20, 2, 30, 40))),
                          (B, Hello(client_id="b", handed=(2, 20, 25, 3, 0, 4)))], now=0.0)
    assert sends == () and core.phase is Phase.SAMPLING
    # After the earliest of their latest hand-outs (a's 2:39; b's is 3:3): what either had
    # not handed out was dealt after it. 2:25-30 went to neither (a trainer gone since).
    assert core.start_at == (2, 40)
    kept = core.handed.fresh(2, np.arange(24, 42))
    assert kept is not None and np.flatnonzero(~kept).tolist() == [0, *range(6, 16)]
    assert core.handed.fresh(3, np.arange(6)).tolist() == [False] * 4 + [True] * 2


def test_a_restarted_reliable_server_deals_again_what_the_summaries_list_below_the_start() -> None:
    # a and b outlived the server; a trainer gone before the crash held 2:8-16 (the
    # old server's summary lists it, up to 2:40: everything else before was handed out).
    # b handed out 2:12-14 of it since (re-dealt to it): b's copy of the summary lacks it.
    core = make_core(min_trainers=2)
    core.begin()
    gather(core, [(A, Hello(client_id="a", handed=(2, 32, 40),
                            handed_below=(2, 40, 2, 8, 16, 2, 36, 40))),
                  (B, Hello(client_id="b", handed=(2, 12, 14, 2, 40, 44),
                            handed_below=(2, 40, 2, 8, 12, 2, 14, 16)))], now=0.0)
    assert core.phase is Phase.SAMPLING and core.start_at == (2, 8)
    positions = np.arange(0, 48)
    kept = core.handed.fresh(2, positions)
    assert kept is not None
    # 36-40: a handed it out (its report) although a's summary still lists it.
    assert positions[kept].tolist() == [8, 9, 10, 11, 14, 15, 44, 45, 46, 47]
    assert core.handed.fresh(3, np.arange(4)) is None


def test_a_bucketing_trainers_latest_hand_out_is_no_frontier_past_its_summary() -> None:
    # Its shape's window held rows below its latest batch that came after the summary it
    # read: taken for handed out (below every trainer's latest), they were lost.
    positions = np.arange(0, 48)
    plain = Handed([(1, 30, 40)], [(1, 16)])
    assert plain.start == (1, 40)
    assert positions[plain.fresh(1, positions)].tolist() == list(range(40, 48))
    bucketed = Handed([(1, 30, 40)], [(1, 16)], scattered=[((1, 20, 21, 1, 44, 45), (1, 16))])
    assert bucketed.start == (1, 16)  # 16 .. 47 unreported: dealt again
    assert positions[bucketed.fresh(1, positions)].tolist() == [
        *range(16, 20), *range(21, 30), *range(40, 44), *range(45, 48)]
    unsummarized = Handed([(1, 30, 40)], scattered=[((1, 20, 21, 1, 44, 45), ())])
    assert unsummarized.start == (1, 21)  # no summary: from its first reported run on
