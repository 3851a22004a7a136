"""The trainer's link state with no sockets: control messages, data and ticks in, actions out."""

from __future__ import annotations

import doctest
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.client import _link
from feedmux.client._link import Grant, Resync, Send, ServerLinks
from feedmux.errors import (
    ConfigurationError,
    RemoteError,
    TransportError,
    TransportTimeoutError,
    VersionMismatchError,
)
from feedmux.protocol import (
    INFLATES,
    RESUME_LIVE,
    Drain,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Stats,
    Welcome,
)

INTERVAL = 1.0


def make_links(
    count: int = 1, *, timeout: float | None = None, world_size: int = 1
) -> ServerLinks:
    return ServerLinks(
        [f"tcp://h:{10 * i}" for i in range(count)],
        [f"tcp://h:{10 * i + 1}" for i in range(count)],
        client_id="trainer", world_size=world_size, timeout=timeout,
        heartbeat_interval=INTERVAL,
    )


def welcome(server_id: str, **fields: Any) -> Welcome:
    """A current server's welcome: it deals by credit."""
    return Welcome(server_id, reliable=True, **fields)


def heartbeat(link: int, received: int) -> Send:
    return Send(link, Heartbeat(sender_id="trainer", received_messages=received))


def test_the_examples_run() -> None:
    result = doctest.testmod(_link, raise_on_error=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_hello_goes_to_every_server() -> None:
    assert make_links(2, world_size=4).hello() == [
        Send(index, Hello(client_id="trainer", world_size=4, codecs=INFLATES)) for index in (0, 1)
    ]


def test_a_welcome_says_who_the_server_is() -> None:
    links = make_links(2)
    # The first welcome admits the trainer: it grants its credit then.
    assert links.control(1, welcome("b", epoch_size=7, workers=3)) == [Grant(1)]
    assert links.server_ids == ["", "b"]
    assert links.links[1].workers == 3
    assert links.epoch_size is None  # the first server has not answered yet
    links.control(0, welcome("a", epoch_size=5))
    assert links.epoch_size == 12


def test_a_plain_server_an_older_feedmux_is_an_error() -> None:
    links = make_links()
    with pytest.raises(TransportError, match=r"expected a server that deals by credit .*, "
                                             r"got one with plain delivery .*older feedmux"):
        links.control(0, Welcome("a", reliable=False))


def test_a_new_server_id_on_a_link_is_a_restart(caplog: pytest.LogCaptureFixture) -> None:
    links = make_links()
    # The new process knows the trainer by its hello only: it says hello again, and the
    # loader drops its pending acknowledgement and grants its credit again (Resync).
    actions = [Resync(0), Send(0, Hello(client_id=links.client_id, codecs=INFLATES))]
    # The first welcome admits the trainer: it grants its credit then.
    assert links.control(0, welcome("a")) == [Grant(0)]
    assert links.control(0, welcome("a", epoch_size=3)) == []  # not a restart
    links.control(0, EndOfStream("a"))
    assert links.finished
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        assert links.control(0, welcome("b")) == actions
    assert "restarted: server id b, before a" in caplog.text
    assert not links.finished  # the new process serves a new stream
    assert links.server_ids == ["b"]


def test_a_drain_is_answered_with_the_messages_of_that_server() -> None:
    links = make_links()
    links.control(0, welcome("a"))
    for _ in range(3):
        links.data("a", first_epoch=1, now=0.0)
    assert links.control(0, Drain(sent_messages=3, server_id="a")) == [heartbeat(0, 3)]
    assert links.control(0, Drain(sent_messages=0, server_id="gone")) == [heartbeat(0, 0)]


def test_data_from_an_unknown_server_says_hello_again_once() -> None:
    links = make_links(2)
    links.control(0, welcome("a"))
    assert links.data("a", first_epoch=1, now=0.0) == ()
    hellos = links.hello()
    assert links.data("restarted", first_epoch=1, now=0.0) == hellos
    assert links.data("restarted", first_epoch=1, now=0.0) == ()
    assert links.received == {"a": 1, "restarted": 2}


def test_heartbeats_are_due_once_per_interval() -> None:
    links = make_links(2)
    links.control(0, welcome("a"))
    links.data("a", first_epoch=1, now=0.0)
    assert links.tick(0.0) == [heartbeat(0, 1), heartbeat(1, 0)]
    assert links.tick(0.5) == ()
    assert links.tick(0.999) == ()
    assert links.tick(1.0) == [heartbeat(0, 1), heartbeat(1, 0)]


def test_a_second_epoch_without_a_size_asks_at_once() -> None:
    links = make_links()
    links.control(0, welcome("a"))
    links.tick(0.0)
    links.data("a", first_epoch=1, now=0.1)
    assert links.tick(0.2) == ()
    links.data("a", first_epoch=2, now=0.3)
    assert links.tick(0.3) == [heartbeat(0, 2)]
    links.control(0, welcome("a", epoch_size=4))
    links.data("a", first_epoch=3, now=0.4)
    assert links.tick(0.5) == ()  # the size is known: nothing to ask


def test_end_of_stream_on_the_control_socket() -> None:
    links = make_links(2)
    links.control(0, EndOfStream("a"))  # before the welcome: the server finished first
    assert links.links[0].finished and not links.finished
    links.control(1, welcome("b"))
    links.control(1, EndOfStream(""))
    links.control(1, EndOfStream("older"))
    assert not links.links[1].finished
    links.control(1, EndOfStream("b"))
    assert links.finished


def test_end_of_stream_on_the_data_socket() -> None:
    links = make_links(2)
    links.data_end_of_stream(0, "")
    links.control(1, welcome("b"))
    links.data_end_of_stream(1, "older")
    assert links.links[0].finished and not links.links[1].finished
    links.data_end_of_stream(1, "b")
    assert links.finished


def test_a_server_error_is_raised_with_its_traceback() -> None:
    links = make_links()
    with pytest.raises(RemoteError) as raised:
        links.control(0, Error("ValueError", "bad sample", "Traceback ...", server_id=""))
    assert raised.value.remote_type == "ValueError"
    assert raised.value.remote_traceback == "Traceback ..."
    assert raised.value.server == "tcp://h:1"  # no server id: the control endpoint names it
    with pytest.raises(VersionMismatchError, match=r"expected protocol version 1, got 7 "
                                                   r"\(server tcp://h:1\)"):
        links.control(0, Error("feedmux.errors.VersionMismatchError",
                               "expected protocol version 1, got 7"))


def test_other_control_messages_change_nothing() -> None:
    links = make_links()
    assert links.control(0, Heartbeat("server")) == []
    assert links.control(0, Stats({"samples_sent": 1})) == []
    assert links.server_ids == [""] and not links.finished


def test_waiting_is_bounded_by_the_heartbeat_and_the_timeout() -> None:
    assert make_links().wait(0.0, 100.0) == INTERVAL  # no timeout: wait forever, beating
    links = make_links(timeout=2.5)
    assert links.wait(10.0, 10.0) == INTERVAL
    assert links.wait(10.0, 12.0) == pytest.approx(0.5)
    with pytest.raises(TransportTimeoutError,
                       match=r"no data from tcp://h:0 for 2.5 s \(control tcp://h:1 never "):
        links.wait(10.0, 12.5)


def test_length_is_the_share_of_the_epoch() -> None:
    links = make_links(2, world_size=3)
    with pytest.raises(TypeError, match="epoch size is not known yet"):
        links.length()
    links.control(0, welcome("a", epoch_size=5))
    links.control(1, welcome("b", epoch_size=5))
    assert links.length() == 3
    links.control(1, welcome("b", epoch_size=0))
    links.control(0, welcome("a", epoch_size=0))
    assert links.length() == 1


def test_a_silent_control_endpoint_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    links = make_links(2)
    links.control(0, welcome("a"))
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        links.data("a", first_epoch=1, now=100.0)
        links.data("a", first_epoch=1, now=100.0 + _link.CONTROL_SILENCE_WARNING)
        assert not caplog.records  # not yet: the welcome may be on its way
        links.data("a", first_epoch=1, now=101.0 + _link.CONTROL_SILENCE_WARNING)
        links.data("a", first_epoch=1, now=200.0)
    assert [record.getMessage().count("tcp://h:11") for record in caplog.records] == [1]


def test_no_report_once_every_control_endpoint_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    links = make_links()
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        links.data("a", first_epoch=1, now=0.0)
        links.control(0, welcome("a"))
        links.data("a", first_epoch=1, now=1.0)
        links.data("a", first_epoch=1, now=100.0)
    assert not caplog.records


# -- sequences of events ------------------------------------------------------------------
SERVER_IDS = ["s0", "s1", "s2"]


@dataclass(frozen=True)
class Event:
    kind: str  # welcome, data, drain, end, data_end, tick
    link: int
    server_id: str
    epoch_size: int | None = None


def events(links: int) -> st.SearchStrategy[list[Event]]:
    event = st.builds(
        Event,
        kind=st.sampled_from(["welcome", "data", "drain", "end", "data_end", "tick"]),
        link=st.integers(0, links - 1),
        server_id=st.sampled_from([*SERVER_IDS, ""]),
        epoch_size=st.none() | st.integers(0, 50),
    )
    return st.lists(event, max_size=60)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.data())
