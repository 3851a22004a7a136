"""Log lines a peer can trigger, rate-limited so that a flood cannot fill the disk.

A malformed message, a streamer that raises on every pull, a refused
handshake: each is worth a line, but an attacker (or a loop) can make
thousands a second. :class:`RateLimitedLog` lets through a burst, then at
most one line per interval per key, and says how many it held back. It owns
no thread and no clock of its own beyond ``time.monotonic`` read at each
call; it never raises out of a logging call site.
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """At most ``burst`` lines, then one per ``interval`` seconds, for each ``key``.

    Examples
    --------
    >>> import logging
    >>> limited = RateLimitedLog(logging.getLogger("doctest"), burst=2, interval=60.0)
    >>> [limited.allow("malformed") for _ in range(4)]
    [True, True, False, False]
    """

    #: Most keys remembered (a peer choosing keys cannot grow this without bound).
    MAX_KEYS = 64

    def __init__(self, logger: logging.Logger, *, burst: int = 10, interval: float = 5.0) -> None:
        self.logger = logger
        self.burst = burst
        self.interval = interval
        # key -> [lines left in the burst, time of the last line, lines held back]
        self._state: dict[str, list[Any]] = {}

    def allow(self, key: str) -> bool:
        """Whether a line under ``key`` may be logged now (counts it either way)."""
        now = time.monotonic()
        state = self._state.get(key)
        if state is None:
            if len(self._state) >= self.MAX_KEYS:
                self._state.clear()
            state = self._state[key] = [self.burst, float("-inf"), 0]
        if state[0] > 0:
            state[0] -= 1
            state[1] = now
            return True
        if now - state[1] >= self.interval:
            state[1] = now
            return True
        state[2] += 1
        return False

    def log(self, level: int, key: str, message: str, *args: Any, **kwargs: Any) -> None:
        """``logger.log(level, message, *args)`` unless ``key`` is over its rate."""
        if not self.allow(key):
            return
        held = self._state[key][2]
        if held:
            self._state[key][2] = 0
            message += " (%d similar line(s) held back)"
            args = (*args, held)
        self.logger.log(level, message, *args, **kwargs)
