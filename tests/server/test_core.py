"""The server's control core, driven with events and a made-up clock: no sockets."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    Ack,
    Data,
    Drain,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Message,
    Stats,
    StatsRequest,
    Welcome,
    encode,
)
from feedmux.server._control.core import (
    CONTROL_GRACE,
    DRAIN_INTERVAL,
    FINAL_GRACE,
    TRAINER_TIMEOUT,
    ControlCore,
    Phase,
    Sends,
)
from feedmux.server.config import ServerConfig

A, B, C = b"a", b"b", b"c"


def make_core(**options: object) -> ControlCore:
    config = ServerConfig(source="unused:source", server_id="srv", **options)  # type: ignore[arg-type]
    return ControlCore(config, started=0.0, pid=123)


def hello(client_id: str = "t") -> Hello:
    return Hello(client_id=client_id, role="trainer")


def beat(received: int, sender: str = "t") -> Heartbeat:
    return Heartbeat(sender_id=sender, received_messages=received)


def kinds(sends: Sends) -> list[tuple[bytes, type[Message]]]:
    return [(identity, type(message)) for identity, message in sends]


def test_hello_gets_a_welcome_and_registers_the_trainer() -> None:
    core = make_core(epoch_size=10)
    [(identity, welcome)] = core.receive(A, hello("one"), now=1.0)
    assert identity == A and isinstance(welcome, Welcome)
    assert welcome.server_id == "srv" and welcome.epoch_size == 10 and not welcome.finished
    assert core.connected_trainers(now=1.0) == 1
    assert core.connected_trainers(now=1.0 + TRAINER_TIMEOUT + 0.1) == 0


def test_a_heartbeat_from_an_unknown_peer_registers_it_with_its_count() -> None:
    core = make_core()
    assert kinds(core.receive(B, beat(7), now=2.0)) == [(B, Welcome)]
    assert core.received_total() == 7


def test_stats_answer_with_the_counters() -> None:
    core = make_core()
    core.data_sent(4, epoch=1)
    core.data_sent(2, epoch=2)
    [(_, stats)] = core.receive(C, StatsRequest(), now=2.0)
    assert isinstance(stats, Stats)
    figures = stats.values
    assert (figures["samples_sent"], figures["messages_sent"], figures["epoch"]) == (6, 2, 2)
    assert figures["pid"] == 123 and figures["uptime_s"] == 2.0
    assert figures["samples_per_second"] is None  # no rate before a window of sending


def test_unexpected_and_malformed_messages_get_an_error_back() -> None:
    core = make_core()
    [(_, error)] = core.receive(A, Drain(sent_messages=1, server_id="x"), now=0.0)
    assert isinstance(error, Error) and (
        "expected Hello, Heartbeat, StatsRequest or Scale, got" in error.message)
    [(_, error)] = core.malformed(A, ProtocolError("bad header"), now=0.0)
    assert isinstance(error, Error) and error.type == "feedmux.errors.ProtocolError"
    assert not core.trainers


def test_a_departed_trainer_keeps_its_count() -> None:
    core = make_core()
    core.receive(A, beat(5), now=0.0)
    core.receive(B, beat(3, "u"), now=0.0)
    core.peer_gone(A)
    core.peer_gone(A)  # twice: counted once
    assert (core.departed, core.departed_received, core.received_total()) == (1, 5, 8)


def test_min_trainers_waits_for_hellos_and_forgets_one_that_left() -> None:
    core = make_core(min_trainers=2)
    core.begin()
    assert core.phase is Phase.WAITING
    core.receive(A, hello("one"), now=0.0)
    core.receive(B, hello("two"), now=0.0)
    assert kinds(core.tick(now=0.1)) == [(A, Welcome), (B, Welcome)]
    core.peer_gone(B)  # the welcome to B failed: it has gone
    assert kinds(core.tick(now=0.2)) == [(A, Welcome)]
    assert core.phase is Phase.WAITING
    core.receive(C, hello("three"), now=0.3)
    assert core.tick(now=0.3) == ()
    assert core.phase is Phase.SAMPLING


def test_dealt_by_credit_min_trainers_waits_for_their_grants_too() -> None:
    # A welcomed trainer whose grant was still on its way got none of the first messages:
    # a short epoch all went to the other, and a DataLoader worker began in the second.
    core = make_core(min_trainers=2)
    granted: set[str] = set()
    core.granted = lambda: granted
    core.begin()
    core.receive(A, hello("one"), now=0.0)
    core.receive(B, hello("two"), now=0.0)
    assert kinds(core.tick(now=0.1)) == [(A, Welcome), (B, Welcome)]
    granted.add("one")
    core.tick(now=0.2)  # both welcomed and connected: two's grant is on its way
    assert core.phase is Phase.WAITING
    granted.add("two")
    core.tick(now=0.3)
    assert core.phase is Phase.SAMPLING


def test_without_min_trainers_sampling_starts_at_the_first_hello() -> None:
    # The first hello tells whether the trainers are free or the ranks of one job.
    core = make_core()
    assert core.begin() == ()
    assert core.phase is Phase.WAITING
    core.tick(now=0.0)
    core.receive(A, hello(), now=0.05)
    core.tick(now=0.1)
    assert core.phase is Phase.SAMPLING


def test_an_epoch_broadcasts_its_size() -> None:
    core = make_core()
    core.receive(A, hello(), now=0.0)
    [(_, welcome)] = core.epoch_finished(1, 40)
    assert isinstance(welcome, Welcome) and welcome.epoch_size == 40
    assert core.epochs_completed == 1


def test_the_drain_asks_at_a_steady_pace_and_ends_once_everything_is_counted() -> None:
    core = make_core()
    core.receive(A, hello(), now=0.0)
    core.receive(B, hello("u"), now=0.0)
    for _ in range(10):
        core.data_sent(1, epoch=1)
    core.finish(now=1.0)
    assert kinds(core.tick(now=1.0)) == [(A, Drain), (B, Drain)]
    assert core.tick(now=1.0 + DRAIN_INTERVAL / 2) == ()
    core.receive(A, beat(6), now=1.05)
    core.receive(B, beat(3, "u"), now=1.05)
    assert kinds(core.tick(now=1.0 + DRAIN_INTERVAL)) == [(A, Drain), (B, Drain)]
    core.receive(B, beat(4, "u"), now=1.2)
    sends = core.tick(now=1.2)
    assert kinds(sends) == [(A, EndOfStream), (B, EndOfStream)]
    end = sends[0][1]
    assert isinstance(end, EndOfStream) and end.sent_messages == 10
    assert core.phase is Phase.LAST_WORD


def test_the_last_word_is_repeated_to_late_speakers_until_quiet() -> None:
    core = make_core()
    core.finish(now=0.0)
    core.tick(now=0.0)  # nothing sent: ends at once
    assert core.phase is Phase.LAST_WORD
    assert kinds(core.receive(C, hello(), now=0.5)) == [(C, EndOfStream)]
    assert kinds(core.receive(C, StatsRequest(), now=0.6)) == [(C, Stats)]
    core.tick(now=0.6 + FINAL_GRACE)
    assert core.phase is Phase.LAST_WORD
    core.tick(now=0.6 + FINAL_GRACE + 0.01)
    assert core.phase is Phase.DONE


def test_a_heartbeat_after_the_last_word_gets_it_and_changes_no_count() -> None:
    # The end-of-stream accounting is closed once the last word is out; a late
    # heartbeat is answered with that word and its count is not taken.
    core = make_core()
    core.receive(A, hello(), now=0.0)
    core.data_sent(3, epoch=1)
    core.finish(now=0.0)
    core.receive(A, beat(1), now=0.05)
    core.tick(now=core.config.drain_timeout + 1)
    assert core.phase is Phase.LAST_WORD
    assert kinds(core.receive(A, beat(1), now=core.config.drain_timeout + 1.1)) == [
        (A, EndOfStream)]
    assert core.received_total() == 1
    assert kinds(core.receive(A, beat(2), now=core.config.drain_timeout + 1.2)) == [
        (A, EndOfStream)]
    assert core.received_total() == 1


def test_the_last_word_is_bounded_even_when_someone_keeps_talking() -> None:
    core = make_core()
    core.fail(RuntimeError("boom"), now=0.0)
    now = 0.0
    while core.phase is Phase.LAST_WORD:
        now += 0.5
        assert kinds(core.receive(A, beat(0), now=now)) == [(A, Error)]
        core.tick(now)
    assert 4 * FINAL_GRACE < now <= 4 * FINAL_GRACE + 0.5


def _drain_after_a_departure() -> ControlCore:
    """Trainer A received 4 of 10 messages and left; B is here; the drain begins at 1.0."""
    core = make_core(drain_idle=3.0, drain_timeout=30.0)
    core.receive(A, beat(0), now=0.0)
    core.receive(B, beat(0), now=0.0)
    for _ in range(10):
        core.data_sent(1, epoch=1)
    core.receive(A, beat(4), now=0.0)
    core.peer_gone(A)
    core.finish(now=1.0)
    return core


def test_a_gone_trainer_ends_the_drain_after_drain_idle(caplog: pytest.LogCaptureFixture) -> None:
    core = _drain_after_a_departure()  # A took its unread messages with it
    core.receive(B, beat(5), now=1.0)
    assert kinds(core.tick(now=1.0)) == [(B, Drain)]
    assert core.phase is Phase.DRAINING
    core.receive(B, beat(5), now=3.9)  # B waits for data: it answers every question
    core.tick(now=4.0)
    assert core.phase is Phase.DRAINING
    with caplog.at_level(logging.WARNING, logger="feedmux.server"):
        assert kinds(core.tick(now=4.01)) == [(B, EndOfStream)]
    assert "1 of 10 data messages unconfirmed (1 trainer(s) went away)" in caplog.text


def test_a_departure_does_not_cut_the_tail_of_a_slow_live_trainer() -> None:
    core = _drain_after_a_departure()  # A had read all it was sent
    core.receive(B, beat(5), now=1.0)
    # B is busy with a long step, its last message still queued: it answers nothing.
    for tenth in range(11, 100):
        core.tick(now=tenth / 10)
    assert core.phase is Phase.DRAINING
    core.receive(B, beat(6), now=10.0)  # it reads its tail
    assert kinds(core.tick(now=10.0)) == [(B, EndOfStream)]


def test_a_live_slow_trainer_is_waited_for_until_the_drain_timeout() -> None:
    core = make_core(drain_idle=1.0, drain_timeout=10.0)
    core.receive(A, beat(0), now=0.0)
    core.data_sent(1, epoch=1)
    core.finish(now=0.0)
    now = 0.0
    while core.phase is Phase.DRAINING:
        now += DRAIN_INTERVAL
        core.receive(A, beat(0), now=now)
        core.tick(now)
    assert 10.0 < now <= 10.0 + 2 * DRAIN_INTERVAL


def test_a_dead_rank_s_unhanded_messages_hold_the_end_for_its_successor() -> None:
    # Issue: a ranked server ended the stream drain_idle seconds after a rank's trainer
    # died with messages it never handed out, so its successor (restarted by torchrun a
    # few seconds later) found the stream over and its rank's share short.
    core = make_core(drain_idle=1.0, drain_timeout=10.0)
    core.begin()
    core.receive(A, Hello("t0", world_size=1, rank=0), now=0.0)
    core.tick(0.2)
    core.data_sent(2, epoch=1)
    core.retention.record(0, b"t0", list(encode(Data(np.array([[1, 0], [1, 1]]), ["x", "y"]))))
    core.finish(now=0.5)
    core.peer_gone(A)  # SIGKILLed: nothing of its message handed out
    for tenth in range(6, 60):
        core.tick(now=tenth / 10)
    assert core.phase is Phase.DRAINING
    # Nobody came within drain_timeout: the stream ends all the same (bounded).
    while core.phase is Phase.DRAINING and tenth < 200:
        tenth += 1
        core.tick(now=tenth / 10)
    assert core.phase is Phase.LAST_WORD and 10.5 < tenth / 10 <= 11.0  # finish + timeout


def test_a_rank_whose_control_link_is_down_keeps_its_rank_within_the_grace() -> None:
    # Issue: the link between the hosts went down for 5 s; the server's control send to
    # the ranks (the epoch size) failed, it forgot both, and their rank's rest waited for
    # successors that never came. A failed control send while sampling is a link that is
    # down, not a departure, for a rank heard within CONTROL_GRACE.
    core = make_core()
    core.begin()
    core.receive(A, Hello("t0", world_size=1, rank=0), now=0.0)
    core.tick(0.2)
    core.tick(0.3)
    assert core.phase is Phase.SAMPLING
    core.unreachable(A, now=5.0)
    assert A in core.trainers and core.rank_target(0) == b"t0"
    assert (core.departed, core.stats(5.0)["unreachable_sends"]) == (0, 1)
    # Not heard for longer than the grace: gone, and its rank free for a successor.
    core.unreachable(A, now=CONTROL_GRACE + 0.5)
    assert A not in core.trainers and core.rank_target(0) is None
    assert core.departed == 1


def test_a_free_trainer_whose_control_send_fails_is_forgotten_at_once() -> None:
    core = make_core()
    core.begin()
    core.receive(A, hello(), now=0.0)
    core.tick(0.2)
    core.tick(0.3)
    core.unreachable(A, now=0.4)
    assert A not in core.trainers and core.departed == 1


def test_throughput_is_logged_every_log_every(caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(log_every=1.0)
    with caplog.at_level(logging.INFO, logger="feedmux.server"):
        core.tick(now=0.0)
        core.data_sent(50, epoch=1)
        assert core.tick(now=0.5) == ()
        assert "samples/s" not in caplog.text
        core.tick(now=2.0)
    assert ("epoch 1: 50 samples sent, 25 samples/s over the last 10 s, 0 trainer(s) "
            "connected") in caplog.text


class CoreSequences(RuleBasedStateMachine):
    """Joins, leaves, restarts, heartbeats, data and a drain in any order.

    The model: every data message sent is in the hands of one trainer
    identity (or lost with a departed one); a trainer reports at most what
    it holds.
    """

    @initialize(drain_idle=st.sampled_from([0.5, 3.0]), timeout=st.sampled_from([2.0, 30.0]))
    def start(self, drain_idle: float, timeout: float) -> None:
        self.core = make_core(drain_idle=drain_idle, drain_timeout=timeout)
        self.now = 0.0
        self.next_identity = 0
        self.held: dict[bytes, int] = {}  # identity -> data messages it holds (model)
        self.reported: dict[bytes, int] = {}
        self.gone_reported = 0
        self.finished_at: float | None = None
        self.end_at: float | None = None
        self.final: Message | None = None

    def _record(self, sends: Sends, ticked: bool = False) -> None:
        for identity, message in sends:
            if isinstance(message, EndOfStream) and self.core.final_message is None:
                # A free trainer's own end while the others drain: it has all it was sent.
                assert self.core.phase is Phase.DRAINING and not ticked
                assert self.reported.get(identity, 0) >= self.held.get(identity, 0)
                continue
            if isinstance(message, (EndOfStream, Error)):
                self.final = message
        ended = self.finished_at is not None and self.core.phase is not Phase.DRAINING
        if ticked and any(isinstance(m, EndOfStream) for _, m in sends):
            assert ended and self.end_at is None, "end of stream broadcast twice"
        if ended and self.end_at is None:
            self.end_at = self.now
            self.final = self.core.final_message
            assert isinstance(self.final, EndOfStream)
            total = self.core.received_total()
            assert self.finished_at is not None
            waited = self.now - self.finished_at
            config = self.core.config
            assert (total >= self.core.messages_sent or waited > config.drain_idle
                    or waited > config.drain_timeout), (total, self.core.messages_sent, waited)

    @rule()
    def join(self) -> None:
        identity = b"id%d" % self.next_identity
        self.next_identity += 1
        self.held[identity] = 0
        sends = self.core.receive(identity, hello(identity.decode()), self.now)
        if self.final is not None:
            assert [m for _, m in sends] == [self.final], "the last word is repeated"
        self._record(sends)

    @rule(data=st.data())
    @precondition(lambda self: bool(self.held))
    def leave(self, data: st.DataObject) -> None:
        identity = data.draw(st.sampled_from(sorted(self.held)))
        del self.held[identity]
        self.gone_reported += self.reported.pop(identity, 0)
        self.core.peer_gone(identity)

    @rule(data=st.data())
    @precondition(lambda self: bool(self.held))
    def restart(self, data: st.DataObject) -> None:
        """The same client comes back under a new identity; the old one is found gone."""
        self.leave(data)
        self.join()

    @rule(data=st.data())
    @precondition(lambda self: bool(self.held))
    def heartbeat(self, data: st.DataObject) -> None:
        identity = data.draw(st.sampled_from(sorted(self.held)))
        count = data.draw(st.integers(self.reported.get(identity, 0), self.held[identity]))
        if self.core.final_message is None:
            # Once the last word is out the core only repeats it: counts no longer matter.
            self.reported[identity] = count
        sends = self.core.receive(identity, beat(count, identity.decode()), self.now)
        if self.final is not None:
            assert [m for _, m in sends] == [self.final], "the last word is repeated"
        self._record(sends)

    @rule(data=st.data(), samples=st.integers(1, 5))
    @precondition(lambda self: bool(self.held) and self.finished_at is None)
    def send_data(self, data: st.DataObject, samples: int) -> None:
        identity = data.draw(st.sampled_from(sorted(self.held)))
        self.held[identity] += 1
        self.core.data_sent(samples, epoch=1)

    @rule()
    @precondition(lambda self: self.finished_at is None)
    def finish(self) -> None:
        self.finished_at = self.now
        self._record(self.core.finish(self.now))

    @rule(seconds=st.sampled_from([0.01, DRAIN_INTERVAL, 0.7, 2.5]))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self._record(self.core.tick(self.now), ticked=True)

    @invariant()
    def counts_add_up(self) -> None:
        core = self.core
        assert core.connected_trainers(self.now) >= 0
        assert core.departed_received == self.gone_reported
        assert core.received_total() == self.gone_reported + sum(self.reported.values())

    @invariant()
    def the_drain_is_bounded(self) -> None:
        if self.finished_at is not None and self.core.phase is Phase.DRAINING:
            assert self.now <= self.finished_at + self.core.config.drain_timeout + 2.5


TestCoreSequences = CoreSequences.TestCase
TestCoreSequences.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_no_import_cycle_in_the_server_package() -> None:
    package = Path(__file__).resolve().parents[2] / "feedmux" / "server"
    imports: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        imports[path.stem] = {
            node.module.rsplit(".", 1)[1] for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith("feedmux.server.")
        }

    def visit(module: str, trail: tuple[str, ...]) -> None:
        assert module not in trail, " -> ".join((*trail, module))
        for imported in imports.get(module, ()):
            visit(imported, (*trail, module))

    for module in imports:
        visit(module, ())


def test_a_group_hello_records_the_group_and_a_heartbeat_restores_it() -> None:
    core = make_core(group_buffer=8)
    assert kinds(core.receive(A, Hello("one", group="eval"), now=1.0)) == [(A, Welcome)]
    assert core.trainers[A].group == "eval"
    assert kinds(core.receive(B, Hello("two"), now=1.0)) == [(B, Welcome)]
    assert core.trainers[B].group == "default"
    # A trainer the server lost track of comes back in its group with its next heartbeat.
    core.receive(C, Heartbeat(sender_id="three", received_messages=2, group="eval"), now=1.0)
    assert core.trainers[C].group == "eval"
    core.begin()
    core.tick(now=1.0)
    core.tick(now=1.1)
    assert core.phase is Phase.SAMPLING  # trainers of every group count for min_trainers


def test_each_group_has_its_own_ranks_and_world_size() -> None:
    core = make_core(group_buffer=8)
    [(_, welcome)] = core.receive(A, Hello("a0", world_size=2, rank=0, group="g"), now=1.0)
    assert isinstance(welcome, Welcome) and (welcome.world_size, welcome.uneven) == (2, "pad")
    # Another group's rank 0, of another world size, is no conflict.
    [(_, other)] = core.receive(B, Hello("b0", world_size=3, rank=0, group="h"), now=1.0)
    assert isinstance(other, Welcome) and other.world_size == 3
    [(_, free)] = core.receive(C, Hello("f", group="free"), now=1.0)
    assert isinstance(free, Welcome) and free.world_size == 0
    assert core.rank_target(0, "g") == b"a0" and core.rank_target(0, "h") == b"b0"
    assert core.rank_target(1, "g") is None and not core.ranks.ranked  # no server-wide ranks
    # A rank's acknowledgement (from the loader's own socket) lands in its group's retention
    # (once the rank's data went to that trainer: a mark from anyone else counts for nothing).
    core.tables.retention_of("g").record(0, b"a0",
                                         list(encode(Data(np.array([[1, 4]]), ["x"]))))
    core.receive(b"acks", Ack(client_id="a0", server_id="srv", rank=0, epoch=1, position=4),
                 now=1.5)
    assert core.tables.retention_of("g").mark(0) == (1, 4)
    assert core.tables.retention_of("h").mark(0) is None


def test_a_group_mixing_ranked_and_free_trainers_is_refused_naming_the_group() -> None:
    core = make_core(group_buffer=8)
    core.receive(A, Hello("a0", world_size=2, rank=0, group="g"), now=1.0)
    [(_, error)] = core.receive(B, Hello("free", group="g"), now=1.0)
    assert isinstance(error, Error) and error.type.endswith("ConfigurationError")
    assert "group 'g' deals to 2 ranked trainers" in error.message and B not in core.trainers
    core.receive(C, Hello("f", group="f"), now=1.0)
    [(_, error)] = core.receive(b"d", Hello("r", world_size=2, rank=1, group="f"), now=1.0)
    assert isinstance(error, Error) and "group 'f' deals to free trainers" in error.message
    [(_, error)] = core.receive(b"e", Hello("r", world_size=3, rank=1, group="g"), now=1.0)
    assert isinstance(error, Error) and "expected world_size 2" in error.message


def test_a_hello_with_a_live_trainers_client_id_is_refused_and_the_holder_kept() -> None:
    # Before: admitted as a second trainer under one id (its data connection was then
    # refused by ZeroMQ without a word, and it waited for nothing).
    core = make_core()
    assert kinds(core.receive(A, hello("t"), now=0.0)) == [(A, Welcome)]
    core.receive(A, beat(0, "t"), now=0.5)
    sends = core.receive(B, hello("t"), now=1.0)
    assert kinds(sends) == [(B, Error), (A, Welcome)]  # the holder is only asked if it is there
    error = sends[0][1]
    assert isinstance(error, Error) and error.type == "feedmux.errors.ClientIdInUseError"
    assert "client_id 't' is in use by a live trainer" in error.message
    assert set(core.trainers) == {A}
    # Its heartbeats do not make it a trainer either.
    assert kinds(core.receive(B, beat(0, "t"), now=1.2)) == [(B, Error), (A, Welcome)]
    assert set(core.trainers) == {A}
    # The holder was a closed loader: the probe's send failed, and the next hello is admitted.
    core.peer_gone(A)
    assert kinds(core.receive(B, hello("t"), now=2.0)) == [(B, Welcome)]
    # A silent holder does not keep its id either.
    assert kinds(core.receive(C, hello("t"), now=2.0 + TRAINER_TIMEOUT + 0.1)) == [(C, Welcome)]


def test_a_ranked_holder_kept_through_an_outage_does_not_hold_off_its_id() -> None:
    core = make_core()
    core.begin()
    core.receive(A, Hello(client_id="r", rank=0, world_size=1), now=0.0)
    core.tick(0.2)
    core.tick(0.3)
    assert core.phase is Phase.SAMPLING
    core.unreachable(A, now=0.5)  # its control link is down: it keeps its rank ...
    assert A in core.trainers
    # ... but not its id against a newcomer (its rank is decided as before).
    assert not any(isinstance(message, Error) and "client_id" in message.message
                   for _, message in core.receive(B, Hello(client_id="r", rank=0, world_size=1),
                                                  now=1.0))


def test_a_batch_that_cannot_be_built_is_the_error_of_the_trainer_it_was_for() -> None:
    core = make_core()
    core.receive(A, hello("t"), now=0.0)
    core.receive(B, hello("u"), now=0.0)
    sends = core.refuse_batch("u", "no stack")
    assert kinds(sends) == [(B, Error)]
    message = sends[0][1]
    assert isinstance(message, Error) and message.type == "feedmux.errors.DataError"
    assert core.final_message is None  # the server goes on
    assert make_core().refuse_batch("u", "no stack") == []
