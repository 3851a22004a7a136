"""Consumer groups: one sampled stream, a bounded buffer of its messages, a cursor per group.

This module owns the state of sampling once for several independent jobs: the
bounded buffer of encoded data messages (their frames, kept as they are, so a
message is sent to every group without copying or re-encoding it), each
group's cursor into it, when a group joining mid-stream starts (at the oldest
epoch it can still be given whole, or at once), which group lags when the buffer is full, and the
dropping of a group whose members have all been gone for ``group_timeout``
seconds. It is pure: time and membership are passed in, and it must never
touch a socket, read a clock or decide who inside a group gets a message (the
fan-out shell, :mod:`feedmux.server._delivery.fanout`, does that).

A message leaves the buffer once every *active* group (one with a cursor) has
passed it; a group waiting for its first epoch holds nothing back. A group that
joins mid-stream (join mode ``epoch``) starts at the oldest epoch whose first
message the buffer still holds (another group lags there: the new one gets that
epoch whole at no cost), else at the next epoch the sampler begins; when the
sampler has already begun its last, that is past the stream's end, and the
group gets the end of the stream (the fan-out says so in the log). A ranked
group whose job resumed from a checkpoint starts at the checkpoint's epoch
instead, when the buffer holds its first message or the sampler has not begun
it (:meth:`GroupBuffer.resume`); its ranked stage cuts it at the position.

The buffer is bounded by bytes by default
(:data:`~feedmux.server.config.DEFAULT_GROUP_BUFFER`): a count of messages bounds
nothing when samples are large (256 messages of 16 MiB samples are 4 GiB), while
64 MiB holds thousands of small messages (slack for the groups' jitter) and still
a few large ones; a message larger than the whole buffer goes through alone. It
holds only what some group has yet to receive: up to the limit whenever a group is
slower than the sampler.

The sampler's lead is bounded too, in messages (:data:`MAX_LEAD`): it waits once
it is that many messages ahead of the group furthest along. The bytes bound is
the slack *between* groups; the lead is the slack between the sampler and its
fastest reader. Without it a server whose free trainers (the group ``default``)
read slower than it samples ran ahead by the whole 64 MiB, which is thousands of
epochs of small samples: its rates, its "epoch N sampled" lines and its ETA
described the buffer, not the trainers, and a sampler's state (its position for a
checkpoint, its memory) ran far past what anyone received. 32 messages keep the
sampler busy while a message goes out, as the single queue of a plain server did.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from feedmux.errors import ConfigurationError
from feedmux.server.config import JOIN_MODES

__all__ = [
    "DEFAULT_GROUP",
    "MAX_LEAD",
    "BufferedMessage",
    "GroupBuffer",
    "GroupState",
]

#: The group of a trainer that names none.
DEFAULT_GROUP = "default"

#: How many messages the sampler may run ahead of the group furthest along.
MAX_LEAD = 32
@dataclass
class BufferedMessage:
    """One encoded data message as the sampler made it, sent as is to every group."""

    frames: Sequence[Any]
    n_samples: int
    epoch: int
    nbytes: int
    #: Its large arrays placed once in the shared-memory pool for every group's member
    #: that maps it (a shared placement, given back when the message leaves), or None.
    placed: Any = None


@dataclass
class GroupState:
    """Where one group is in the stream.

    ``cursor`` is the absolute index of the next message for it (None: waiting
    for ``start_epoch`` to begin); ``epoch`` and ``position`` say how far its
    deliveries got (samples of ``epoch`` delivered).
    """

    name: str
    start_epoch: int
    cursor: int | None = None
    epoch: int = 0
    position: int = 0
    delivered_messages: int = 0
    delivered_samples: int = 0
    members: int = 0
    empty_since: float | None = None


class GroupBuffer:
    """The shared buffer of one sampled stream and the groups reading it.

    Examples
    --------
    >>> buffer = GroupBuffer(max_messages=2)
    >>> _ = buffer.join("a", now=0.0)
    >>> buffer.append(["m1"], n_samples=3, epoch=1, nbytes=10)
    >>> buffer.delivered("a")  # m1 leaves the buffer: epoch 1 can no longer be had whole
    >>> _ = buffer.join("b", now=0.0)  # mid-epoch: starts with epoch 2
    >>> buffer.append(["m2"], n_samples=3, epoch=1, nbytes=10)
    >>> buffer.next_for("a").frames, buffer.next_for("b")
    (['m2'], None)
    >>> buffer.delivered("a"); buffer.full
    False
    >>> buffer.epoch_finished(1); buffer.append(["m3"], n_samples=1, epoch=2, nbytes=10)
    >>> buffer.next_for("b").frames
    ['m3']
    >>> # a job resumed from a checkpoint in epoch 2: the buffer holds its first message
    >>> buffer.resume("c", epoch=2, now=0.0).cursor, buffer.next_for("c").frames
    (2, ['m3'])
    >>> buffer.resume("d", epoch=1, now=0.0), buffer.oldest_whole  # epoch 1 is gone
    (None, 2)
    >>> buffer.resume("e", epoch=4, now=0.0).cursor is None  # not sampled yet: it waits
    True
    """

    def __init__(self, max_messages: int = 0, max_bytes: int = 0, join: str = "epoch",
                 group_timeout: float = 10.0,
                 on_leave: Callable[[BufferedMessage], None] | None = None,
                 max_lead: int = MAX_LEAD) -> None:
        if max_messages < 1 and max_bytes < 1:
            raise ConfigurationError(
                f"expected a limit of messages or bytes >= 1, got {max_messages} messages "
                f"and {max_bytes} bytes")
        if join not in JOIN_MODES:
            raise ConfigurationError(f"expected join 'epoch' or 'now', got {join!r}")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        #: Messages the sampler may have appended that no group has received yet.
        self.max_lead = max_lead
        self.join_mode = join
        self.group_timeout = group_timeout
        #: Called with each message as it leaves the buffer (every group passed it).
        self.on_leave = on_leave
        self.groups: dict[str, GroupState] = {}
        self._messages: deque[BufferedMessage] = deque()
        self._base = 0  # the absolute index of _messages[0]
        self._bytes = 0
        self._last_epoch = 0  # the epoch of the last message appended
        self._epoch_open = False  # whether more messages of _last_epoch may come
        #: The absolute index of each epoch's first message (while the buffer holds it).
        self._epoch_starts: dict[int, int] = {}

    # -- the stream -------------------------------------------------------------------------
    @property
    def end(self) -> int:
        """The absolute index the next appended message gets."""
        return self._base + len(self._messages)

    @property
    def full(self) -> bool:
        """Whether the sampler must wait: the slowest active group holds the oldest message
        and the buffer is at its bound, or the sampler is :attr:`max_lead` messages ahead
        of the group furthest along.

        >>> buffer = GroupBuffer(max_bytes=1 << 20, max_lead=2)
        >>> _ = buffer.join("default", now=0.0, at_once=True)
        >>> buffer.append(["m1"], 1, 1, 10); buffer.full
        False
        >>> buffer.append(["m2"], 1, 1, 10); buffer.full  # nobody took m1: 2 ahead
        True
        >>> buffer.delivered("default"); buffer.full
        False
        """
        return self.at_bound or (bool(self._messages) and self.lead >= self.max_lead > 0)

    @property
    def at_bound(self) -> bool:
        """Whether the buffer holds its bound of messages or bytes: a group lags the others
        (or the sampler) by all the slack there is."""
        if not self._messages:
            return False
        return ((self.max_messages > 0 and len(self._messages) >= self.max_messages)
                or (self.max_bytes > 0 and self._bytes >= self.max_bytes))

    @property
    def lead(self) -> int:
        """Messages appended that no active group has received yet."""
        cursors = [g.cursor for g in self.groups.values() if g.cursor is not None]
        return self.end - max(cursors, default=self.end)

    def append(self, frames: Sequence[Any], n_samples: int, epoch: int, nbytes: int,
               placed: Any = None) -> None:
        """The sampler made the next message (of ``epoch``; ``placed``: see
        :attr:`BufferedMessage.placed`)."""
        index = self.end
        if not self._epoch_open or epoch != self._last_epoch:
            self._epoch_starts[epoch] = index
        self._messages.append(BufferedMessage(frames, n_samples, epoch, nbytes, placed))
        self._bytes += nbytes
        self._last_epoch, self._epoch_open = epoch, True
        for group in self.groups.values():
            if group.cursor is None and epoch >= group.start_epoch:
                group.cursor = index
        self._trim()

    def epoch_finished(self, epoch: int) -> None:
        """Every message of ``epoch`` is in: a group joining now starts with the next epoch."""
        if epoch >= self._last_epoch:
            self._last_epoch, self._epoch_open = epoch, False

    def epoch_closed(self, epoch: int) -> bool:
        """Whether every message of ``epoch`` is in the buffer (or has passed through it)."""
        return epoch < self._last_epoch or (epoch == self._last_epoch and not self._epoch_open)

    # -- the groups -------------------------------------------------------------------------
    def join(self, name: str, now: float, at_once: bool = False) -> GroupState:
        """The group ``name`` (created if new: it starts as the join mode says, or with the
        next message ``at_once``: the free trainers there as sampling started)."""
        group = self.groups.get(name)
        if group is not None:
            return group
        whole = self._oldest_whole_epoch()
        if not at_once and self.join_mode == "epoch" and whole is not None:
            group = GroupState(name, start_epoch=whole, cursor=self._epoch_starts[whole])
        elif at_once or self.join_mode == "now" or not self._epoch_open:
            group = GroupState(name, start_epoch=self._last_epoch + (0 if self._epoch_open else 1),
                               cursor=self.end)
        else:
            group = GroupState(name, start_epoch=self._last_epoch + 1)
        group.empty_since = now
        self.groups[name] = group
        return group

    def resume(self, name: str, epoch: int, now: float) -> GroupState | None:
        """The group ``name`` (created if new) starts at ``epoch``, whole from its first
        message: a ranked group's job resumed from a checkpoint in it. Possible while the
        buffer holds that first message, or before the sampler began ``epoch``; None when
        not (:attr:`oldest_whole` says which epoch the group could start at)."""
        group = self.groups.get(name)
        if group is not None:
            return group
        if epoch in self._epoch_starts and self._epoch_starts[epoch] >= self._base:
            group = GroupState(name, start_epoch=epoch, cursor=self._epoch_starts[epoch])
        elif epoch > self._last_epoch:
            group = GroupState(name, start_epoch=epoch)
        else:
            return None
        group.empty_since = now
        self.groups[name] = group
        return group

    @property
    def oldest_whole(self) -> int:
        """The oldest epoch a group can still be given whole: the oldest whose first
        message the buffer holds, else the next one the sampler begins."""
        whole = self._oldest_whole_epoch()
        return self._last_epoch + 1 if whole is None else whole

    def _oldest_whole_epoch(self) -> int | None:
        """The oldest epoch whose first message is still in the buffer, or None."""
        held = [epoch for epoch, index in self._epoch_starts.items() if index >= self._base]
        return min(held, default=None)

    def waiting(self) -> list[str]:
        """The groups that have received nothing yet (their first epoch has not begun, or
        they joined at a boundary and wait for its first message)."""
        return [name for name, group in self.groups.items() if not group.delivered_messages]

    def next_for(self, name: str) -> BufferedMessage | None:
        """The next message for group ``name``, or None if it has them all (or waits)."""
        cursor = self.groups[name].cursor
        if cursor is None or cursor >= self.end:
            return None
        return self._messages[cursor - self._base]

    def delivered(self, name: str) -> None:
        """Group ``name``'s next message has gone to one of its members."""
        group = self.groups[name]
        assert group.cursor is not None
        message = self._messages[group.cursor - self._base]
        group.cursor += 1
        if message.epoch != group.epoch:
            group.epoch, group.position = message.epoch, 0
        group.position += message.n_samples
        group.delivered_messages += 1
        group.delivered_samples += message.n_samples
        if group.cursor - 1 == self._base:
            self._trim()

    def set_members(self, name: str, members: int, now: float) -> None:
        """Group ``name`` has ``members`` live trainers at ``now``."""
        group = self.groups[name]
        group.members = members
        if members:
            group.empty_since = None
        elif group.empty_since is None:
            group.empty_since = now

    def expire(self, now: float) -> list[str]:
        """Drop the groups whose members have all been gone for ``group_timeout`` seconds,
        while another group reads on: a group is dropped so that it holds the others back
        no longer. With none left to read, dropping would only let go of what its members
        (or who comes back to it: the free trainers of a server, the group ``default``)
        have yet to get, so the last groups stay, however long they wait.

        >>> buffer = GroupBuffer(max_messages=4, group_timeout=1.0)
        >>> _ = buffer.join("a", now=0.0); buffer.set_members("a", 0, now=0.0)
        >>> buffer.expire(now=5.0)  # alone: kept
        []
        >>> _ = buffer.join("b", now=5.0); buffer.set_members("b", 1, now=5.0)
        >>> buffer.expire(now=5.0)  # "b" reads: "a" holds it back no longer
        ['a']
        """
        gone = [name for name, group in self.groups.items()
                if group.empty_since is not None and now - group.empty_since >= self.group_timeout]
        if len(gone) == len(self.groups):
            return []
        for name in gone:
            self.drop(name)
        return gone

    def drop(self, name: str) -> None:
        """Group ``name`` no longer reads the stream: what it alone held is let go."""
        del self.groups[name]
        self._trim()

    def clear(self) -> None:
        """Nothing more is sent: every group has passed every message, which leaves.

        >>> buffer = GroupBuffer(max_messages=4, on_leave=lambda message: print(message.frames))
        >>> _ = buffer.join("a", now=0.0); buffer.append(["m"], n_samples=1, epoch=1, nbytes=1)
        >>> buffer.clear()
        ['m']
        """
        for group in self.groups.values():
            group.cursor = self.end
        self._trim()

    def lagging(self) -> str | None:
        """The active group furthest behind (None when no group has a message pending)."""
        behind = [(group.cursor, name) for name, group in self.groups.items()
                  if group.cursor is not None and group.cursor < self.end]
        return min(behind)[1] if behind else None

    def behind(self, name: str) -> int:
        """Messages group ``name`` has yet to receive from the buffer."""
        cursor = self.groups[name].cursor
        return 0 if cursor is None else self.end - cursor

    @property
    def drained(self) -> bool:
        """Whether every active group has every message."""
        return all(g.cursor is None or g.cursor >= self.end for g in self.groups.values())

    def stats(self) -> dict[str, int | str | None]:
        """Flat figures for the server's statistics: the buffer, then each group."""
        figures: dict[str, int | str | None] = {
            "groups": len(self.groups),
            "group_buffer_messages": len(self._messages),
            "group_buffer_bytes": self._bytes,
            "group_buffer_full": int(self.full),
            "group_buffer_lead": self.lead,
            "lagging_group": self.lagging(),
        }
        for name, group in sorted(self.groups.items()):
            key = f"group.{name}."
            figures[key + "epoch"] = group.epoch
            figures[key + "position"] = group.position
            figures[key + "members"] = group.members
            figures[key + "behind_messages"] = self.behind(name)
            figures[key + "delivered_samples"] = group.delivered_samples
            figures[key + "start_epoch"] = group.start_epoch
        return figures

    def _trim(self) -> None:
        """Forget the messages every active group has passed (all of them if none is active)."""
        cursors = [g.cursor for g in self.groups.values() if g.cursor is not None]
        oldest_needed = min(cursors, default=self.end)
        while self._base < oldest_needed and self._messages:
            message = self._messages.popleft()
            self._bytes -= message.nbytes
            self._base += 1
            if self._epoch_starts.get(message.epoch) == self._base - 1:
                del self._epoch_starts[message.epoch]
            if self.on_leave is not None:
                self.on_leave(message)
