"""Turns to draw: at most the count at once, handed to the slot furthest behind, no stall.

Threads stand in for worker processes where one process is enough (the turns' shared
memory and semaphores work the same across threads); the limit is checked across real
forked processes too.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest

from feedmux.server._sources import turns as turns_module
from feedmux.server._sources.turns import SamplingTurns
from tests.integration.conftest import wait_until

FORK = multiprocessing.get_context("fork")


def never() -> bool:
    return False


def test_with_a_turn_per_slot_nothing_is_marked_or_waited_on() -> None:
    turns = SamplingTurns(3, 3, FORK)
    assert all(turns.hold(slot, 0.0, never) for slot in range(3))
    assert turns.holders() == []  # free: no slot needs to mark itself
    turns.passing(0)
    turns.release(1)
    assert turns.free() and turns.limit == 3


def test_a_slot_waits_for_a_turn_and_gets_it_when_the_holder_gives_it_back() -> None:
    turns = SamplingTurns(2, 1, FORK)
    assert turns.hold(0, 0.0, never)
    got = threading.Event()

    def second() -> None:
        assert turns.hold(1, 1.0, never)
        got.set()

    waiter = threading.Thread(target=second, daemon=True)
    waiter.start()
    assert not got.wait(0.3), "a second slot drew while the only turn was held"
    turns.release(0)
    assert got.wait(5), "the turn given back did not reach the waiting slot"
    assert turns.holders() == [1]
    waiter.join(5)


def test_a_turn_held_past_its_slice_goes_to_the_waiting_slot_furthest_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns_module, "TURN_SLICE", 0.0)
    turns = SamplingTurns(3, 1, FORK)
    assert turns.hold(0, 0.0, never)
    order: list[int] = []

    def wait_for_turn(slot: int, place: float) -> None:
        assert turns.hold(slot, place, never)
        order.append(slot)

    ahead = threading.Thread(target=wait_for_turn, args=(1, 9.0), daemon=True)
    behind = threading.Thread(target=wait_for_turn, args=(2, 3.0), daemon=True)
    ahead.start()
    behind.start()
    wait_until(lambda: sorted(s for s in range(3) if turns._waiting[s] != float("inf"))
               == [1, 2], 5, "both slots waiting")
    turns.passing(0, boundary=False)  # mid-block: the merge needs the rest of it first
    assert turns.holders() == [0] and order == []
    turns.passing(0)  # the slice is over and two wait: the one at 3.0 comes first
    wait_until(lambda: order == [2], 5, "slot 2 drawing")
    assert turns.holders() == [2]
    turns.release(2)
    wait_until(lambda: order == [2, 1], 5, "slot 1 drawing")
    for thread in (ahead, behind):
        thread.join(5)


def test_a_lower_count_takes_effect_at_the_holders_next_draw() -> None:
    turns = SamplingTurns(3, 3, FORK)
    turns.set_limit(2)
    assert turns.hold(0, 0.0, never) and turns.hold(1, 0.0, never)
    assert turns.holders() == [0, 1]
    turns.set_limit(1)
    turns.passing(1)  # more holders than turns: the first to finish a draw gives it back
    assert turns.holders() == [0]
    turns.passing(0)
    assert turns.holders() == [0]


def slot_1_waiting_behind_slot_0() -> tuple[SamplingTurns, threading.Event, threading.Thread]:
    """One turn, held by slot 0; slot 1 waiting for it in a thread (the event: it got one)."""
    turns = SamplingTurns(2, 1, FORK)
    assert turns.hold(0, 0.0, never)
    got = threading.Event()
    waiter = threading.Thread(target=lambda: turns.hold(1, 0.0, never) and got.set(),
                              daemon=True)
    waiter.start()
    wait_until(lambda: turns._waiting[1] != float("inf"), 5, "slot 1 waiting")
    return turns, got, waiter


def test_a_higher_count_wakes_a_waiting_slot_at_once() -> None:
    turns, got, waiter = slot_1_waiting_behind_slot_0()
    turns.set_limit(2)
    assert got.wait(turns_module.TURN_WAIT / 2), "the new turn waited for a timeout"
    waiter.join(5)


def test_a_dead_slots_turn_is_forgotten_and_goes_to_a_waiter() -> None:
    turns, got, waiter = slot_1_waiting_behind_slot_0()
    turns.forget(0)  # slot 0 died holding its turn
    assert got.wait(5)
    assert turns.holders() == [1]
    waiter.join(5)


def test_a_waiting_slot_that_is_stopped_returns_without_a_turn() -> None:
    turns = SamplingTurns(2, 1, FORK)
    assert turns.hold(0, 0.0, never)
    stop = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(turns.hold(1, 0.0, stop.is_set)),
                              daemon=True)
    waiter.start()
    stop.set()
    waiter.join(5)
    assert result == [False] and turns.holders() == [0]
    assert turns._waiting[1] == float("inf")


def _draw_on_turns(turns: SamplingTurns, slot: int, spans: Any, until: float) -> None:
    """A worker's loop: hold a turn, 'draw' for 2 ms, record the span, pass it on."""
    count = 0
    while time.monotonic() < until and count < 200:
        if not turns.hold(slot, float(count), never):
            continue
        began = time.monotonic()
        time.sleep(0.002)
        ended = time.monotonic()
        spans[slot * 400 + 2 * count] = began
        spans[slot * 400 + 2 * count + 1] = ended
        count += 1
        turns.passing(slot)
    turns.release(slot)


@pytest.mark.timeout(60)
def test_processes_never_draw_more_at_once_than_the_count_and_each_gets_turns() -> None:
    slots, limit = 4, 2
    turns = SamplingTurns(slots, limit, FORK)
    spans = FORK.RawArray("d", slots * 400)
    until = time.monotonic() + 3.0
    workers = [FORK.Process(target=_draw_on_turns, args=(turns, slot, spans, until),
                            daemon=True) for slot in range(slots)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
            assert worker.exitcode == 0
    finally:
        for worker in workers:  # none outlives the test, whatever failed
            if worker.is_alive():
                worker.kill()
                worker.join(5)
    events = []
    for slot in range(slots):
        draws = [(spans[slot * 400 + 2 * i], spans[slot * 400 + 2 * i + 1])
                 for i in range(200) if spans[slot * 400 + 2 * i]]
        assert len(draws) >= 20, f"slot {slot} drew {len(draws)} times in 3 s: starved"
        events += [(began, 1) for began, _ in draws] + [(ended, -1) for _, ended in draws]
    at_once, most = 0, 0
    for _, step in sorted(events, key=lambda event: (event[0], event[1])):
        at_once += step
        most = max(most, at_once)
    assert most == limit
