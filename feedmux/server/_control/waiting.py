"""The wait for trainers before sampling starts: who is missing, when they were welcomed.

:class:`TrainerWait` owns the state of the control core's ``WAITING`` phase:
when the waiting trainers were last welcomed (a count only after a welcome
went out since: a send to a trainer that has gone fails and forgets it), since
when the ranks of a job are awaited (for the rank timeout), and which ranks are
missing (logged when that changes). It is pure (``now`` is passed in) and must
never decide where sampling starts (the resume agreement does) nor send
anything (the core returns the sends).
"""

from __future__ import annotations

import logging

from feedmux.server._control.ranks import RankTable

__all__ = ["POLL_INTERVAL", "TrainerWait"]

log = logging.getLogger("feedmux.server")

#: How often the shell looks again while waiting for trainers or repeating the last word.
POLL_INTERVAL = 0.1


class TrainerWait:
    """The wait for ``min_trainers`` free trainers or for every rank of a job.

    Examples
    --------
    >>> wait = TrainerWait()
    >>> wait.welcome_due(1.0), wait.welcome_due(1.05), wait.welcome_due(1.2)
    (True, False, True)
    >>> wait.overdue(5.0, timeout=1.0)  # no rank awaited yet
    False
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A new wait (the server begins, or a ranked job restarted from a checkpoint)."""
        #: When the waiting trainers were last welcomed (None: not since the wait began).
        self.welcomed_at: float | None = None
        self.since: float | None = None
        self.missing: list[int] | None = None

    def welcome_due(self, now: float) -> bool:
        """Whether to welcome the waiting trainers now (noted as done).

        Every control message that arrives ticks the core: welcoming every
        trainer at each would be trainers x messages sends (256 trainers: tens
        of thousands a second, their queues full, and the server forgetting
        them for it).
        """
        if self.welcomed_at is not None and now - self.welcomed_at < POLL_INTERVAL:
            return False
        self.welcomed_at = now
        return True

    def ready(self, ranks: RankTable, connected: int, min_trainers: int, now: float) -> bool:
        """Whether the trainers needed to start sampling are connected (``connected``
        free ones; or every rank of ``ranks``), counted only after a welcome went out."""
        if self.welcomed_at is None:
            return False
        if not ranks.ranked:
            return connected >= max(1, min_trainers)
        missing = ranks.missing()
        if self.since is None:
            self.since = now
        if missing != self.missing:
            self.missing = missing
            if missing:
                log.info("waiting for rank(s) %s of %d to connect", missing, ranks.world_size)
        return not missing

    def overdue(self, now: float, timeout: float) -> bool:
        """Whether the ranks have been awaited for longer than ``timeout`` seconds."""
        return self.since is not None and now - self.since > timeout
