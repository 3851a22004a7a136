"""Which worker processes run: forked to the count, retired above it, replaced when they die.

:class:`Staffing` runs in the forwarding loop, between messages. It makes the
workers running match :attr:`WorkerPool.target` (``--workers N``, ``auto``,
``feedmux scale``): it forks more from the zygote, or asks the surplus ones to
end after their current message (with ``auto``, a target of one is the server's
own process, :attr:`WorkerPool.home`: no worker runs then, and its shards move
out to the workers forked when more are wanted, and back when they end); and it
handles a worker that ended: what its
socket already delivered is taken (under its shards' tickets), its runs of the
shared-memory pool that the server took no message of come back
(:meth:`WorkerPool.bury`), and its socket is closed. A worker that died is
replaced by a new one forked into its seat, which takes its shards; without the
zygote, or after :data:`MAX_BARREN_DEATHS` workers in a row died before
delivering anything (a sampler that kills every process that runs it), its
shards go to the others instead, and the run fails when none is left. After any
change the shards are spread again (:meth:`WorkerPool.place`): every shard that
changes hands, or whose worker died, gets a new ticket and its new owner resumes
where the server's ledger stands, so nothing is lost or taken twice whatever the
old owner still had on its way. It never samples and never merges.

:class:`WorkerSockets` holds the server's socket of each worker (a new one for
each worker of a seat: nothing of a dead worker is read from its successor's)
and the poller they are registered in.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

import zmq

from feedmux._plumbing.sockets import make_socket, mapped_zmq_errors
from feedmux.errors import FeedmuxError
from feedmux.protocol import Error
from feedmux.server._sources.assignment import ShardLedger
from feedmux.server._sources.workers import WorkerPool

__all__ = ["MAX_BARREN_DEATHS", "Staffing", "WorkerSockets"]

log = logging.getLogger("feedmux.server")

#: Workers that died one after the other without delivering a message: after as many,
#: a dead worker's shards go to the others instead of to a new worker.
MAX_BARREN_DEATHS = 3


class WorkerSockets:
    """The server's PULL socket of each worker, by seat, and the poller of the loop."""

    def __init__(self, context: Any, hwm: int, control: Any) -> None:
        self._context, self._hwm = context, hwm
        self.by_seat: dict[int, Any] = {}
        self.poller = zmq.Poller()
        self.poller.register(control, zmq.POLLIN)
        self._polled: set[int] = set()
        self._zygote: int | None = None

    def open(self, seat: int, endpoint: str) -> None:
        """Bind a new socket for ``seat``'s next worker at ``endpoint``."""
        self.close(seat)
        socket = make_socket(self._context, zmq.PULL, hwm=self._hwm, heartbeats=False)
        try:
            with mapped_zmq_errors("bind the internal endpoint", endpoint):
                socket.bind(endpoint)
        except BaseException:
            socket.close(linger=0)
            raise
        self.by_seat[seat] = socket

    def close(self, seat: int) -> None:
        socket = self.by_seat.pop(seat, None)
        if socket is not None:
            if seat in self._polled:
                self.poller.unregister(socket)
                self._polled.discard(seat)
            socket.close(linger=0)

    def watch(self, seats: list[int], zygote: int | None) -> None:
        """Poll the sockets of ``seats`` (and the zygote's reports, while ``zygote``)."""
        wanted = {seat for seat in seats if seat in self.by_seat}
        for seat in self._polled - wanted:
            self.poller.unregister(self.by_seat[seat])
        for seat in wanted - self._polled:
            self.poller.register(self.by_seat[seat], zmq.POLLIN)
        self._polled = wanted
        if zygote != self._zygote:
            if self._zygote is not None:
                self.poller.unregister(self._zygote)
            if zygote is not None:
                self.poller.register(zygote, zmq.POLLIN)
            self._zygote = zygote

    def close_all(self) -> None:
        for seat in list(self.by_seat):
            self.close(seat)