def test_sequences_of_welcomes_restarts_drains_and_ends(count: int, data: st.DataObject) -> None:
    links = make_links(count)
    received: Counter[str] = Counter()
    server_ids = [""] * count
    finished = [False] * count
    now = 0.0
    for event in data.draw(events(count)):
        now += 0.25
        link = event.link
        if event.kind == "welcome":
            if not event.server_id:
                continue  # a server always has an id
            actions = links.control(link, welcome(event.server_id, epoch_size=event.epoch_size))
            restarted = server_ids[link] not in ("", event.server_id)
            hello = [Send(link, Hello(client_id=links.client_id, codecs=INFLATES))]
            first = [Grant(link)] if not server_ids[link] else []
            assert actions == ([Resync(link), *hello] if restarted else first)
            if restarted:
                finished[link] = False
            server_ids[link] = event.server_id
        elif event.kind == "data":
            new = event.server_id not in received
            actions = links.data(event.server_id, first_epoch=1, now=now)
            received[event.server_id] += 1
            # Hello again exactly at the first message of a server no link knows.
            assert actions == (links.hello() if new and event.server_id not in server_ids
                               else ())
        elif event.kind == "drain":
            assert links.control(link, Drain(0, event.server_id)) == [
                heartbeat(link, received[event.server_id])
            ]
        elif event.kind == "end":
            links.control(link, EndOfStream(event.server_id))
            # An end from an older server process on the same link never counts.
            if event.server_id == server_ids[link] or not server_ids[link]:
                finished[link] = True
        elif event.kind == "data_end":
            links.data_end_of_stream(link, event.server_id)
            if event.server_id in ("", server_ids[link]):
                finished[link] = True
        else:
            due = links.tick(now)
            assert due == () or due == [
                heartbeat(index, received[server_id]) for index, server_id in enumerate(server_ids)
            ]
        assert links.server_ids == server_ids
        assert [link.finished for link in links.links] == finished
        assert links.finished == all(finished)
        assert links.received == dict(received)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 3.0, allow_nan=False), max_size=40))
