"""Who holds which rank of a data-parallel job: the admission rules of ranked trainers.

This module owns the server's delivery mode as the trainers' hellos reveal it
(free trainers, or ``n`` ranked trainers), the table of rank holders, and the
checks a newcomer must pass: a rank inside ``[0, n)``, the same ``n`` as the
ranks already known, no second live holder of a rank, no free trainer on a
ranked server and no ranked one on a free server. With consumer groups each
group has its own table (:class:`RankTables`): a group is all free trainers or
the ranks of one job with its own world size. It is pure (time and liveness
are passed in) and must never send anything: the control core turns its
answers into messages.
"""

from __future__ import annotations

from collections.abc import Callable

from feedmux.protocol import Ack, Hello
from feedmux.server._control.resume import CHECKPOINT, LIVE, check_announcement
from feedmux.server._delivery.batches import BatchRequest
from feedmux.server._delivery.groups import DEFAULT_GROUP
from feedmux.server._delivery.ledger import Ledger, Recovery
from feedmux.server._delivery.ranking import RANK_REFUSED
from feedmux.server.config import refusal

__all__ = ["MAX_WORLD_SIZE", "RANK_REFUSED", "RANK_TAKEN", "RankTable", "RankTables"]

#: The error type a newcomer gets while another live trainer holds its rank; the
#: loader retries its hello for a while, as the holder may be a crashed predecessor.
RANK_TAKEN = "feedmux.errors.RankTakenError"
#: The largest job a server deals to: a hello names the world size, and anyone who can
#: reach the control port can send one (the server keeps per-rank state).
MAX_WORLD_SIZE = 1 << 16


class RankTable:
    """The delivery mode and the holder (a control identity) of each rank.

    ``world_size`` is None until the first trainer's hello, then 0 for free
    trainers or ``n`` for a job of ``n`` ranks; it stays for the run.

    Examples
    --------
    >>> table = RankTable()
    >>> table.admit(b"a", Hello("a", world_size=2, rank=0), alive=lambda identity: True)
    >>> table.missing()
    [1]
    >>> refused = table.admit(b"b", Hello("b", world_size=3, rank=1), alive=lambda i: True)
    >>> refused[1]
    'expected world_size 2 (the ranks already connected), got world_size 3 from rank 1'
    """

    def __init__(self, name: str = "this server") -> None:
        #: Who deals to these trainers, in error messages ("this server", "group 'a'").
        self.name = name
        self.world_size: int | None = None
        #: rank -> (control identity, client id) of its holder
        self.holders: dict[int, tuple[bytes, str]] = {}
        #: rank -> the resume position its holder announced (empty: none)
        self.resumes: dict[int, tuple[int, ...]] = {}
        #: The checkpoint the job resumed from (its first rank's announcement; empty: the
        #: job started afresh), and rank -> the client id of the trainer that announced it.
        self.resumed: tuple[int, ...] = ()
        self.announced: dict[int, str] = {}

    @property
    def ranked(self) -> bool:
        return bool(self.world_size)

    def admit(self, identity: bytes, hello: Hello,
              alive: Callable[[bytes], bool]) -> tuple[str, str] | None:
        """Admit the trainer behind ``hello``; ``(error type, message)`` when it is refused."""
        rank, size = hello.rank, hello.world_size
        if rank < 0:
            if self.ranked:
                return RANK_REFUSED, (
                    f"{self.name} deals to {self.world_size} ranked trainers: expected a "
                    f"RemoteLoader with rank= and world_size={self.world_size}, got a free "
                    f"trainer (no rank)"
                )
            self.world_size = 0
            return None
        if size > MAX_WORLD_SIZE:
            return RANK_REFUSED, f"expected world_size at most {MAX_WORLD_SIZE}, got {size}"
        if not 0 <= rank < size:
            return RANK_REFUSED, f"expected rank in [0, {size}) for world_size {size}, got {rank}"
        if (bad := check_announcement(hello.resume)) is not None:
            return RANK_REFUSED, f"{bad} from rank {rank}"
        if self.world_size == 0:
            return RANK_REFUSED, (
                f"{self.name} deals to free trainers: expected a RemoteLoader without rank, "
                f"got rank {rank} of world_size {size}"
            )
        if self.world_size is not None and size != self.world_size:
            return RANK_REFUSED, (
                f"expected world_size {self.world_size} (the ranks already connected), "
                f"got world_size {size} from rank {rank}"
            )
        holder = self.holders.get(rank)
        if holder is not None and holder[0] != identity and alive(holder[0]):
            return RANK_TAKEN, (
                f"rank {rank} is held by live trainer {holder[1]}: expected a free rank, "
                f"got rank {rank} again from trainer {hello.client_id}"
            )
        if self.world_size is None and hello.resume and hello.resume[3] == CHECKPOINT:
            self.resumed = tuple(hello.resume)
        if self.resumed and tuple(hello.resume) == self.resumed:
            self.announced[rank] = hello.client_id
        self.world_size = size
        self.holders[rank] = (identity, hello.client_id)
        self.resumes[rank] = tuple(hello.resume)
        return None

    @property
    def resumed_at(self) -> tuple[int, int] | None:
        """Where the job resumed from its checkpoint, (epoch, position); None: afresh."""
        return None if not self.resumed else (self.resumed[0], self.resumed[1])

    def restarts(self, hello: Hello) -> bool:
        """Whether ``hello`` (a rank restored from a checkpoint) starts a new run of this
        job: the job runs afresh or from another checkpoint, or a trainer of this run
        announced the same checkpoint for that rank before (the job restarted from it
        again). A rank joining the run its checkpoint started does not.

        >>> table = RankTable()
        >>> first = Hello("a", world_size=2, rank=0, resume=(2, 8, 2, CHECKPOINT))
        >>> table.admit(b"a", first, alive=lambda i: True)
        >>> table.restarts(Hello("b", world_size=2, rank=1, resume=(2, 8, 2, CHECKPOINT)))
        False
        >>> table.restarts(Hello("c", world_size=2, rank=0, resume=(2, 8, 2, CHECKPOINT)))
        True
        """
        if not (self.ranked and check_announcement(hello.resume) is None and hello.resume
                and hello.resume[3] == CHECKPOINT and hello.rank >= 0):
            return False
        return (tuple(hello.resume) != self.resumed
                or self.announced.get(hello.rank, hello.client_id) != hello.client_id)

    def holder(self, rank: int) -> tuple[bytes, str] | None:
        """(control identity, client id) of the holder of ``rank``, or None."""
        return self.holders.get(rank)

    def release(self, identity: bytes) -> None:
        """``identity`` is gone: its rank waits for a successor."""
        for rank, holder in list(self.holders.items()):
            if holder[0] == identity:
                del self.holders[rank]
                self.resumes.pop(rank, None)

    def missing(self) -> list[int]:
        """The ranks nobody holds (all of them before the first ranked hello)."""
        return [rank for rank in range(self.world_size or 0) if rank not in self.holders]

    def dealt(self, rank: int) -> bool:
        """Whether ``rank`` is a rank of this job (an acknowledgement of another means nothing)."""
        return 0 <= rank < (self.world_size or 0)


