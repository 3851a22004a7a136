"""A run with several claims (one message to a member of each consumer group), no sockets.

The server places a message once (SHARED), hands each trainer it goes to a claim
cell of its own, and gives the placement up when no group will be sent it; each
trainer's view claims and releases its own cell. The accounting must never free a
run a live trainer still views, never leak one, and give back a dead trainer's cells
only, whatever the order of shares, hand-outs, releases, deaths and reclaims.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedmux._plumbing import shmtable
from feedmux._plumbing.shm import Placement, ShmPool
from feedmux._plumbing.shmtable import CLAIMS, REF, SHARED, split_count
from feedmux._plumbing.shmviews import ShmViews
from feedmux.protocol import Data, decode, encode

MIB = 1 << 20
#: Values of one array of one granule (256 KiB of float32).
GRANULE_VALUES = 1 << 16


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ShmPool]:
    created = ShmPool.create(4 * MIB, directory=str(tmp_path))  # 16 granules of 256 KiB
    assert created is not None
    yield created
    created.close()


def share(pool: ShmPool, value: float, arrays: int = 1) -> Placement | None:
    samples = [{f"x{index}": np.full(GRANULE_VALUES, value, np.float32)
                for index in range(arrays)}]
    return pool.place(encode(Data(np.array([[1, int(value)]]), samples)), state=SHARED)


def trainer(pool: ShmPool, pid: int | None = None) -> ShmViews:
    """A trainer's views of the pool; ``pid`` plays another process's (its claims' owner)."""
    views = ShmViews()
    views.attach(pool.path)
    if pid is not None:
        views.attachments[pool.segment.segment_id].pid = pid
    return views


def hand_to(pool: ShmPool, placed: Placement, views: ShmViews, name: bytes) -> list[Any]:
    """The server hands ``placed`` to a trainer, which decodes it: its arrays, viewed."""
    wire = pool.shared.hand(placed)
    assert wire is not None
    pool.delivered(name, placed)
    message = decode(wire, resolve=views)
    assert isinstance(message, Data)
    return list(message.samples[0].values())


def offset(views: ShmViews, pool: ShmPool, array: np.ndarray) -> int:
    """Where ``array`` (a trainer's view) lies in the pool's data area."""
    return int(array.ctypes.data) - views.attachments[pool.segment.segment_id].segment.base


def in_use(pool: ShmPool) -> int:
    pool.reclaim()
    return pool.stats()["shm_bytes_in_use"]


def test_each_trainer_gets_a_view_of_the_same_run_and_it_is_free_after_the_last(
        pool: ShmPool) -> None:
    placed = share(pool, 3.0)
    assert placed is not None and placed.shared
    first, second = trainer(pool), trainer(pool)
    a = hand_to(pool, placed, first, b"group-a")[0]
    b = hand_to(pool, placed, second, b"group-b")[0]
    # One copy in the pool, two views of it (each trainer maps the segment on its own).
    assert offset(first, pool, a) == offset(second, pool, b)
    assert (a == 3.0).all() and (b == 3.0).all() and pool.stats()["shm_bytes_copied"] == MIB / 4
    del a
    assert in_use(pool) == MIB // 4  # b still holds it
    pool.shared.unshare(placed)  # no further group will be sent it
    assert in_use(pool) == MIB // 4
    del b
    assert in_use(pool) == 0


def test_the_run_stays_while_the_groups_buffer_may_still_send_it(pool: ShmPool) -> None:
    placed = share(pool, 1.0)
    assert placed is not None
    first, second = trainer(pool), trainer(pool)
    view = hand_to(pool, placed, first, b"a")
    del view  # the first group's member released it: the lagging group has yet to get it
    assert in_use(pool) == MIB // 4
    for value in range(2, 12):  # other messages pass through the pool meanwhile
        other = share(pool, float(value))
        assert other is not None
        pool.shared.unshare(other)
    late = hand_to(pool, placed, second, b"b")[0]
    assert (late == 1.0).all()
    pool.shared.unshare(placed)
    del late
    assert in_use(pool) == 0


def test_a_claim_cell_handed_but_never_sent_is_free_when_the_message_goes(
        pool: ShmPool) -> None:
    placed = share(pool, 2.0)
    assert placed is not None
    assert pool.shared.hand(placed) is not None  # the send found every queue full
    pool.shared.unshare(placed)
    assert in_use(pool) == 0


def test_references_name_their_claim_and_past_the_last_cell_the_message_goes_whole(
        pool: ShmPool) -> None:
    placed = share(pool, 4.0)
    assert placed is not None
    claims = []
    for claim in range(1, CLAIMS + 1):
        wire = pool.shared.hand(placed)
        assert wire is not None
        assert split_count(REF.unpack(wire[2])[3]) == (1, claim)
        pool.delivered(b"t%d" % claim, placed)
        claims.append(claim)
    assert pool.shared.hand(placed) is None  # the carrier sends it whole then
    pool.shared.unshare(placed)
    pool.orphan_timeout = -1.0  # none of those cells was claimed: orphans at once
    pool.reclaim()
    assert pool.stats()["shm_bytes_in_use"] == 0


def test_a_reference_naming_a_claim_past_the_last_cell_is_refused(pool: ShmPool) -> None:
    placed = share(pool, 5.0)
    assert placed is not None
    wire = pool.shared.hand(placed)
    assert wire is not None
    fields = list(REF.unpack(wire[2]))
    fields[3] = 1 | (CLAIMS + 1) << 32
    with pytest.raises(Exception, match=r"claim 9\) does not fit"):
        decode([*wire[:2], REF.pack(*fields)], resolve=trainer(pool))


def _hold_then_wait(path: str, frames: list[bytes], ready: Any) -> None:
    """A forked trainer: claims its cell of the shared message, then waits to be killed."""
    views = ShmViews()
    views.attach(path)
    message = decode(frames, resolve=views)
    assert isinstance(message, Data)
    held = message.samples[0]["x0"]
    ready.send(float(held[0]))
    signal.pause()  # holds the view until the SIGKILL


def test_a_sigkilled_trainers_claim_comes_back_while_the_other_trainer_keeps_the_run(
        pool: ShmPool) -> None:
    placed = share(pool, 7.0)
    assert placed is not None
    views = trainer(pool)  # a loader keeps its views' attachment as long as it runs
    survivor = hand_to(pool, placed, views, b"group-a")[0]
    wire = pool.shared.hand(placed)
    assert wire is not None
    pool.delivered(b"group-b", placed)
    # The other group's member is a real process: it claims its cell and is SIGKILLed.
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    doomed = context.Process(target=_hold_then_wait,
                             args=(pool.path, [bytes(frame) for frame in wire], child))
    doomed.start()
    try:
        assert parent.poll(30), "the doomed trainer did not claim its view"
        assert parent.recv() == 7.0
        pool.shared.unshare(placed)
        assert in_use(pool) == MIB // 4
        assert doomed.pid is not None
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.join(30)
        assert in_use(pool) == MIB // 4  # the survivor's view holds it still
        assert (survivor == 7.0).all()
        del survivor
        assert in_use(pool) == 0  # and the dead trainer's cell is back: nothing leaks
    finally:
        if doomed.is_alive():
            doomed.kill()
            doomed.join(10)


# -- any order of shares, hand-outs, releases, deaths and reclaims ------------------------------

TRAINERS = 3
HANDS = st.tuples(st.just("hand"), st.integers(0, 3), st.integers(0, TRAINERS - 1),
                  st.booleans())
OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("share"), st.integers(1, 3)),
    HANDS, HANDS, HANDS,  # hand-outs three times as often: several claims per run
    st.tuples(st.just("release"), st.integers(0, TRAINERS - 1), st.integers(0, 7)),
    st.tuples(st.just("unshare"), st.integers(0, 3)),
    st.tuples(st.just("kill"), st.integers(0, TRAINERS - 1)),
    st.tuples(st.just("reclaim")),
), max_size=40)


