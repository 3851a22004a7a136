"""The consumer groups' shell: sends each buffered message to every group, one member each.

:class:`GroupFanout` owns the sends of a server in group mode: it takes each
encoded message from the sampler into the shared :class:`GroupBuffer`, and
pumps — every group's next messages go to the group's live members, whichever
has room in its queue (free dealing inside a group), with non-blocking
addressed sends on the data ROUTER. While the buffer is full it waits, serving
the control socket, and names the group that lags in the log. Membership comes
from the control core's trainer registry (each trainer's hello names its
group); this module must never decide anything about trainers or the end of
the stream, and never keeps frames beyond what the buffer holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from feedmux.server._core import TRAINER_TIMEOUT, ControlCore
from feedmux.server._groups import BufferedMessage, GroupBuffer, parse_group_buffer
from feedmux.server._producer import Frames
from feedmux.server.config import ServerConfig

__all__ = ["GroupFanout"]

log = logging.getLogger("feedmux.server")

#: Seconds between two log lines naming the same group as the one holding the sampler back.
LAG_LOG_INTERVAL = 5.0


def _nbytes(frames: Frames) -> int:
    total = 0
    for frame in frames:
        size = getattr(frame, "nbytes", None)
        total += int(size) if size is not None else len(frame)
    return total


class GroupFanout:
    """Sends one sampled stream to every consumer group of a server.

    ``wait(timeout)`` serves the control socket for up to ``timeout`` seconds;
    ``stopping()``
    says whether the server is shutting down.
    """

    def __init__(self, config: ServerConfig, data: Any, core: ControlCore,
                 wait: Callable[[float], object], stopping: Callable[[], bool]) -> None:
        max_messages, max_bytes = parse_group_buffer(config.group_buffer or 0)
        self.buffer = GroupBuffer(max_messages, max_bytes, config.join, config.group_timeout)
        self.data = data
        self.core = core
        self.wait = wait
        self.stopping = stopping
        self._turns: dict[str, int] = {}
        #: Bytes of the messages delivered to the groups (each delivery counts).
        self.bytes_sent = 0
        #: Seconds the sampler waited for the groups (the buffer full, or no group).
        self.blocked_seconds = 0.0
        self._last_lag_log = 0.0
        self._last_lagging: str | None = None

    # -- the sampler's side -----------------------------------------------------------------
    def send(self, frames: Frames, n_samples: int, epoch: int) -> bool:
        """Buffer one message and deliver what the groups can take; False when stopping.

        Waits (serving control) while the buffer is full, and while no group
        exists at all (nobody would receive the message).
        """
        buffer = self.buffer
        blocked_since = 0.0
        while True:
            self.pump()
            if not buffer.full and buffer.groups:
                break
            if not blocked_since:
                blocked_since = time.perf_counter()
            if self.stopping():
                self.blocked_seconds += time.perf_counter() - blocked_since
                return False
            self._log_lag()
            self._wait()
        if blocked_since:
            self.blocked_seconds += time.perf_counter() - blocked_since
        buffer.append(frames, n_samples, epoch, _nbytes(frames))
        self.pump()
        return True

    def epoch_finished(self, epoch: int) -> None:
        self.buffer.epoch_finished(epoch)

    def flush(self, deadline: float) -> bool:
        """Deliver every buffered message to every group (until ``deadline``); True if done."""
        while not self.stopping() and time.monotonic() < deadline:
            self.pump()
            if self.buffer.drained:
                return True
            self._log_lag()
            self._wait()
        lagging = self.buffer.lagging()
        if lagging is not None:
            log.warning("ending with %d buffered message(s) undelivered to group %s",
                        self.buffer.behind(lagging), lagging)
        return lagging is None

    def _wait(self) -> None:
        """Serve control while the members' queues are full.

        Briefly (1 ms) while a group has a message pending for live members: a
        ROUTER's writability says that *some* peer has room, not that this
        group's has, so polling for it would either spin or sleep through the
        moment a member's queue drains. Otherwise up to 0.1 s (nobody to send to).
        """
        pending = any(self.buffer.behind(name) and group.members
                      for name, group in self.buffer.groups.items())
        self.wait(0.001 if pending else 0.1)

    # -- delivery ---------------------------------------------------------------------------
    def pump(self) -> None:
        """Send each group as many of its next messages as its members have room for."""
        now = time.monotonic()
        members = self._members(now)
        buffer = self.buffer
        for name in members:
            buffer.join(name, now)
        for name in list(buffer.groups):
            targets = members.get(name, [])
            buffer.set_members(name, len(targets), now)
            while targets:
                message = buffer.next_for(name)
                if message is None or not self._deliver(name, message, targets):
                    break
        for name in buffer.expire(now):
            log.warning("group %s dropped: no member for %g s; it no longer holds the "
                        "sampler back", name, buffer.group_timeout)

    def _deliver(self, name: str, message: BufferedMessage, targets: list[bytes]) -> bool:
        """Send ``message`` to the next member of ``name`` with room; False if none has."""
        turn = self._turns.get(name, 0)
        data = self.data
        count = len(targets)
        for step in range(count):
            identity = targets[(turn + step) % count]
            try:
                data.send_multipart([identity, *message.frames], flags=zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                # Again: its queue is full; EHOSTUNREACH: not connected (yet, or any more).
                continue
            self._turns[name] = (turn + step + 1) % count
            self.buffer.delivered(name)
            self.bytes_sent += message.nbytes
            self.core.data_sent(message.n_samples, message.epoch)
            return True
        return False

    def _members(self, now: float) -> dict[str, list[bytes]]:
        """Each group's live trainers, by data-socket identity."""
        groups: dict[str, list[bytes]] = {}
        for trainer in self.core.trainers.values():
            if now - trainer.last_seen <= TRAINER_TIMEOUT:
                groups.setdefault(trainer.group, []).append(trainer.client_id.encode())
        return groups

    def _log_lag(self) -> None:
        now = time.monotonic()
        lagging = self.buffer.lagging()
        if lagging is None or (lagging == self._last_lagging
                               and now - self._last_lag_log < LAG_LOG_INTERVAL):
            return
        self._last_lag_log, self._last_lagging = now, lagging
        log.info("group %s lags: %d message(s) behind, holding the sampler back", lagging,
                 self.buffer.behind(lagging))

    def stats(self) -> dict[str, int | str | None]:
        return self.buffer.stats()
