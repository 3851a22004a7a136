"""The consumer groups' shell: sends each buffered message to every group, split among its members.

:class:`GroupFanout` owns the sends of a server in group mode: it takes each
encoded message from the sampler into the shared :class:`GroupBuffer`, and
pumps — every group's next messages go to the group's live members, each group
an audience of the :class:`~feedmux.server._delivery.dealer.Dealer`. In a group
of free trainers a message goes whole to whichever member has room in its queue
(on a reliable server: the member with credit, kept until acknowledged, and a
killed member's rest dealt again to the group's other members); in a ranked
group (its trainers have ``rank``/``world_size``) each message is decoded once
for the group (a batch stays stacked), dealt among its ranks by the ranked
rule and encoded per rank (:class:`~feedmux.server._delivery.ranking.RankedStage`: pad
or drop, equal steps per rank: row slices), and a restarted rank gets its
predecessor's rest first (:class:`~feedmux.server._delivery.ranksend.RankSender`).
While the buffer is full it waits, serving the control socket, and names the
group that lags in the log. A ranked group with a rank that has had no live
holder for ``rank_timeout`` seconds (it never came, or died and nobody took
over) is given up, as a ranked server gives up a job whose ranks never all
come: its trainers are told why and the group no longer holds the others back.
With the shared-memory pool a message's large arrays are placed once as it enters
the buffer, for a member of each free group to hold a claim on the same runs (the
carrier's :meth:`~feedmux.server._delivery.carrier.Carrier.share`; the buffer gives
the placement back as the message leaves), and a ranked group's shares are placed as
they are dealt. Every server that is not one ranked job's sends through a fan-out,
opened as sampling starts (:mod:`feedmux.server._delivery.paths`): its free trainers
without ``group=`` are the group ``default``, and those there at the start read the
stream from its first message; a named group is one more cursor, whenever its first
trainer comes. Membership comes from the control
core's trainer registry (each trainer's hello names its group and rank); this module
must never decide anything about trainers (but that a given-up group's are gone,
which the core then forgets) or the end of the stream, and never keeps frames beyond
what the buffer holds and a few dealt shares per rank.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from feedmux._plumbing.shm import Placement, carried_bytes, is_ref
from feedmux._plumbing.shmtable import SENT
from feedmux.protocol import Data, Error, decode, encode, read_tags
from feedmux.server._delivery.batches import Batches
from feedmux.server._delivery.carrier import Carrier
from feedmux.server._delivery.dealer import Dealer, FreeAudience, RankAudience
from feedmux.server._delivery.dealing import RankDealer
from feedmux.server._delivery.groups import DEFAULT_GROUP, BufferedMessage, GroupBuffer
from feedmux.server._delivery.outbox import Frames, Wait
from feedmux.server._delivery.ranking import (
    RANK_REFUSED,
    RankedStage,
    RankMessage,
    describe,
    not_whole,
)
from feedmux.server._delivery.registry import FanoutControl, RankHolders, Sends
from feedmux.server.config import ServerConfig

__all__ = ["GroupFanout"]

log = logging.getLogger("feedmux.server")

#: Seconds between two log lines naming the same group as the one holding the sampler back.
LAG_LOG_INTERVAL = 5.0


def _nbytes(frames: Frames) -> int:
    """The bytes a message carries (a sampling worker's reference counts as its array)."""
    total = 0
    for frame in frames:
        if is_ref(frame):
            total += carried_bytes([frame])
            continue
        size = getattr(frame, "nbytes", None)
        total += int(size) if size is not None else len(frame)
    return total


#: Encoded shares a rank of a ranked group may have waiting before its group takes no
#: further message from the buffer (the buffer, not these queues, absorbs a slow group).
RANK_BACKLOG = 2


#: ``unreported(epoch, positions)``: which of an epoch's positions nobody reported handed
#: out (a bool mask), or None: all of them.
Unreported = Callable[[int, np.ndarray], "np.ndarray | None"]

#: A rank's encoded share: frames, samples, epoch, and its placement in the pool (or None).
_Share = tuple[Frames, int, int, Placement | None]


class _RankedGroup:
    """One ranked group's dealing: its ranked stage, and per rank the encoded messages
    its holder has yet to take (:data:`_Share`), each placed in the pool as it is dealt
    (``carrier``: for a rank holder that maps it; never waiting for room)."""

    def __init__(self, world_size: int, uneven: str, audience: RankAudience,
                 carrier: Carrier, server_id: str = "", batches: Batches | None = None,
                 table: RankHolders | None = None) -> None:
        #: The group's rank table this dealing is for (a job restarted from a checkpoint
        #: gets a new one: then this dealing is over). Its job resumed at ``start``: the
        #: stage cuts that epoch there, as for a ranked job of a server of its own.
        self.table = table
        start = None if table is None else table.resumed_at
        self.dealer = RankDealer(world_size, uneven)
        self.stage = RankedStage(self.dealer, server_id, batches=batches, start=start)
        self.audience = audience
        self.carrier = carrier
        self.queues: list[deque[_Share]] = [deque() for _ in range(world_size)]
        self.epoch = 0  # the epoch being dealt
        #: Since when a rank has had no live holder (None: every rank has one).
        self.missing_since: float | None = None

    def overdue(self, missing: list[int], now: float, timeout: float) -> bool:
        """Whether ranks have been ``missing`` (none: all held) for over ``timeout`` s."""
        if not missing:
            self.missing_since = None
        elif self.missing_since is None:
            self.missing_since = now
        return self.missing_since is not None and now - self.missing_since > timeout

    def deal(self, message: BufferedMessage) -> None:
        """Deal the group's next buffered message (an epoch change first ends the last one)."""
        decoded = decode(list(self.carrier.decodable(message.frames)))
        assert isinstance(decoded, Data)
        if message.epoch != self.epoch:
            self.finish_epoch()
            self.epoch = message.epoch
        # Rows, not samples: a batch's stacked arrays are sliced per rank.
        self._queue(self.stage.deal(message.epoch, int(decoded.tags[0, 1]), decoded.samples))

    def finish_epoch(self) -> None:
        """Every message of the epoch was dealt: pad or drop its last, partial round."""
        self._queue(self.stage.finish_epoch(self.epoch))

    def _queue(self, messages: Iterable[RankMessage]) -> None:
        for frames, samples, epoch, rank in messages:
            self.queues[rank].append((frames, samples, epoch, self.carrier.share(frames, SENT)))

    def close(self) -> None:
        """The group is dealt no more: the runs of the shares it had yet to send come back."""
        for queue in self.queues:
            while queue:
                frames, _, _, placed = queue.popleft()
                self.carrier.settle(placed, frames, sent=True)

    @property
    def backlogged(self) -> bool:
        return any(len(queue) >= RANK_BACKLOG for queue in self.queues)

    @property
    def empty(self) -> bool:
        return not any(self.queues)


class GroupFanout:
    """Sends one sampled stream to every consumer group of a server.

    Its sends go through ``dealer`` (each group an audience), its waits (serving
    control) through the dealer's outbox; ``stopping()`` says whether the server
    is shutting down; ``deliver(sends)`` sends control messages (a given-up
    group's errors).
    """

    def __init__(self, config: ServerConfig, dealer: Dealer, core: FanoutControl,
                 stopping: Callable[[], bool], deliver: Callable[[Sends], None],
                 unreported: Unreported | None = None) -> None:
        self.buffer = GroupBuffer(*config.group_limits, config.join, config.group_timeout,
                                  lambda message: dealer.carrier.unshare(message.placed))
        #: The free trainers without a group that were there as sampling started: the
        #: group ``default`` reads the stream from its first message.
        self._continuing = DEFAULT_GROUP if any(
            trainer.group == DEFAULT_GROUP for trainer in core.trainers.values()) else None
        self.dealer = dealer
        self.core = core
        #: A run resumed from the free trainers that outlived the previous server: which
        #: positions of an epoch nobody reported handed out (the sampler drops what the
        #: hellos before sampling reported; a later hello's are dropped here, at the
        #: dealing, for the group default). None: a run that started afresh.
        self.unreported = unreported
        self.stopping = stopping
        self.deliver = deliver
        self.rank_timeout = config.rank_timeout
        self.uneven = config.uneven
        self.server_id = config.server_id
        self.buckets = config.buckets
        self._ranked: dict[str, _RankedGroup] = {}
        #: Each group of free trainers as the dealer's audience, and its live members.
        self._free: dict[str, FreeAudience] = {}
        self._targets: dict[str, list[bytes]] = {}
        self._turns: dict[str, int] = {}
        self._last_lag_log = 0.0
        self._last_lagging: str | None = None

    # -- the sampler's side -----------------------------------------------------------------
    def send(self, frames: Frames, n_samples: int, epoch: int, rank: int = -1) -> bool:
        """Buffer one message and deliver what the groups can take; False when stopping.

        Waits (serving control) while the buffer is full, and while no group
        exists at all (nobody would receive the message). ``rank`` is -1: the
        groups' ranks are dealt here, from the buffer.
        """
        buffer = self.buffer
        # With room in the buffer, one pump after the append does all the sends: pumping
        # before it too would walk every group twice per message for nothing.
        while buffer.full or not buffer.groups:
            self.pump()
            if not buffer.full and buffer.groups:
                break
            if self.stopping():
                return False
            self._log_lag()
            self._wait()  # counts as blocked in the outbox
        # Its large arrays placed in the pool once, for a member of each free group to hold
        # (a ranked group's shares are encoded anew, and placed as they are dealt).
        # A sampling worker's references stay as they are when every group can take them.
        carrier = self.dealer.carrier
        free = any(not self.core.tables.of(name).ranked for name in buffer.groups)
        frames, placed = carrier.share_or_whole(frames) if free else (
            carrier.whole(frames, drop=True), None)
        buffer.append(frames, n_samples, epoch, _nbytes(frames), placed)
        self.pump()
        return True

    def epoch_finished(self, epoch: int) -> None:
        self.buffer.epoch_finished(epoch)

    def flush(self, deadline: float) -> bool:
        """Deliver every buffered message to every group; True if done.

        A named group is waited for until ``deadline``. The group ``default`` (the
        free trainers without a group) is waited for as long as its samples take,
        as the sampler waited for a free trainer before any group had a buffer: the
        sampler runs ahead of it by the buffer, so the end of sampling says nothing
        of how far its trainers got (a DataLoader's next pass may start seconds
        later). A group that has received nothing by the end joined past the
        stream's last whole epoch: it gets the end of the stream, and the log says
        why.
        """
        buffer = self.buffer
        try:
            while not self.stopping():
                self.pump()
                if buffer.drained and all(group.empty for group in self._ranked.values()):
                    return True
                if time.monotonic() >= deadline and not (
                        DEFAULT_GROUP in buffer.groups and buffer.behind(DEFAULT_GROUP)):
                    break
                self._log_lag()
                self._wait()
        finally:
            for name in self.buffer.waiting():
                log.warning("group %s joined after the last epoch it could get whole had "
                            "been sampled (and had left the buffer): it gets the end of the "
                            "stream with no samples; start it earlier, or the server with "
                            "--min-trainers, for it to take part", name)
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
                      for name, group in self.buffer.groups.items()) or not all(
            group.empty for group in self._ranked.values())
        self.dealer.outbox.wait(Wait.BRIEF if pending else Wait.IDLE)

    # -- delivery ---------------------------------------------------------------------------
    def pump(self) -> None:
        """Send each group as many of its next messages as its members have room for."""
        now = time.monotonic()
        members = self.core.live_members(now)
        buffer = self.buffer
        for name, dealing in list(self._ranked.items()):
            if self.core.tables.of(name) is not dealing.table:
                # Its job restarted from a checkpoint: the previous run's dealing is over
                # (the group joins anew, at the checkpoint's epoch).
                self._ranked.pop(name).close()
                if name in buffer.groups:
                    buffer.drop(name)
        for name in members:
            self._join(name, now)
        if self._continuing in buffer.groups:
            self._continuing = None  # once: dropped and back, it joins by the rule
        for name in list(buffer.groups):
            targets = members.get(name, [])
            buffer.set_members(name, len(targets), now)
            self._targets[name] = targets
            ranks = self.core.tables.of(name)
            if ranks.ranked:
                group = self._ranked_group(name, ranks.world_size or 0)
                if not self._given_up(name, group, targets, now):
                    self._pump_ranked(name, group)
                continue
            while targets:
                message = buffer.next_for(name)
                if message is None or not self._deliver(name, message):
                    break
            self._finish_batches(name, buffer.next_for(name))
        for name in buffer.expire(now):
            if (ranked := self._ranked.pop(name, None)) is not None:
                ranked.close()
            self._targets.pop(name, None)
            self.core.tables.forget(name)  # a group that comes back starts afresh
            log.warning("group %s dropped: no member for %g s; it no longer holds the "
                        "sampler back", name, buffer.group_timeout)

    def _join(self, name: str, now: float) -> None:
        """Group ``name`` has members: it reads the stream from where the join rule says,
        or, a ranked group whose job resumed from a checkpoint, from the checkpoint's
        epoch whole (given up, its trainers told why, when the stream cannot give that)."""
        table = self.core.tables.of(name)
        start = table.resumed_at if table.ranked else None
        if name in self.buffer.groups or start is None:
            self.buffer.join(name, now, at_once=name == self._continuing)
            return
        if self.buffer.resume(name, start[0], now) is None:
            # The hello was checked (ControlCore.oldest_whole): the stream moved on since.
            reason = not_whole(name, table.resumed, self.buffer.oldest_whole)
            log.error("%s", reason)
            self._give_up(name, reason, RANK_REFUSED, lost=False)
        else:
            log.info("group %s resumes from %s: it gets epoch %d whole, cut at position %d",
                     name, describe(table.resumed), *start)

    def _ranked_group(self, name: str, world_size: int) -> _RankedGroup:
        group = self._ranked.get(name)
        if group is None:
            tables = self.core.tables
            audience = RankAudience(
                functools.partial(self.core.rank_target, group=name),
                lambda: tables.retention_of(name), lambda: list(tables.of(name).holders),
                self.dealer.rank_sender)
            # The job's batches (its ranks' batch_size=, bucket_by=), cut after the dealing.
            batches = tables.batches_of(name).assemblers(self.buckets)
            group = self._ranked[name] = _RankedGroup(world_size, self.uneven, audience,
                                                      self.dealer.carrier, self.server_id,
                                                      batches, tables.of(name))
        return group

    def _given_up(self, name: str, group: _RankedGroup, targets: list[bytes],
                  now: float) -> bool:
        """Give ranked group ``name`` up if a rank has had no live holder (among its
        members' data identities ``targets``) for ``rank_timeout``; True if it was."""
        table = self.core.tables.of(name)
        missing = [rank for rank in range(group.dealer.world_size)
                   if (holder := table.holder(rank)) is None or holder[1].encode() not in targets]
        if not group.overdue(missing, now, self.rank_timeout):
            return False
        reason = (f"rank(s) {missing} of {group.dealer.world_size} in group {name!r} not "
                  f"connected within the rank timeout of {self.rank_timeout:g} s: the group "
                  f"is given up (it held the other groups back)")
        log.error("%s", reason)
        self._give_up(name, reason, "feedmux.errors.TransportTimeoutError")
        return True

    def _give_up(self, name: str, reason: str, kind: str, lost: bool = True) -> None:
        """Group ``name`` is given up: its trainers are told ``reason`` (an error of type
        ``kind``) and forgotten (what they received still counts for the end of stream;
        ``lost``: logged as lost), and so are its ranks."""
        core = self.core
        error = Error(type=kind, message=reason, server_id=self.server_id)
        members = [identity for identity, trainer in list(core.trainers.items())
                   if trainer.group == name]
        for identity in members:
            core.gave_up(identity, lost)
        core.tables.forget(name)
        self.deliver([(identity, error) for identity in members])
        if name in self.buffer.groups:
            self.buffer.drop(name)
        if (ranked := self._ranked.pop(name, None)) is not None:
            ranked.close()

    def _pump_ranked(self, name: str, group: _RankedGroup) -> None:
        """Deal ranked group ``name``'s next messages and send each rank its shares."""
        buffer = self.buffer
        while True:
            self._send_shares(name, group)
            if group.backlogged:
                return
            message = buffer.next_for(name)
            if message is None:
                if group.epoch and buffer.epoch_closed(group.epoch):
                    group.finish_epoch()  # once: the dealer keeps nothing after
                    self._send_shares(name, group)
                return
            group.deal(message)
            buffer.delivered(name)

    def _send_shares(self, name: str, group: _RankedGroup) -> None:
        for rank, queue in enumerate(group.queues):
            while queue and self.dealer.offer(queue[0][0], queue[0][3], group.audience,
                                              rank) is None:
                frames, n_samples, epoch, placed = queue.popleft()
                self.dealer.carrier.settle(placed, frames, sent=True)  # unless as references
                self.dealer.outbox.count(frames)
                self.core.data_sent(n_samples, epoch)

    def replay_taken_over(self) -> None:
        """Hand over every rank of a ranked group taken over since the last look."""
        for group in self._ranked.values():
            group.audience.replay_taken_over()

    def _finish_batches(self, name: str, upcoming: BufferedMessage | None) -> None:
        """Free group ``name``'s trainers' last, partial batches of an epoch the group was
        dealt whole (``upcoming``: its next message, None if it has them all)."""
        audience = self._free.get(name)
        if audience is None or (held := audience.batches.held_epoch()) is None:
            return
        if (upcoming is None and self.buffer.epoch_closed(held)) or (
                upcoming is not None and upcoming.epoch > held):
            self.dealer.finish_batches(audience, held)

    def finish_batches(self) -> None:
        """The stream's end: every free group's trainers' last, partial batches."""
        for audience in self._free.values():
            self.dealer.finish_batches(audience)

    def redeal(self) -> None:
        """Deal again, within each group, what its lost reliable members held (to the
        members live now)."""
        self._targets.update(self.core.live_members(time.monotonic()))
        for audience in self._free.values():
            self.dealer.redeal(audience)

    def ranks_owed(self) -> int:
        """Messages the ranked groups' ranks were sent and have not handed out yet."""
        return sum(group.audience.ledger().held() for group in self._ranked.values())

    def _audience(self, name: str) -> FreeAudience:
        """Group ``name``'s free members as the dealer's audience (the group ``default``
        is the server's free trainers: what they held before the groups opened is its)."""
        audience = self._free.get(name)
        if audience is None:
            audience = self._free[name] = self.dealer.free_audience(
                "" if name == DEFAULT_GROUP else name, lambda: self._in_turn(name))
        return audience

    def _in_turn(self, name: str) -> list[bytes]:
        """Group ``name``'s live members, starting with the next in turn."""
        targets = self._targets.get(name, [])
        if not targets:
            return targets
        turn = self._turns[name] = (self._turns.get(name, -1) + 1) % len(targets)
        return targets[turn:] + targets[:turn]

    def _deliver(self, name: str, message: BufferedMessage) -> bool:
        """Send ``message`` to the next member of ``name`` with room; False if none has."""
        frames, placed, n_samples = message.frames, message.placed, message.n_samples
        if self.unreported is not None and name == DEFAULT_GROUP:
            frames, placed, n_samples = self._unreported(message)
            if not n_samples:  # every sample of it was handed out before the restart
                self.buffer.delivered(name)
                return True
        # Full, or not connected (yet, or any more): the next one.
        if self.dealer.offer(frames, placed, self._audience(name)) is not None:
            return False
        self.buffer.delivered(name)
        self.dealer.outbox.count_bytes(message.nbytes)
        self.core.data_sent(n_samples, message.epoch)
        return True

    def _unreported(self, message: BufferedMessage) -> tuple[Frames, Placement | None, int]:
        """``message`` less what free trainers that outlived the previous server reported
        handed out in hellos that came after sampling began (the sampler drew past
        their positions into the buffer): its frames, placement and samples as they
        are, or re-encoded with the rows nobody handed out (none: 0 samples)."""
        assert self.unreported is not None
        tags = read_tags(list(message.frames))
        kept = self.unreported(int(tags[0, 0]), tags[:, 1])
        if kept is None or kept.all():
            return message.frames, message.placed, message.n_samples
        rows = np.flatnonzero(kept).tolist()
        if not rows:
            return [], None, 0
        decoded = decode(list(self.dealer.carrier.decodable(message.frames)))
        assert isinstance(decoded, Data)
        frames = encode(Data(tags[rows], [decoded.samples[row] for row in rows],
                             self.server_id))
        return list(frames), None, len(rows)

    def _log_lag(self) -> None:
        """Say which group holds the sampler back, when one does: the buffer is at its
        bound (a sampler only :data:`~feedmux.server._delivery.groups.MAX_LEAD` messages
        ahead of its readers goes at their pace, which is no lag)."""
        now = time.monotonic()
        lagging = self.buffer.lagging() if self.buffer.at_bound else None
        if lagging is None or (lagging == self._last_lagging
                               and now - self._last_lag_log < LAG_LOG_INTERVAL):
            return
        self._last_lag_log, self._last_lagging = now, lagging
        log.info("group %s lags: %d message(s) behind, holding the sampler back", lagging,
                 self.buffer.behind(lagging))

    def abandon(self) -> None:
        """The stream ends here: every buffered message and ranked share leaves unsent
        (its placement in the pool given back)."""
        for group in self._ranked.values():
            group.close()
        self._ranked.clear()
        self.buffer.clear()

    def stats(self) -> dict[str, int | str | None]:
        figures = self.buffer.stats()
        for name, group in self._ranked.items():
            figures[f"group.{name}.world_size"] = group.dealer.world_size
        return figures