def test_a_heartbeat_goes_out_at_least_once_per_interval(gaps: list[float]) -> None:
    links = make_links()
    now, last = 0.0, -math.inf
    for gap in gaps:
        now += gap
        if links.tick(now):
            assert now - last >= INTERVAL
            last = now
        else:
            assert now - last < INTERVAL


def test_a_rank_tells_a_restarted_server_where_it_stands() -> None:
    links = make_links()
    links.rank, links.world_size = 1, 2
    links.position = lambda index: (2, 40, 2, RESUME_LIVE)
    links.control(0, welcome("a", world_size=2))
    assert links.control(0, welcome("b", world_size=2)) == [
        Resync(0),  # the rest of the old process's message is dropped: it will come again
        Send(0, Hello(client_id=links.client_id, world_size=2, rank=1,
                      resume=(2, 40, 2, RESUME_LIVE), codecs=INFLATES)),
    ]


def _waiting_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == level and record.name == "feedmux.client"]


def test_a_loader_waiting_for_a_server_warns_after_ten_seconds_then_every_thirty(
        caplog: pytest.LogCaptureFixture) -> None:
    # Before: an INFO line every 10 s, which Python's default logging does not show.
    links = make_links()
    caplog.set_level(logging.INFO, logger="feedmux.client")
    for now in (0.0, 5.0, 9.9):
        links.wait(0.0, now)
    assert _waiting_lines(caplog, logging.WARNING) == []
    for now in (10.0, 15.0, 20.5, 39.9, 40.0, 60.0, 70.0):
        links.wait(0.0, now)
    causes = ("no feedmux serve running there, a wrong host or port, a firewall in between, "
              "or the server busy sampling (a slow first sample)")
    assert _waiting_lines(caplog, logging.WARNING) == [
        f"no answer from data tcp://h:0 / control tcp://h:1 for 10 s: {causes}",
        f"no answer from data tcp://h:0 / control tcp://h:1 for 40 s: {causes}",
        f"no answer from data tcp://h:0 / control tcp://h:1 for 70 s: {causes}",
    ]
    assert _waiting_lines(caplog, logging.INFO) == []
    links.control(0, welcome("s1"))
    links.wait(80.0, 90.0)  # a new wait, the server answers: the likely causes
    assert "server s1 at data tcp://h:0 / control tcp://h:1 answers but has sent no data for " \
        "10 s: it waits for more trainers (--min-trainers)" in \
        _waiting_lines(caplog, logging.WARNING)[-1]