class RankTables:
    """The rank tables of a server and what each rank was sent: the server's own, or one
    per consumer group (``grouped``).

    Without groups every trainer is in :attr:`server`'s table; with groups,
    :attr:`server` stays empty (never ranked) and each group gets a table of
    its own on its first hello, so one group's ranks never meet another's. A
    server without groups starts serving them at the first hello that names a
    group (:meth:`open_groups`): its free trainers so far become the group
    ``default``. What a hello asks for is checked against the server's state
    by the combination table (:func:`~feedmux.server.config.refusal`).

    Examples
    --------
    >>> tables = RankTables(grouped=True, retention_limit=8)
    >>> tables.admit(b"a", Hello("a", world_size=2, rank=0, group="a"), alive=lambda i: True)
    >>> tables.admit(b"b", Hello("b", group="b"), alive=lambda i: True)
    >>> tables.of("a").world_size, tables.of("b").world_size, tables.server.ranked
    (2, 0, False)
    >>> tables.admit(b"c", Hello("c", group="a"), alive=lambda i: True)[1][:55]
    "group 'a' deals to 2 ranked trainers: expected a Remote"
    """

    def __init__(self, grouped: bool, retention_limit: int) -> None:
        self.grouped = grouped
        self.retention_limit = retention_limit
        self.server = RankTable()
        #: What each rank of the server's own table was sent beyond what it handed out.
        self.retention = Ledger(Recovery.REPLAY, limit=retention_limit)
        self._groups: dict[str, tuple[RankTable, Ledger]] = {}
        self._unknown = RankTable()  # what a group no trainer said hello in looks like
        #: The batch shape of the server's ranked job (its first rank's hello fixes it);
        #: each ranked group has its own (:meth:`batches_of`).
        self.batches = BatchRequest()
        self._group_batches: dict[str, BatchRequest] = {}

    def _group(self, group: str) -> tuple[RankTable, Ledger]:
        entry = self._groups.get(group)
        if entry is None:
            entry = self._groups[group] = (RankTable(f"group {group!r}"),
                                           Ledger(Recovery.REPLAY, self.retention_limit))
        return entry

    def of(self, group: str) -> RankTable:
        """The table of ``group`` ("" : the default group; the server's own without groups).

        A lookup never creates a table (a heartbeat may name any group): only a
        hello does.
        """
        if not self.grouped:
            return self.server
        entry = self._groups.get(group or DEFAULT_GROUP)
        return self._unknown if entry is None else entry[0]

    def retention_of(self, group: str) -> Ledger:
        return self._group(group or DEFAULT_GROUP)[1] if self.grouped else self.retention

    def asks(self, hello: Hello) -> set[str]:
        """What ``hello`` asks of this server, with what the server is serving so far, in
        the words of the combination table (:data:`~feedmux.server.config.ASKS`)."""
        asked = {
            "groups": self.grouped,
            "ranked_job": not self.grouped and self.server.ranked,
            "group": bool(hello.group) and hello.group != DEFAULT_GROUP,
            "rank": hello.rank >= 0,
            "batch_size": hello.batch_size > 0,
            "resume": bool(hello.resume),
            "live": len(hello.resume) == 4 and hello.resume[3] == LIVE,
        }
        return {name for name, asks in asked.items() if asks}

    def admit(self, identity: bytes, hello: Hello,
              alive: Callable[[bytes], bool]) -> tuple[str, str] | None:
        """Admit ``hello``'s trainer into its group's table (and its batch shape: the
        same as the others'); ``(error type, message)`` if not. The first hello that
        names a group opens the server's groups."""
        asked = self.asks(hello)
        if (reason := refusal(asked)) is not None:
            return RANK_REFUSED, reason
        name = hello.group or DEFAULT_GROUP
        grouped = self.grouped or "group" in asked
        batches = self.batches_of(name) if grouped else self.batches
        if (refused := batches.refusal(hello)) is not None:
            return refused
        if self.grouped:
            table = self._group(name)[0]
        else:  # a first group is kept only once its hello is admitted
            table = RankTable(f"group {name!r}") if "group" in asked else self.server
        refused = table.admit(identity, hello, alive)
        if refused is None:
            batches.admit(hello)
            if not self.grouped and table is not self.server:
                self.open_groups()
                self._groups[name] = (table, Ledger(Recovery.REPLAY, self.retention_limit))
        return refused

    def batches_of(self, group: str) -> BatchRequest:
        """The batch shape of ranked group ``group``'s job (made when first asked for)."""
        request = self._group_batches.get(group)
        if request is None:
            request = self._group_batches[group] = BatchRequest()
            request.default_bucket_by = self.batches.default_bucket_by
        return request

    def open_groups(self) -> None:
        """Serve consumer groups from now on: the server's own (free) trainers so far are
        the group ``default``. The server's own table is admitted into no more: it stays
        what it was (free, or no trainer yet), never ranked."""
        assert not self.server.ranked, "a ranked job outside any group is refused groups"
        default = RankTable(f"group {DEFAULT_GROUP!r}")
        default.world_size = self.server.world_size  # 0: its free trainers so far
        self._groups[DEFAULT_GROUP] = (default, Ledger(Recovery.REPLAY, self.retention_limit))
        self.grouped = True

    def acknowledged(self, group: str | None, ack: Ack, server_id: str = "") -> bytes | None:
        """A rank of ``group`` handed out its share up to ``ack``'s mark; the control
        identity of the rank's holder if the acknowledgement is from it (a sign of life).

        A rank the group does not deal to (or a group no trainer said hello in)
        counts for nothing: anyone can reach the control port. ``group`` None: the
        trainer is gone (its last acknowledgement crossed its departure); the mark
        counts in the group whose retention sent it that rank's data, if any (a
        successor must not get again what it handed out). A mark that names another
        server than ``server_id`` (the process this one replaced: a loader over
        several servers marks each link with the server of the message it left
        there) is a sign of life only: its positions are another process's, and
        taken here they would release messages of this one nobody handed out.
        """
        if group is None:
            for name in list(self._groups):
                self.acknowledged(name, ack, server_id)
            return None
        if not self.of(group).dealt(ack.rank):
            return None
        if not (ack.server_id and server_id and ack.server_id != server_id):
            self.retention_of(group).record_mark(ack.rank, ack.client_id.encode(),
                                                 (ack.epoch, ack.position))
        holder = self.of(group).holder(ack.rank)
        return holder[0] if holder is not None and holder[1] == ack.client_id else None

    def predecessor_said(self, hello: Hello, server_id: str) -> tuple[int, int] | None:
        """A rank's new holder (just admitted) says what its dead predecessor handed out
        last, from the mark file it left (``Hello.predecessor``): the rank's replay is cut
        there. The mark, when it is further on than the marks the predecessor's thread got
        here; None when it is not, or means nothing here: another server's (this one
        restarted), a job resumed from a checkpoint, or nothing of the rank kept to cut.

        >>> tables = RankTables(grouped=False, retention_limit=8)
        >>> tables.admit(b"a", Hello("a", world_size=1, rank=0), alive=lambda i: False)
        >>> from feedmux.protocol import Data, encode
        >>> import numpy as np
        >>> frames = list(encode(Data(np.array([[1, 0], [1, 1], [1, 2]]), ["x", "y", "z"])))
        >>> tables.retention.record(0, b"a", frames)
        1
        >>> tables.release(b"a")
        >>> hello = Hello("b", world_size=1, rank=0, predecessor=(1, 1), predecessor_server="s")
        >>> tables.admit(b"b", hello, alive=lambda i: False)
        >>> tables.predecessor_said(hello, "another server"), tables.predecessor_said(hello, "s")
        (None, (1, 1))
        """
        said = hello.predecessor
        if hello.rank < 0 or len(said) != 2 or hello.predecessor_server != server_id \
                or hello.resume or not self.of(hello.group).dealt(hello.rank):
            return None
        mark = (int(said[0]), int(said[1]))
        ledger = self.retention_of(hello.group)
        heard = ledger.mark(hello.rank)
        if not ledger.mark_predecessors(hello.rank, hello.client_id.encode(), mark):
            return None
        return mark if heard is None or mark > heard else None

    def owed_to_a_successor(self) -> bool:
        """Whether a rank (of the server's job or of a ranked group) has messages its
        holder's predecessor was sent and never handed out, not yet re-sent: nobody
        holds the rank, or its new holder has not had its hand-over (the stream must not
        end before it went).

        >>> tables = RankTables(grouped=False, retention_limit=8)
        >>> tables.admit(b"a", Hello("a", world_size=1, rank=0), alive=lambda i: False)
        >>> tables.retention.record(0, b"a", [b"frames"])
        1
        >>> tables.owed_to_a_successor()
        False
        >>> tables.release(b"a")
        >>> tables.owed_to_a_successor()
        True
        >>> tables.admit(b"b", Hello("b", world_size=1, rank=0), alive=lambda i: False)
        >>> tables.owed_to_a_successor()  # held again, its predecessor's rest not re-sent
        True
        """
        for table, ledger in [(self.server, self.retention), *self._groups.values()]:
            if not table.ranked:
                continue
            for lane in ledger.lanes():
                if isinstance(lane, int):
                    holder = table.holder(lane)
                    if holder is None or ledger.owed(lane, holder[1].encode()):
                        return True
        return False

    def restart(self) -> list[bytes]:
        """A ranked job restarts from a checkpoint: forget its ranks and what they were sent.

        Returns the control identities of the holders forgotten (the previous
        job's trainers: gone, or about to be told their run is over).
        """
        gone = [identity for identity, _ in self.server.holders.values()]
        self.server = RankTable()
        self.retention = Ledger(Recovery.REPLAY, self.retention_limit)
        return gone

    def ranked_ledgers(self) -> list[Ledger]:
        """The ledgers of the ranks of the ranked tables (what they were sent and did not
        hand out yet); none while no table is ranked."""
        ledgers = [self.retention] if self.server.ranked else []
        return ledgers + [ledger for table, ledger in list(self._groups.values())
                          if table.ranked]

    def restarts_group(self, hello: Hello) -> bool:
        """Whether ``hello`` is a rank of a ranked group's job restarted from a
        checkpoint (:meth:`RankTable.restarts`): the group's run so far is over."""
        entry = self._groups.get(hello.group or DEFAULT_GROUP) if self.grouped else None
        return entry is not None and entry[0].restarts(hello)

    def resume_from(self) -> tuple[int, int] | None:
        """Where the sampler of a server serving groups starts: the first epoch a ranked
        group resumed from a checkpoint needs, when every group a trainer said hello in is
        one (none has drawn yet, and no fresh group wants the epochs before); else None
        (from the beginning: the resumed groups wait for their epochs)."""
        tables = [table for table, _ in self._groups.values() if table.world_size is not None]
        starts = [table.resumed_at for table in tables]
        if not tables or None in starts:
            return None
        return min(start[0] for start in starts if start is not None), 0

    def forget(self, group: str) -> None:
        """``group`` was dropped (no member for its timeout): a new hello starts it afresh."""
        self._groups.pop(group, None)
        self._group_batches.pop(group, None)

    def release(self, identity: bytes) -> None:
        """``identity`` is gone: its rank (in whichever table) waits for a successor."""
        self.server.release(identity)
        for table, _ in self._groups.values():
            table.release(identity)
