"""The statistics reply at any number of trainers: pages that each fit in one control frame.

Driven through the control core with a made-up clock, no sockets: the pages are
encoded as the shell would send them and measured against the frame limit.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux._plumbing.sockets import CONTROL_FRAME_BYTES
from feedmux.protocol import STATS_NEXT_PAGE, Hello, Stats, StatsRequest, Welcome, encode
from feedmux.server._control.core import ControlCore, Phase
from feedmux.server._control.report import STATS_PAGE_BYTES, stats_page
from feedmux.server.config import ServerConfig

#: Well past the ~900 trainers at which one reply passed the frame limit.
TRAINERS = 3000


def crowded_core(trainers: int, id_length: int = 24) -> ControlCore:
    core = ControlCore(ServerConfig(source="unused:source", server_id="srv"), started=0.0)
    for index in range(trainers):
        client_id = f"trainer-{index:06d}".ljust(id_length, "x")
        core.receive(f"id-{index}".encode(), Hello(client_id=client_id, role="trainer",
                                                   rank=-1), now=1.0)
    return core


def pages(core: ControlCore, now: float) -> list[tuple[int, dict[str, object]]]:
    """Every page, as the shell would send it: (encoded bytes, values)."""
    after, out = "", []
    for _ in range(10_000):  # bounded: a page that did not move on fails below
        [(_, reply)] = core.receive(b"stats", StatsRequest(after=after), now=now)
        assert isinstance(reply, Stats)
        size = sum(len(frame) for frame in encode(reply))
        values = dict(reply.values)
        out.append((size, values))
        following = values.pop(STATS_NEXT_PAGE)
        if following is None:
            return out
        assert isinstance(following, str) and following != after
        after = following
    raise AssertionError("the pages never ended")


@pytest.mark.parametrize("id_length", [24, 1024])  # 1024: the longest client id there is
def test_every_page_fits_in_a_control_frame_and_together_they_are_the_whole_map(
        id_length: int) -> None:
    trainers = TRAINERS if id_length < 100 else 200
    core = crowded_core(trainers, id_length)
    full = core.stats(2.0)
    # The map in one reply would not fit: the test is above the limit.
    assert sum(len(frame) for frame in encode(Stats(full))) > CONTROL_FRAME_BYTES
    answered = pages(core, now=2.0)
    assert len(answered) > 1
    assert all(size <= CONTROL_FRAME_BYTES for size, _ in answered), [s for s, _ in answered]
    merged: dict[str, object] = {}
    for _, values in answered:
        assert not set(values) & set(merged), "an entry on two pages"
        merged.update(values)
    assert set(merged) == set(full)
    assert sum(1 for key in merged if key.endswith(".received_messages")) == trainers
    # The first page has the server-wide figures (an old client asks for one page only).
    first = answered[0][1]
    assert {"server_id", "samples_sent", "connected_trainers", "uptime_s"} <= set(first)
    assert first["connected_trainers"] == trainers


def test_a_trainer_that_leaves_between_two_pages_moves_no_other_entry() -> None:
    core = crowded_core(TRAINERS)
    [(_, reply)] = core.receive(b"stats", StatsRequest(), now=2.0)
    assert isinstance(reply, Stats)
    after = reply.values[STATS_NEXT_PAGE]
    assert isinstance(after, str)
    core.peer_gone(b"id-0")  # the first trainer (by key) goes: the next page is unchanged
    [(_, second)] = core.receive(b"stats", StatsRequest(after=after), now=2.0)
    assert isinstance(second, Stats)
    expected = stats_page(core.stats(2.0), after)
    assert second.values == expected and min(k for k in expected if k != STATS_NEXT_PAGE) > after


def test_the_stats_of_a_finished_server_are_still_answered_in_pages() -> None:
    core = crowded_core(TRAINERS)
    core.last_word(core.end_message(), now=2.0)
    assert core.phase is Phase.LAST_WORD
    assert len(pages(core, now=2.1)) > 1
    # Anything else gets the last word.
    [(_, answer)] = core.receive(b"x", Hello(client_id="late"), now=2.2)
    assert not isinstance(answer, (Stats, Welcome))


@settings(max_examples=200, deadline=None)
# The page key is the protocol's own: no statistic is named so (keys are fixed names, or
# trainer.<id>.<figure>).
@given(st.dictionaries(st.text(min_size=1, max_size=40).filter(lambda key: key != STATS_NEXT_PAGE),
                       st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                                 st.text(max_size=60), st.none()), max_size=60),
       st.integers(1, 400))
def test_pages_partition_any_map_within_their_budget(stats: dict[str, object],
                                                     most_bytes: int) -> None:
    after, merged = "", {}
    for _ in range(len(stats) + 1):
        page = stats_page(stats, after, most_bytes)  # type: ignore[arg-type]
        following = page.pop(STATS_NEXT_PAGE)
        body = sum(len(frame) for frame in encode(Stats(page)))  # type: ignore[arg-type]
        assert len(page) == 1 or body <= most_bytes + 64  # 64: the header around the map
        assert not set(page) & set(merged)
        merged.update(page)
        if following is None:
            break
        after = following  # type: ignore[assignment]
    assert merged == stats


def test_the_page_budget_leaves_room_for_the_header() -> None:
    assert STATS_PAGE_BYTES + 4096 < CONTROL_FRAME_BYTES


def test_waiting_trainers_are_welcomed_once_per_look_not_at_every_message() -> None:
    # The shell ticks the core after every control message it takes in. Welcoming every
    # waiting trainer at each tick was trainers x messages sends: with 256 trainers their
    # control queues filled, the server forgot them, and sampling never started.
    core = ControlCore(ServerConfig(source="unused:source", server_id="srv", min_trainers=257),
                       started=0.0)
    core.begin()
    for index in range(256):
        core.receive(f"id-{index}".encode(), Hello(client_id=f"t{index}"), now=1.0)
    welcomes = 0
    for step in range(100):  # 100 messages (and ticks) within 10 ms
        now = 1.0 + step * 0.0001
        core.receive(b"id-0", Hello(client_id="t0"), now=now)
        welcomes += sum(isinstance(message, Welcome) for _, message in core.tick(now))
    assert welcomes == 256
    # A look later, they are welcomed again; and once all are here, sampling starts.
    assert len(core.tick(1.2)) == 256
    core.receive(b"id-256", Hello(client_id="t256"), now=1.25)
    core.tick(1.25)
    assert core.phase is Phase.SAMPLING
