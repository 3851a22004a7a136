"""The server's send path, chosen once as sampling starts: a ranked job's, or the groups'.

A server sends its data messages along one of two paths, and which one is
fixed when it leaves the wait for its first trainers (the first hellos tell
which; nothing later changes it, and nothing appears while a message waits):

- :class:`RankedJob`: the ranks of a data-parallel job that has the server to
  itself (its trainers say ``rank=``/``world_size=`` and no group). Each
  message, dealt upstream by the ranked stage, goes to its rank's holder.
- the consumer groups' fan-out
  (:class:`~feedmux.server._delivery.fanout.GroupFanout`): every other server.
  Free trainers without ``group=`` are the group ``default``, read from the
  start of sampling; named groups (free or ranked) join the same buffer as
  more cursors, whenever their first trainer says hello.

Both answer :class:`SendPath`, so the socket shell moves a message along
without asking which path it is. Before sampling starts there is
:data:`NOT_OPEN`, which sends nothing.

Why every free server goes through the fan-out (and not a path of its own
beside it): with a buffer of one group a message costs the same as dealt
straight (``python -m benchmarks.bench_groups``, "1 group / 1 plain"), and a
server that opens the groups' path only when a group first asks for one
changes its topology in the middle of a send (the message that waited for a
free trainer then had to be rerouted to the groups).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from feedmux._plumbing.shm import carried_bytes
from feedmux.server._delivery.dealer import Dealer, RankAudience
from feedmux.server._delivery.outbox import Frames

__all__ = ["NOT_OPEN", "RankedJob", "SendPath"]


class SendPath(Protocol):
    """Where the sampler's data messages go, and what the shell asks of it."""

    def send(self, frames: Frames, n_samples: int, epoch: int, rank: int = -1) -> bool:
        """Deliver one message (to ``rank``, or -1: the free trainers and every group),
        waiting while nobody can take it; False when the server stops meanwhile."""

    def epoch_finished(self, epoch: int) -> None:
        """Every message of ``epoch`` went into the path."""

    def flush(self, deadline: float) -> bool:
        """Deliver what the path still holds (until ``deadline``); True if done."""

    def finish_batches(self) -> None:
        """The stream's end: the free trainers' last, partial batches."""

    def redeal(self) -> None:
        """Deal again what lost free trainers held, within their audiences."""

    def ranks_owed(self) -> int:
        """Messages ranks were sent and have not handed out yet."""

    def replay_taken_over(self) -> None:
        """Give every rank taken over since the last look its predecessor's rest."""

    def stats(self) -> dict[str, int | str | None]:
        """The path's own figures for the server's statistics."""

    def abandon(self) -> None:
        """The stream ends here (the server failed): let go of every message the path
        holds that is not sent yet (their runs of the pool back)."""


class _NotOpen:
    """The path before sampling starts: no message is sent yet, no rank has a rest."""

    def send(self, frames: Frames, n_samples: int, epoch: int, rank: int = -1) -> bool:
        raise RuntimeError("expected a data message once sampling started, got one before")

    def epoch_finished(self, epoch: int) -> None:
        pass

    def flush(self, deadline: float) -> bool:
        return True

    def finish_batches(self) -> None:
        pass

    def redeal(self) -> None:
        pass

    def ranks_owed(self) -> int:
        return 0

    def replay_taken_over(self) -> None:
        pass

    def stats(self) -> dict[str, int | str | None]:
        return {}

    def abandon(self) -> None:
        pass


#: The send path of a server that has not started sampling.
NOT_OPEN: SendPath = _NotOpen()


class RankedJob:
    """The path of a server whose trainers are the ranks of one job (no group).

    Each message is already one rank's (the ranked stage dealt it upstream); it
    goes to that rank's holder through ``dealer`` (``ranks``: the holders and
    their ledger, a successor getting its predecessor's rest first). ``sent(n,
    epoch)`` counts what went; ``held()`` is the messages the ranks were sent
    and have not handed out; ``count_bytes(n)`` adds to the bytes sent.
    """

    def __init__(self, dealer: Dealer, ranks: RankAudience, sent: Callable[[int, int], None],
                 held: Callable[[], int], count_bytes: Callable[[int], None]) -> None:
        self.dealer = dealer
        self.ranks = ranks
        self.sent = sent
        self.held = held
        self.count_bytes = count_bytes

    def send(self, frames: Frames, n_samples: int, epoch: int, rank: int = -1) -> bool:
        nbytes = carried_bytes(frames)
        went, _ = self.dealer.send(frames, self.ranks, rank)
        if went:
            self.count_bytes(nbytes)
            self.sent(n_samples, epoch)
        return went

    def epoch_finished(self, epoch: int) -> None:
        pass  # the ranked stage upstream pads or drops the epoch's last round

    def flush(self, deadline: float) -> bool:
        return True  # nothing is held here: each message went as it came

    def finish_batches(self) -> None:
        pass  # the job's batches are cut upstream, before the dealing

    def redeal(self) -> None:
        pass  # a rank's rest goes to its successor (replay_taken_over), not to the others

    def ranks_owed(self) -> int:
        return self.held()

    def replay_taken_over(self) -> None:
        self.ranks.replay_taken_over()

    def stats(self) -> dict[str, int | str | None]:
        return {}

    def abandon(self) -> None:
        pass  # each message went as it came; the ranks' ledger is the core's