def test_a_timeout_names_a_derived_control_endpoint_as_derived() -> None:
    links = ServerLinks(["tcp://h:5555"], ["tcp://h:5556"], client_id="t", world_size=1,
                        timeout=5.0, heartbeat_interval=1.0, derived=[True])
    # Before: "(servers: tcp://h:5556=never answered)", a port the user never typed.
    with pytest.raises(TransportTimeoutError, match=re.escape(
            "no data from tcp://h:5555 for 5 s (control tcp://h:5556 (derived from the data "
            "endpoint) never answered)")):
        links.wait(0.0, 5.0)


def test_a_trainer_holding_most_of_the_pool_is_told(caplog: pytest.LogCaptureFixture) -> None:
    links = make_links(timeout=10.0)
    mib = 1 << 20
    held = [(3, 100 * mib, 512 * mib)]
    links.views_held = lambda: held[0]
    caplog.set_level(logging.INFO, logger="feedmux.client")
    links.wait(0.0, 3.0)
    assert _waiting_lines(caplog, logging.WARNING) == []  # a fifth of the pool: not the cause
    held[0] = (37, 480 * mib, 512 * mib)
    links.wait(5.0, 7.5)
    warning, = _waiting_lines(caplog, logging.WARNING)
    assert warning.startswith("this trainer holds 37 view(s) of the server's shared memory "
                              "(480 MiB of its 512 MiB pool)")
    assert "RemoteLoader(shm=False)" in warning and "--shm-size" in warning
    with pytest.raises(TransportTimeoutError, match="this trainer holds 37 view"):
        links.wait(5.0, 15.0)


def test_each_heartbeat_carries_the_loops_share_of_waiting() -> None:
    links = make_links(2)
    reports: list[tuple[float, float | None]] = []

    def share(now: float, waiting_from: float | None) -> float | None:
        reports.append((now, waiting_from))
        return 0.25

    links.wait_share = share
    beats = links.tick(1.0, waiting_from=0.5)
    assert [action.message for action in beats if isinstance(action, Send)] == [
        Heartbeat(sender_id="trainer", received_messages=0, wait_fraction=0.25)] * 2
    assert links.tick(1.5) == ()  # not due: the share is not taken
    assert reports == [(1.0, 0.5)]  # one report for every server: the trainer's wait


def test_a_refused_client_id_says_hello_once_more_then_raises_naming_it() -> None:
    links = make_links()
    taken = Error(type="feedmux.errors.ClientIdInUseError",
                  message="client_id 'trainer' is in use by a live trainer of this server")
    assert links.control(0, taken) == []  # maybe this loader's own closed predecessor
    assert links.tick(0.0) == [Send(0, Hello(client_id="trainer", codecs=INFLATES))]
    with pytest.raises(ConfigurationError, match=r"client_id .trainer. is in use .*tcp://h:1\)"):
        links.control(0, taken)
