"""One wake-up per worker seat, shared across the fork: a worker with nothing to draw sleeps.

A worker whose shards' next epoch is not released yet (or whose shards are all
done) waits without polling until the server releases an epoch, changes the
assignment or stops (:meth:`Wakeups.wake_all`), or at most :data:`REST_WAIT`
(a wake-up it missed, a stop). A wake-up is a flag, not a count (a bounded
semaphore held at 0 or 1): many before the worker looks are one. Made before
the zygote forks; it never samples and never touches a socket.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REST_WAIT", "Wakeups"]

#: The longest a resting worker sleeps before it looks again.
REST_WAIT = 0.5


class Wakeups:
    """``seats`` wake-up flags in memory shared by the fork.

    Examples
    --------
    >>> import multiprocessing
    >>> wakeups = Wakeups(2, multiprocessing.get_context("fork"))
    >>> wakeups.wake_all(); wakeups.wake_all()  # two wake-ups before a look: one
    >>> wakeups.rest(0, timeout=0.0), wakeups.rest(0, timeout=0.0)
    (True, False)
    """

    def __init__(self, seats: int, context: Any) -> None:
        self._wake = [context.BoundedSemaphore(1) for _ in range(seats)]
        for wake in self._wake:
            wake.acquire()

    def rest(self, seat: int, timeout: float = REST_WAIT) -> bool:
        """Sleep until a wake-up for ``seat`` (True) or ``timeout`` (False)."""
        return bool(self._wake[seat].acquire(timeout=timeout))

    def wake_all(self) -> None:
        """Wake every seat (an epoch released, the assignment changed, a stop)."""
        for wake in self._wake:
            try:
                wake.release()
            except ValueError:  # already signalled and not yet seen
                pass