class Staffing:
    """Forks, retires and replaces the pool's workers."""

    def __init__(self, pool: WorkerPool, sockets: WorkerSockets) -> None:
        self.pool = pool
        self.sockets = sockets
        #: Seats whose current worker delivered a message.
        self.fruitful: set[int] = set()
        self._barren = 0

    def fill(self) -> None:
        """Fork the first workers (the count to start with), or sample in the server's
        own process at a count of one (``auto``)."""
        pool = self.pool
        if pool.sample_here(pool.forks_wanted() == 0):
            log.info("1 sampling process: the server's own (pid %d); worker processes are "
                     "forked when more are wanted", os.getpid())
            return
        for seat in pool.free_seats()[: pool.target - len(pool.active)]:
            self._spawn(seat)
        if not pool.active:
            raise FeedmuxError(f"expected the zygote (pid {pool.zygote.pid}) to fork the "
                               "sampling workers, got none")
        log.info("started %d sampling worker(s): pids %s", len(pool.active),
                 ", ".join(str(pool.pids[seat]) for seat in pool.active))

    def _spawn(self, seat: int) -> int | None:
        pool = self.pool
        self.sockets.open(seat, pool.prepare(seat))
        pid = pool.spawn(seat)
        if pid is None:
            self.sockets.close(seat)
        self.fruitful.discard(seat)
        return pid

    def reconcile(self, ledger: ShardLedger, read: Callable[[Any], Error | None]) -> Error | None:
        """Handle the workers that ended, then match the count; the shards follow.

        ``read(socket)`` takes one message of a worker's socket (raising ``zmq.Again``
        when there is none) and returns a worker's Error, if it was one."""
        pool = self.pool
        replace: dict[int, str] = {}  # seat -> what its dead worker's log line says
        changed = False
        for seat in pool.ended():
            error = self._drain(seat, read)
            if error is not None:
                return error
            changed = True
            freed = pool.bury(seat)
            pid, _ = pool.ended_as[seat]
            self.sockets.close(seat)
            pooled = ("" if pool.shm is None else
                      f", {freed} run(s) of the shared-memory pool free again")
            if seat in pool.retiring:
                pool.vacate(seat)
                log.info("sampling worker %d (pid %s) ended as asked%s", seat, pid, pooled)
                continue
            self._barren = 0 if seat in self.fruitful else self._barren + 1
            if self._barren < MAX_BARREN_DEATHS and not pool.zygote.gone:
                replace[seat] = pooled  # its seat stays active: a new worker takes it
                continue
            why = ("no zygote to fork a new one" if pool.zygote.gone else
                   f"{self._barren} workers in a row died before delivering anything")
            self._hand_over(seat, why, pooled)
        if replace:
            # The dead workers' shards get new tickets before their successors fork, so
            # that each reads its start at once (its seat, hence their owner, is the same).
            renew = {shard for seat in replace for shard in pool.owned(seat)}
            self._placed(pool.place(ledger, renew=renew))
            changed = False
            for seat, pooled in replace.items():
                shards = ", ".join(map(str, pool.owned(seat))) or "(none)"
                new = self._spawn(seat)
                if new is None:  # the zygote went meanwhile
                    self._hand_over(seat, "no zygote to fork a new one", pooled)
                    changed = True
                    continue
                pool.replaced += 1
                log.warning("%s; its shards %s go to a new worker (pid %d)%s",
                            pool.failure(seat), shards, new, pooled)
        changed = self.match() or changed
        if changed:
            self._placed(pool.place(ledger))
        return None

    def _hand_over(self, seat: int, why: str, pooled: str) -> None:
        """``seat``'s dead worker is not replaced: its shards go to the others (at the next
        :meth:`WorkerPool.place`); with none left the run fails."""
        pool = self.pool
        shards = ", ".join(map(str, pool.owned(seat))) or "(none)"
        pool.vacate(seat, down=True)
        log.warning("%s; its shards %s go to the other workers (%s)%s", pool.failure(seat),
                    shards, why, pooled)
        if not pool.active:
            failure = pool.failure(seat)
            pool.reclaim()  # what a worker forwarded goes nowhere now: its runs come back
            raise FeedmuxError(failure)

    def _placed(self, moved: list[int]) -> None:
        if moved:
            log.info("workers %d: shards %s moved", len(self.pool.active),
                     ", ".join(map(str, moved)))

    def match(self) -> bool:
        """Fork or retire workers to the pool's target; whether any changed (then the
        shards are to be placed again: :meth:`reconcile` does, and a new run does)."""
        pool = self.pool
        wanted = pool.forks_wanted()
        processes = [seat for seat in pool.active if seat != pool.home]
        surplus = len(processes) - wanted
        if surplus > 0:
            leaving = processes[-surplus:]
            pool.retire(leaving)
            # The server's own process takes the shards when none is left (auto at one).
            here = pool.sample_here(len(processes) == surplus)
            log.info("workers %s asked to end after their current message%s",
                     ", ".join(f"{seat} (pid {pool.pids.get(seat)})" for seat in leaving),
                     "; the server samples in its own process" * here)
            return True
        forked = []
        while len(processes) < wanted and not pool.zygote.gone and pool.free_seats():
            seat = pool.free_seats()[0]
            pid = self._spawn(seat)
            if pid is None:
                break
            processes.append(seat)
            forked.append(f"{seat} (pid {pid})")
        if forked:
            log.info("started sampling worker(s) %s", ", ".join(forked))
        # The server's own process samples while no worker process does (one that could
        # not be forked too), and stops once they take the shards (the next place()).
        moved = pool.sample_here(not processes)
        return bool(forked) or moved

    def _drain(self, seat: int, read: Callable[[Any], Error | None]) -> Error | None:
        """Take what the socket of ``seat``'s ended worker already delivered."""
        socket = self.sockets.by_seat.get(seat)
        if socket is None:
            return None
        with contextlib.suppress(zmq.Again):
            while True:  # bounded by the socket's queue: the worker sends no more
                error = read(socket)
                if error is not None:
                    return error
        return None
