"""How many worker processes draw at once: turns to sample, shared across the fork.

``--workers auto`` (and ``feedmux scale``) changes how many workers sample, and a
change must take effect within a bounded time that does not depend on the
epoch's length. Moving a shard to another process cannot do that: a user's
generator has no state that crosses processes, so the new owner would have to
draw the shard again up to where the server stands. So a shard never moves for a
change of the count: every worker process keeps the shards it was given for the
whole run, and the count is the number of **turns**, how many processes may draw
at once. A change of the count takes effect when the running draws end their
current message (one message of at most a merge block: milliseconds), whatever
the epoch.

:class:`SamplingTurns` lives in memory shared by the fork: the count, which slot
holds a turn, the place in the merge order each waiting slot would draw next,
and one semaphore per slot to wake it. A slot that wants to draw takes a free
turn (:meth:`SamplingTurns.hold`); one that has held its turn for
:data:`TURN_SLICE` while others wait hands it, at the end of a merge block, to the
waiting slot furthest behind in the merge order (the merge waits for that one), so
no shard starves; a slot
that would block (its queue to the server full, its epoch not released) gives
its turn back. With at least as many turns as slots, nothing is shared or
waited on: ``--workers N`` pays nothing. No lock is held across processes (a
SIGKILLed worker could hold it): a slot marks itself and checks the count again,
so at worst a turn is briefly over-given, which costs a little CPU and never
correctness (the order is the merge's, not the turns'); the server clears a dead
slot's marks (:meth:`SamplingTurns.forget`). It never samples, never touches a
socket and never decides the count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

__all__ = ["TURN_SLICE", "TURN_WAIT", "SamplingTurns"]

#: How long a slot keeps drawing on its turn while others wait for one.
TURN_SLICE = 0.01
#: The longest a waiting slot sleeps before it looks again (a wake-up it missed,
#: a stop): the wake-ups themselves come at once.
TURN_WAIT = 0.5
_IDLE = math.inf


class SamplingTurns:
    """Turns to draw for ``slots`` worker processes, ``limit`` of them at a time.

    Created before the fork; the server sets the count (:meth:`set_limit`), each
    worker calls :meth:`hold`, :meth:`passing` and :meth:`release` with its own
    slot.

    Examples
    --------
    >>> import multiprocessing
    >>> turns = SamplingTurns(3, 1, multiprocessing.get_context("fork"))
    >>> turns.hold(0, 0.0, lambda: False), turns.holders()
    (True, [0])
    >>> turns.hold(1, 5.0, lambda: True)  # no free turn: it waits (here it stops at once)
    False
    >>> turns.set_limit(2); turns.hold(1, 5.0, lambda: False), turns.holders()
    (True, [0, 1])
    >>> turns.release(0); turns.release(1); turns.holders()
    []
    """

    def __init__(self, slots: int, limit: int, context: Any) -> None:
        self.slots = slots
        self._limit = context.RawValue("i", limit)
        #: 1 while a slot holds a turn.
        self._holding = context.RawArray("b", slots)
        #: Where each waiting slot stands in the merge order (lower: further behind),
        #: infinite for a slot that does not wait.
        self._waiting = context.RawArray("d", [_IDLE] * slots)
        #: When each holder took its turn (its own clock: only it compares).
        self._since = [0.0] * slots
        #: One wake-up per slot, a flag rather than a count (a bounded semaphore held
        #: at 0 or 1): many wake-ups before it looks are one.
        self._wake = [context.BoundedSemaphore(1) for _ in range(slots)]
        for wake in self._wake:
            wake.acquire()

    @property
    def limit(self) -> int:
        """How many slots may draw at once."""
        return int(self._limit.value)

    def set_limit(self, limit: int) -> None:
        """Let ``limit`` slots draw at once (the server's call); waiters look again."""
        self._limit.value = limit
        for slot in range(self.slots):
            if self._waiting[slot] != _IDLE:
                self._signal(slot)

    def holders(self) -> list[int]:
        """The slots that hold a turn now."""
        return [slot for slot in range(self.slots) if self._holding[slot]]

    def free(self) -> bool:
        """Whether every slot may draw without asking (as many turns as slots)."""
        return bool(self._limit.value >= self.slots)

    def hold(self, slot: int, place: float, stopping: Callable[[], bool]) -> bool:
        """Take a turn for ``slot`` (or keep the one it holds); False if ``stopping()``.

        ``place`` is where the slot's next draw stands in the merge order (a
        smaller number comes first): a turn handed on goes to the waiting slot
        with the smallest.
        """
        if self.free():
            return True
        holding, waiting = self._holding, self._waiting
        if holding[slot]:
            return True
        waiting[slot] = place
        try:
            while True:
                if holding[slot]:  # handed to it by a slot whose turn ended
                    break
                if sum(holding) < self._limit.value:
                    holding[slot] = 1
                    if sum(holding) <= self._limit.value:
                        break
                    holding[slot] = 0  # another slot took it at the same moment
                if stopping():
                    return False
                self._wake[slot].acquire(timeout=TURN_WAIT)
        finally:
            waiting[slot] = _IDLE
        self._since[slot] = time.monotonic()
        return True

    def passing(self, slot: int, boundary: bool = True) -> None:
        """After a draw: give the turn back if the count fell below the holders; hand it
        on if ``slot`` held it :data:`TURN_SLICE`, its draw ended a merge block
        (``boundary``) and a slot waits for one (to the waiting slot furthest behind in
        the merge order).

        Not mid-block: the merge cannot pass a shard's unfinished block, so a turn
        handed on mid-block would stall it until the turn came back (slow samples fill
        a block in more than a slice: scenario 4's 1 ms a sample, with 2 turns over 4
        workers, ran 20 % slower than 2 fixed workers)."""
        if self.free() or not self._holding[slot]:
            return
        if sum(self._holding) > self._limit.value:
            self.release(slot)  # fewer turns now: the change takes effect at once
            return
        if not boundary or time.monotonic() - self._since[slot] < TURN_SLICE:
            return
        successor = self._first_waiting(slot)
        if successor is not None:
            self._holding[successor] = 1  # given before it is freed: nobody else takes it
            self._holding[slot] = 0
            self._signal(successor)

    def release(self, slot: int) -> None:
        """Give ``slot``'s turn back (it will not draw for a while); wakes the first waiter."""
        if not self._holding[slot]:
            return
        self._holding[slot] = 0
        successor = self._first_waiting(slot)
        if successor is not None:
            self._signal(successor)

    def rest(self, slot: int, timeout: float = TURN_WAIT) -> None:
        """Sleep until :meth:`wake_all` (or ``timeout``): a slot with nothing to draw
        (its epoch not released yet, its shards done) waits without polling."""
        self._wake[slot].acquire(timeout=timeout)

    def wake_all(self) -> None:
        """Wake every slot (an epoch released, the assignment changed, a stop)."""
        for slot in range(self.slots):
            self._signal(slot)

    def forget(self, slot: int) -> None:
        """A slot that died: its turn and its place in the queue go (the server's call)."""
        self._waiting[slot] = _IDLE
        self.release(slot)

    def _signal(self, slot: int) -> None:
        try:
            self._wake[slot].release()
        except ValueError:  # already signalled and not yet seen
            pass

    def _first_waiting(self, besides: int) -> int | None:
        waiting = self._waiting
        return min((slot for slot in range(self.slots) if slot != besides
                    and waiting[slot] != _IDLE and not self._holding[slot]),
                   key=lambda slot: (waiting[slot], slot), default=None)
