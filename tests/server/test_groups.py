"""Consumer groups without sockets: the buffer (cursors, joining, lag, dropping, the bound),
the opening of a server's groups, the hellos the combination table refuses, a given-up group."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.errors import ConfigurationError
from feedmux.protocol import Ack, Data, Error, Heartbeat, Hello, Welcome, decode, encode
from feedmux.server._control.core import ControlCore, Phase, Send, Sends
from feedmux.server._control.ranks import RankTables
from feedmux.server._control.resume import CHECKPOINT, LIVE
from feedmux.server._delivery.dealer import Dealer
from feedmux.server._delivery.fanout import GroupFanout, _RankedGroup
from feedmux.server._delivery.groups import DEFAULT_GROUP, GroupBuffer
from feedmux.server.config import ServerConfig, parse_group_buffer, refusal
from tests.server.test_dealer import AnyWithRoom


def _drain(buffer: GroupBuffer, name: str) -> list[object]:
    got = []
    while (message := buffer.next_for(name)) is not None:
        got.append(message.frames[0])
        buffer.delivered(name)
    return got


def test_every_group_gets_every_message_in_order() -> None:
    buffer = GroupBuffer(max_messages=10)
    for name in "abc":
        buffer.join(name, now=0.0)
    for index in range(5):
        buffer.append([index], n_samples=2, epoch=1, nbytes=1)
    assert [_drain(buffer, name) for name in "abc"] == [list(range(5))] * 3
    assert buffer.drained and buffer.stats()["group_buffer_messages"] == 0
    assert buffer.groups["b"].epoch == 1 and buffer.groups["b"].position == 10


def test_the_slowest_group_fills_the_buffer_and_is_named() -> None:
    buffer = GroupBuffer(max_messages=3)
    buffer.join("fast", now=0.0)
    buffer.join("slow", now=0.0)
    for index in range(3):
        buffer.append([index], n_samples=1, epoch=1, nbytes=1)
        _drain(buffer, "fast")
    assert buffer.full and buffer.lagging() == "slow" and buffer.behind("slow") == 3
    assert buffer.stats()["lagging_group"] == "slow"
    buffer.delivered("slow")
    assert not buffer.full
    buffer.append([3], n_samples=1, epoch=1, nbytes=1)
    assert buffer.full
    buffer.drop("slow")  # gone: what it alone held is let go
    assert not buffer.full and list(buffer.groups) == ["fast"] and buffer.behind("fast") == 1


def test_the_byte_limit_bounds_the_buffer() -> None:
    buffer = GroupBuffer(max_bytes=100)
    buffer.join("a", now=0.0)
    buffer.append([0], n_samples=1, epoch=1, nbytes=60)
    assert not buffer.full
    buffer.append([1], n_samples=1, epoch=1, nbytes=60)
    assert buffer.full
    buffer.delivered("a")
    assert not buffer.full


def test_a_group_joining_mid_epoch_starts_at_the_next_epoch() -> None:
    buffer = GroupBuffer(max_messages=100)
    buffer.join("a", now=0.0)
    buffer.append(["e1-0"], n_samples=1, epoch=1, nbytes=1)
    assert _drain(buffer, "a") == ["e1-0"]  # epoch 1's start has left the buffer
    late = buffer.join("late", now=0.0)
    assert late.start_epoch == 2 and late.cursor is None
    buffer.append(["e1-1"], n_samples=1, epoch=1, nbytes=1)
    assert buffer.next_for("late") is None
    buffer.epoch_finished(1)
    buffer.append(["e2-0"], n_samples=1, epoch=2, nbytes=1)
    assert _drain(buffer, "late") == ["e2-0"]
    assert _drain(buffer, "a") == ["e1-1", "e2-0"]


def test_a_late_group_starts_at_the_oldest_epoch_the_buffer_still_holds_whole() -> None:
    # A group joining late while another lags: the buffer still holds epoch 1 from its
    # first message, so the late group gets it whole (before, it waited for epoch 2, which
    # a stream of one epoch never samples: an empty epoch without a word).
    buffer = GroupBuffer(max_messages=100)
    buffer.join("a", now=0.0)
    buffer.append(["e1-0"], n_samples=1, epoch=1, nbytes=1)
    buffer.append(["e1-1"], n_samples=1, epoch=1, nbytes=1)
    buffer.epoch_finished(1)
    buffer.append(["e2-0"], n_samples=1, epoch=2, nbytes=1)
    assert buffer.delivered("a") is None  # e1-0 gone: epoch 2 is the oldest whole one
    late = buffer.join("late", now=0.0)
    assert (late.start_epoch, _drain(buffer, "late")) == (2, ["e2-0"])
    assert buffer.join("later", now=0.0).start_epoch == 2  # e2-0 is still held by "a"
    early = GroupBuffer(max_messages=100)
    early.join("a", now=0.0)
    early.append(["e1-0"], n_samples=1, epoch=1, nbytes=1)
    assert early.join("late", now=0.0).start_epoch == 1
    early.append(["e1-1"], n_samples=1, epoch=1, nbytes=1)
    assert _drain(early, "late") == ["e1-0", "e1-1"]


def test_the_groups_still_waiting_for_their_first_epoch_are_named() -> None:
    buffer = GroupBuffer(max_messages=100)
    buffer.join("a", now=0.0)
    buffer.append(["e1-0"], n_samples=1, epoch=1, nbytes=1)
    _drain(buffer, "a")
    buffer.join("late", now=0.0)
    buffer.epoch_finished(1)
    assert buffer.waiting() == ["late"]
    buffer.append(["e2-0"], n_samples=1, epoch=2, nbytes=1)
    assert buffer.waiting() == ["late"]  # its first message is there, not yet received
    _drain(buffer, "late")
    assert buffer.waiting() == []


def test_a_group_joining_at_an_epoch_boundary_starts_with_the_next_message() -> None:
    buffer = GroupBuffer(max_messages=100)
    buffer.join("a", now=0.0)
    buffer.append(["e1"], n_samples=1, epoch=1, nbytes=1)
    buffer.epoch_finished(1)
    _drain(buffer, "a")
    assert buffer.join("b", now=0.0).start_epoch == 2
    buffer.append(["e2"], n_samples=1, epoch=2, nbytes=1)
    assert _drain(buffer, "b") == ["e2"]


def test_join_now_starts_with_the_next_message() -> None:
    buffer = GroupBuffer(max_messages=100, join="now")
    buffer.join("a", now=0.0)
    buffer.append(["e1-0"], n_samples=1, epoch=1, nbytes=1)
    buffer.join("now", now=0.0)
    buffer.append(["e1-1"], n_samples=1, epoch=1, nbytes=1)
    assert _drain(buffer, "now") == ["e1-1"]


def test_a_group_without_members_is_dropped_after_the_timeout_and_frees_the_buffer() -> None:
    buffer = GroupBuffer(max_messages=2, group_timeout=5.0)
    buffer.join("live", now=0.0)
    buffer.join("gone", now=0.0)
    buffer.set_members("live", 1, now=0.0)
    buffer.set_members("gone", 1, now=0.0)
    for index in range(2):
        buffer.append([index], n_samples=1, epoch=1, nbytes=1)
    _drain(buffer, "live")
    assert buffer.full
    buffer.set_members("gone", 0, now=1.0)
    assert buffer.expire(now=5.9) == []
    buffer.set_members("gone", 1, now=2.0)  # a member came back: the clock restarts
    buffer.set_members("gone", 0, now=3.0)
    assert buffer.expire(now=7.9) == []
    assert buffer.expire(now=8.0) == ["gone"]
    assert not buffer.full and "gone" not in buffer.groups


def test_messages_nobody_needs_are_not_kept() -> None:
    buffer = GroupBuffer(max_messages=2)
    buffer.join("a", now=0.0)
    buffer.append([0], n_samples=1, epoch=1, nbytes=1)
    _drain(buffer, "a")
    buffer.join("waiting", now=0.0)  # mid-epoch: holds nothing back
    buffer.append([1], n_samples=1, epoch=1, nbytes=1)
    buffer.append([2], n_samples=1, epoch=1, nbytes=1)
    assert buffer.lagging() == "a" and buffer.behind("waiting") == 0


@pytest.mark.parametrize(("value", "expected"), [
    (5, (5, 0)), ("5", (5, 0)), ("2KiB", (0, 2048)), ("3 MB", (0, 3_000_000)),
])
def test_group_buffer_sizes(value: int | str, expected: tuple[int, int]) -> None:
    assert parse_group_buffer(value) == expected


@pytest.mark.parametrize("value", [0, -1, "0", "lots", "5 parsecs", "1.5MiB"])
def test_bad_group_buffer_sizes_are_refused(value: int | str) -> None:
    with pytest.raises(ConfigurationError, match="expected group_buffer"):
        parse_group_buffer(value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "end", "a", "b", "c", "join"]),
                          st.integers(0, 2)), max_size=80))
def test_every_active_group_sees_the_stream_in_order_from_its_start(events: list) -> None:
    """Whatever the interleaving, each group receives a gap-free run of the stream, and
    a group that joined by the epoch rule starts at the first message of an epoch."""
    buffer = GroupBuffer(max_messages=4)
    buffer.join("a", now=0.0)
    epoch, sent, got = 1, 0, {"a": []}
    firsts = {1: 0}
    for action, arg in events:
        if action == "append" and not buffer.full:
            buffer.append([(epoch, sent)], n_samples=1, epoch=epoch, nbytes=1)
            sent += 1
        elif action == "end":
            buffer.epoch_finished(epoch)
            epoch += 1
            firsts[epoch] = sent
        elif action == "join":
            name = "bc"[arg % 2]
            if name not in buffer.groups:
                buffer.join(name, now=0.0)
                got[name] = []
        elif action in buffer.groups and buffer.next_for(action) is not None:
            got[action].append(buffer.next_for(action).frames[0])
            buffer.delivered(action)
    for name, messages in got.items():
        numbers = [number for _, number in messages]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) if numbers else True
        if messages and name != "a":
            first_epoch, first_number = messages[0]
            assert firsts[first_epoch] == first_number
    assert len(buffer.groups) and buffer.stats()["groups"] == len(buffer.groups)


@pytest.mark.parametrize(("options", "expected"), [
    ({"group_buffer": "8 furlongs"}, "expected group_buffer"),
    ({"group_buffer": 8, "join": "later"}, "expected join 'epoch' or 'now'"),
    ({"group_buffer": 8, "group_timeout": 0}, "expected group_timeout > 0"),
])
def test_bad_group_settings_are_refused(options: dict[str, object], expected: str) -> None:
    from feedmux.server.config import ServerConfig

    with pytest.raises(ConfigurationError, match=expected):
        ServerConfig(source="unused:source", **options)  # type: ignore[arg-type]


def test_an_epoch_is_closed_once_its_last_message_is_in() -> None:
    buffer = GroupBuffer(max_messages=4)
    buffer.join("a", now=0.0)
    buffer.append(["m1"], n_samples=2, epoch=1, nbytes=1)
    assert not buffer.epoch_closed(1)
    buffer.epoch_finished(1)
    assert buffer.epoch_closed(1) and not buffer.epoch_closed(2)
    buffer.append(["m2"], n_samples=2, epoch=2, nbytes=1)
    assert buffer.epoch_closed(1) and not buffer.epoch_closed(2)


def test_a_dropped_group_forgets_its_ranks() -> None:
    tables = RankTables(grouped=True, retention_limit=4)
    assert tables.admit(b"a", Hello("a", world_size=2, rank=0, group="g"), lambda i: True) is None
    tables.forget("g")
    assert not tables.of("g").ranked
    # Its trainers coming back may form the group again, even with another world size.
    assert tables.admit(b"b", Hello("b", world_size=3, rank=2, group="g"), lambda i: True) is None
    assert tables.of("g").world_size == 3


def _core(**options: object) -> ControlCore:
    config = ServerConfig(source="unused:source", server_id="srv", **options)  # type: ignore[arg-type]
    return ControlCore(config, started=0.0)


def _refusal(sends: Sends) -> str:
    [(_, error)] = sends
    assert isinstance(error, Error) and error.type == "feedmux.errors.ConfigurationError"
    return error.message


def test_a_group_on_a_server_without_group_buffer_opens_its_groups() -> None:
    core = _core()
    core.receive(b"p", Hello("plain"), now=1.0)
    assert not core.tables.grouped  # no group yet: as ever
    [(_, welcome), *_] = core.receive(b"g", Hello("one", group="eval"), now=1.0)
    assert isinstance(welcome, Welcome)
    assert core.tables.grouped
    # The plain trainer so far is the group default; the server's own table stays free.
    assert core.trainers[b"p"].group == DEFAULT_GROUP and core.trainers[b"g"].group == "eval"
    assert core.tables.of(DEFAULT_GROUP).world_size == 0 and not core.ranks.ranked
    assert core.ranks is core.tables.server
    # A ranked job may join as a group of its own, another plain trainer as the default one.
    [(_, ranked), *_] = core.receive(b"r", Hello("r0", rank=0, world_size=2, group="ddp"),
                                     now=1.0)
    assert isinstance(ranked, Welcome) and ranked.world_size == 2
    assert isinstance(core.receive(b"q", Hello("plain2"), now=1.0)[0][1], Welcome)


def test_a_refused_group_hello_leaves_a_server_without_groups() -> None:
    core = _core()
    assert "expected rank in [0, 2)" in _refusal(
        core.receive(b"g", Hello("bad", rank=3, world_size=2, group="eval"), now=1.0))
    assert not core.tables.grouped


@pytest.mark.parametrize(("options", "first", "hello", "rule"), [
    ({}, Hello("r0", rank=0, world_size=2), Hello("g", group="eval"), ("ranked_job", "group")),
    ({"group_buffer": 8}, None, Hello("r", rank=0, world_size=2, resume=(2, 4, 2, LIVE)),
     ("groups", "live")),
    ({}, None, Hello("r", rank=0, world_size=2, group="ddp", resume=(2, 4, 2, LIVE)),
     ("group", "live")),
])
def test_each_refused_hello_gets_its_rule_s_reason(
        options: dict[str, object], first: Hello | None, hello: Hello,
        rule: tuple[str, str]) -> None:
    core = _core(**options)
    if first is not None:
        assert isinstance(core.receive(b"first", first, now=1.0)[0][1], Welcome)
    message = _refusal(core.receive(b"late", hello, now=1.0))
    assert message == refusal(set(rule)) and b"late" not in core.trainers


@pytest.mark.parametrize(("options", "first", "hello"), [
    ({}, Hello("b", batch_size=4), Hello("g", group="eval")),
    ({"group_buffer": 8}, None, Hello("b", batch_size=4)),
    ({}, None, Hello("g", group="eval", batch_size=4)),
    ({}, Hello("g", group="train", rank=0, world_size=1, batch_size=16),
     Hello("e", group="eval")),
])
def test_groups_and_batches_combine(options: dict[str, object], first: Hello | None,
                                    hello: Hello) -> None:
    # Before: refused, "a group's messages are shared as sampled" (the batches were cut
    # before the fan-out; now each trainer's, or ranked job's, after it).
    core = _core(**options)
    if first is not None:
        assert isinstance(core.receive(b"first", first, now=1.0)[0][1], Welcome)
    assert isinstance(core.receive(b"late", hello, now=1.0)[0][1], Welcome)


def test_a_group_on_a_reliable_server_is_welcomed() -> None:
    core = _core()
    [(_, welcome), *_] = core.receive(b"g", Hello("g", group="eval"), now=1.0)
    assert isinstance(welcome, Welcome) and welcome.reliable and core.tables.grouped


def test_a_rank_on_a_reliable_server_is_welcomed() -> None:
    [(_, welcome)] = _core().receive(b"r", Hello("r", rank=0, world_size=2), now=1.0)
    assert isinstance(welcome, Welcome) and welcome.reliable and welcome.world_size == 2


def test_a_ranked_group_s_live_position_is_refused_naming_its_checkpoint() -> None:
    message = _refusal(_core().receive(
        b"r", Hello("r", rank=0, world_size=2, group="ddp", resume=(2, 4, 2, LIVE)), now=1.0))
    assert "a rank that outlived its server goes on with the old process's dealing" in message
    assert "restart the job from its checkpoint" in message


def test_a_ranked_group_s_checkpoint_is_welcomed_and_starts_the_sampler_at_its_epoch() -> None:
    core = _core(group_buffer=8)
    core.begin()
    for rank in range(2):
        [(_, welcome), *_] = core.receive(
            b"r%d" % rank, Hello(f"r{rank}", rank=rank, world_size=2, group="ddp",
                                 resume=(3, 40, 2, CHECKPOINT)), now=1.0)
        assert isinstance(welcome, Welcome)
    assert core.tables.of("ddp").resumed_at == (3, 40)
    core.tick(1.0)
    core.tick(1.1)  # the welcomes, then the start
    assert core.phase is Phase.SAMPLING and core.start_at == (3, 0)  # the epoch whole


def test_a_fresh_group_keeps_the_sampler_at_the_beginning_of_the_stream() -> None:
    core = _core(group_buffer=8)
    core.begin()
    core.receive(b"r0", Hello("r0", rank=0, world_size=1, group="ddp",
                              resume=(3, 40, 1, CHECKPOINT)), now=1.0)
    core.receive(b"e", Hello("e", group="eval"), now=1.0)
    core.tick(1.0)
    core.tick(1.1)
    assert core.phase is Phase.SAMPLING and core.start_at is None  # ddp waits for epoch 3


def test_a_ranked_group_restarted_from_a_checkpoint_tells_its_previous_run_it_is_over() -> None:
    core = _core(group_buffer=8)
    core.receive(b"a0", Hello("a0", rank=0, world_size=2, group="ddp"), now=1.0)
    core.receive(b"a1", Hello("a1", rank=1, world_size=2, group="ddp"), now=1.0)
    resume = (2, 8, 2, CHECKPOINT)
    sends = core.receive(b"b0", Hello("b0", rank=0, world_size=2, group="ddp", resume=resume),
                         now=2.0)
    told = {identity: message for identity, message in sends if isinstance(message, Error)}
    assert set(told) == {b"a0", b"a1"}
    assert "the job of group 'ddp' restarted from a checkpoint" in told[b"a1"].message
    assert set(core.trainers) == {b"b0"} and core.tables.of("ddp").resumed_at == (2, 8)
    # Its other rank joins the new run; the same checkpoint from rank 0 again restarts it.
    core.receive(b"b1", Hello("b1", rank=1, world_size=2, group="ddp", resume=resume), now=2.0)
    assert set(core.trainers) == {b"b0", b"b1"}
    core.receive(b"c0", Hello("c0", rank=0, world_size=2, group="ddp", resume=resume), now=3.0)
    assert set(core.trainers) == {b"c0"}


def _fanout_past_two_epochs(core: ControlCore, sends: list[Send]) -> GroupFanout:
    """A fan-out whose group eval took epochs 1 and 2: its buffer holds nothing."""
    dealer = Dealer(None, core, None, lambda: False,  # type: ignore[arg-type]  # sends nothing
                    lambda name: AnyWithRoom())
    fanout = GroupFanout(core.config, dealer, core, stopping=lambda: False,
                         deliver=sends.extend)
    core.receive(b"e", Hello("e", group="eval"), now=time.monotonic())
    fanout.pump()
    fanout.buffer.on_leave = None  # no carrier here
    for epoch in (1, 2):
        fanout.buffer.append(["m"], n_samples=4, epoch=epoch, nbytes=1)
        fanout.buffer.delivered("eval")
        fanout.buffer.epoch_finished(epoch)
    return fanout


def _says_both_epochs(message: str) -> None:
    assert ("group 'ddp' resumes from a checkpoint at epoch 1, position 2" in message
            and "can no longer give epoch 1 whole" in message
            and "the oldest epoch it can give whole is 3" in message
            and "a server of its own (no group=), started with the same --seed" in message)


def test_a_ranked_group_the_stream_cannot_resume_is_refused_naming_both_epochs() -> None:
    core = _core(group_buffer=8)
    fanout = _fanout_past_two_epochs(core, [])
    core.oldest_whole = lambda: fanout.buffer.oldest_whole  # as the shell does
    hello = Hello("r0", rank=0, world_size=1, group="ddp", resume=(1, 2, 1, CHECKPOINT))
    _says_both_epochs(_refusal(core.receive(b"r0", hello, now=time.monotonic())))
    assert list(core.trainers) == [b"e"] and not core.tables.of("ddp").ranked
    # From the epoch the stream still gives whole on, it is welcomed.
    later = Hello("r0", rank=0, world_size=1, group="ddp", resume=(3, 2, 1, CHECKPOINT))
    assert isinstance(core.receive(b"r0", later, now=time.monotonic())[0][1], Welcome)


def test_a_refused_rank_s_heartbeat_is_never_taken_for_a_free_trainer_s() -> None:
    core = _core(group_buffer=8)
    fanout = _fanout_past_two_epochs(core, [])
    core.oldest_whole = lambda: fanout.buffer.oldest_whole
    hello = Hello("r0", rank=0, world_size=1, group="ddp", resume=(1, 2, 1, CHECKPOINT))
    _refusal(core.receive(b"r0", hello, now=time.monotonic()))
    core.phase = Phase.SAMPLING
    # Its loader beats before it reads the refusal: the group ddp gets no free member.
    [(_, answer)] = core.receive(b"r0", Heartbeat("r0", group="ddp"), now=time.monotonic())
    assert isinstance(answer, Welcome) and list(core.trainers) == [b"e"]


def test_a_ranked_group_s_checkpoint_on_a_server_dealing_a_ranked_job_gets_the_table_s_reason(
        ) -> None:
    core = _core()
    core.receive(b"a", Hello("a", rank=0, world_size=1), now=1.0)
    core.phase = Phase.SAMPLING  # far into its stream: no epoch could be given whole
    core.epoch = 5
    [refused, *_] = core.receive(b"r", Hello("r", rank=0, world_size=1, group="ddp",
                                             resume=(1, 2, 1, CHECKPOINT)), now=1.0)
    assert _refusal([refused]) == refusal({"ranked_job", "group"})


def test_a_ranked_group_whose_epoch_left_after_its_hello_is_given_up_naming_both() -> None:
    core = _core(group_buffer=8)
    sends: list[Send] = []
    fanout = _fanout_past_two_epochs(core, sends)
    core.oldest_whole = lambda: 1  # the hello came while the buffer held epoch 1
    core.receive(b"r0", Hello("r0", rank=0, world_size=1, group="ddp",
                              resume=(1, 2, 1, CHECKPOINT)), now=time.monotonic())
    fanout.pump()
    [(identity, error)] = sends
    assert identity == b"r0" and isinstance(error, Error)
    assert error.type == "feedmux.errors.ConfigurationError"
    _says_both_epochs(error.message)
    assert "ddp" not in fanout.buffer.groups and list(core.trainers) == [b"e"]


def test_a_group_given_up_has_its_trainers_told_and_forgotten() -> None:
    core = _core(group_buffer=8, rank_timeout=1.0)
    sends: list[Send] = []
    dealer = Dealer(None, core, None, lambda: False,  # type: ignore[arg-type]  # sends nothing
                    lambda name: AnyWithRoom())
    fanout = GroupFanout(core.config, dealer, core, stopping=lambda: False,
                         deliver=sends.extend)
    now = time.monotonic()  # the fan-out reads the clock: its members are live ones
    core.receive(b"r0", Hello("r0", rank=0, world_size=2, group="ddp"), now=now)
    core.receive(b"e", Hello("e", group="eval"), now=now)
    core.trainers[b"r0"].received_messages = 5
    fanout.pump()  # rank 1 is missing: the clock starts
    assert "ddp" in fanout.buffer.groups and not sends
    fanout._ranked["ddp"].missing_since = -1e9  # as if the rank timeout had passed
    fanout.pump()
    assert "ddp" not in fanout.buffer.groups and "eval" in fanout.buffer.groups
    [(identity, error)] = sends
    assert identity == b"r0" and isinstance(error, Error)
    assert error.type == "feedmux.errors.TransportTimeoutError" and "[1] of 2" in error.message
    assert list(core.trainers) == [b"e"] and core.departed_received == 5  # still counted
    assert not core.tables.of("ddp").ranked  # its trainers coming back start it afresh
    # Its loader beats before it reads the error: it does not join ddp as a free trainer.
    [(_, answer)] = core.receive(b"r0", Heartbeat("r0", group="ddp"), now=now)
    assert isinstance(answer, Welcome) and list(core.trainers) == [b"e"]


def test_a_ranked_group_is_overdue_only_after_the_rank_timeout_without_a_rank() -> None:
    group = _RankedGroup(2, "pad", audience=None, carrier=None)  # type: ignore[arg-type]
    assert not group.overdue([1], now=10.0, timeout=1.0)  # the clock starts
    assert not group.overdue([1], now=11.0, timeout=1.0)
    assert not group.overdue([], now=11.5, timeout=1.0)  # the rank came: the clock stops
    assert not group.overdue([0], now=12.0, timeout=1.0)
    assert group.overdue([0], now=13.1, timeout=1.0)


def test_a_ranked_group_s_checkpoint_restarts_no_job_of_the_server() -> None:
    core = _core()
    core.receive(b"p", Hello("plain"), now=1.0)  # sampling for a plain trainer
    [(_, welcome), *_] = core.receive(
        b"r", Hello("r", rank=0, world_size=2, group="ddp", resume=(2, 4, 2, CHECKPOINT)),
        now=1.0)
    assert isinstance(welcome, Welcome)
    # The server goes on as it was: no restart of its run, its trainer still served.
    assert not core.restarting and core.phase is Phase.SAMPLING and b"p" in core.trainers


def test_a_rank_s_last_acknowledgement_counts_after_its_trainer_is_gone() -> None:
    # Its acknowledging socket is not its control socket: the mark can arrive after the
    # server saw the trainer go; its successor must not get again what it handed out.
    core = _core(group_buffer=8)
    core.receive(b"a0", Hello("a0", world_size=2, rank=0, group="g"), now=1.0)
    core.receive(b"h0", Hello("h0", world_size=1, rank=0, group="h"), now=1.0)
    core.tables.retention_of("g").record(0, b"a0",
                                         list(encode(Data(np.array([[1, 4]]), ["x"]))))
    core.peer_gone(b"a0")
    core.receive(b"acks", Ack(client_id="a0", server_id="srv", rank=0, epoch=1, position=4),
                 now=1.5)
    assert core.tables.retention_of("g").mark(0) == (1, 4)
    assert core.tables.retention_of("h").mark(0) is None  # it sent a0 nothing


def test_what_a_late_survivor_reported_is_kept_out_of_messages_already_buffered() -> None:
    # A free server restarted from the trainers that outlived the previous one samples
    # ahead into the groups' buffer; a survivor whose hello came after sampling began
    # reports positions the sampler had drawn already. They must not be dealt again
    # (the chaos test's seed 1 found 432 repeats when only the sampler dropped them).
    from tests.server.test_dealer import FakeOutbox, plain_dealer

    core = _core()
    outbox = FakeOutbox()
    outbox.count_bytes = lambda nbytes: None  # type: ignore[attr-defined]
    reported: dict[int, set[int]] = {3: set()}
    fanout = GroupFanout(core.config, plain_dealer(outbox, core), core, stopping=lambda: False,
                         deliver=lambda sends: None,
                         unreported=lambda epoch, positions: np.array(
                             [int(p) not in reported[epoch] for p in positions]))
    core.receive(b"t", Hello("t"), now=time.monotonic())
    fanout.buffer.on_leave = None  # no carrier here
    fanout.buffer.join(DEFAULT_GROUP, now=0.0, at_once=True)
    for first in (0, 4, 8):  # three messages of epoch 3, drawn before the late hello
        fanout.buffer.append(list(encode(Data(np.array([[3, p] for p in range(first, first + 4)]),
                                              list(range(first, first + 4))))),
                             n_samples=4, epoch=3, nbytes=1)
    reported[3] |= {1, 2, 4, 5, 6, 7}  # the late survivor's hand-outs
    fanout.pump()
    dealt = [decode(parts) for _, parts in outbox.sent]
    assert [row[1] for message in dealt for row in message.tags.tolist()] == [0, 3, 8, 9, 10, 11]
    assert fanout.buffer.drained  # the message nobody had to get counts as delivered