class Model:
    """The pool, the trainers (each playing a process of its own pid) and what they view."""

    def __init__(self, pool: ShmPool) -> None:
        self.pool = pool
        self.messages: list[tuple[Placement, float, bool]] = []  # placement, value, shared
        self.dead: set[int] = set()
        self.next_pid = 4_000_000
        self.trainers = [self._start() for _ in range(TRAINERS)]
        #: Per trainer: each view it holds, its value and the run it lies in.
        self.held: list[list[tuple[np.ndarray, float, int]]] = [[] for _ in range(TRAINERS)]
        self.graveyard: list[Any] = []  # a killed trainer's views: never released

    def _start(self) -> ShmViews:
        self.next_pid += 1
        return trainer(self.pool, self.next_pid)

    def pid_alive(self, pid: int) -> bool:
        return pid not in self.dead

    def run(self, operation: tuple[Any, ...]) -> None:
        kind = operation[0]
        if kind == "share":
            placed = share(self.pool, float(len(self.messages) + 1), operation[1])
            if placed is not None:
                self.messages.append((placed, float(len(self.messages) + 1), True))
        elif kind == "hand" and self.messages:
            _, index, who, sent = operation
            placed, value, shared = self.messages[-1 - index % len(self.messages)]
            wire = self.pool.shared.hand(placed) if shared else None
            if wire is not None and sent:  # else: its send failed, a retry comes next
                self.pool.delivered(b"t%d" % who, placed)
                message = decode(wire, resolve=self.trainers[who])
                assert isinstance(message, Data)
                views, granule = self.trainers[who], self.pool.segment.granule
                self.held[who] += [(array, value, offset(views, self.pool, array) // granule)
                                   for array in message.samples[0].values()]
        elif kind == "release" and self.held[operation[1]]:
            views = self.held[operation[1]]
            del views[operation[2] % len(views)]
        elif kind == "unshare" and self.messages:
            index = operation[1] % len(self.messages)
            placed, value, shared = self.messages[index]
            if shared:
                self.pool.shared.unshare(placed)
                self.messages[index] = (placed, value, False)
        elif kind == "kill":
            who = operation[1]
            self.dead.add(self.trainers[who].attachments[self.pool.segment.segment_id].pid)
            self.graveyard += [self.trainers[who], self.held[who]]
            self.trainers[who], self.held[who] = self._start(), []
        elif kind == "reclaim":
            self.pool.reclaim()

    def check_nothing_viewed_was_freed(self) -> None:
        """After a look for released runs and dead trainers, every live view's run is
        still allocated and unchanged."""
        self.pool.reclaim()
        books = self.pool.books
        for views in self.held:
            for array, value, head in views:
                assert head in books.runs, f"run {head} freed under a live trainer's view"
                assert (array == value).all(), f"run {head} reused under a live trainer's view"

    def check_nothing_leaks(self) -> None:
        for placed, _, shared in self.messages:
            if shared:
                self.pool.shared.unshare(placed)
        self.held = [[] for _ in range(TRAINERS)]
        self.pool.reclaim()
        assert self.pool.stats()["shm_bytes_in_use"] == 0, "runs left that nothing alive holds"
        assert not self.pool.books.runs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPERATIONS)
def test_any_order_never_frees_a_held_run_and_never_leaks_one(
        operations: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        pool = ShmPool.create(4 * MIB, directory=directory)
        assert pool is not None
        model = Model(pool)
        try:
            with mock.patch.object(shmtable, "pid_alive", model.pid_alive):
                for operation in operations:
                    model.run(operation)
                    model.check_nothing_viewed_was_freed()
                model.check_nothing_leaks()
        finally:
            model.graveyard.clear()
            pool.close()
