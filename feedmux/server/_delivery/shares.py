"""Shares of a re-deal: which trainers may take a lost trainer's message now.

A free trainer may say how many trainers share the stream, itself included
(its hello's ``world_size``): each worker of a torch DataLoader over a
``RemoteDataset`` says how many workers there are. Such workers are read in
turn, and with torch's default, non-persistent workers, the workers of a pass
end together, each returning (its goodbye) what it had received of the next
epoch, and the next pass's workers connect one after the other. Dealt by
credit alone, all of it went to the first of them; the DataLoader then waited
for the second, which had nothing of that epoch (the stream sent, it waited
for its end, which waited for the first one's hand-outs: a stall; or, with the
stream still going, it got a later epoch, and the pass mixed two epochs).

So :class:`RedealShares` keeps, of each epoch's messages waiting to be dealt
again, one for every sharer that holds none of that epoch: a trainer that holds
no message of the epoch may take one; one that holds some only while the
queue keeps enough for the sharers that hold none. Everyone who declares no
sharers (``world_size`` 1) is never held back. A sharer that never comes holds
nothing back for long: once the re-deal has been held back for
:data:`SHARE_WAIT` seconds, the rest of it goes to whoever has credit. It
is pure (the ledger, the trainers' declared sharers and the time in; who may
take out) and must never send or decide who holds what (the ledger does).
"""

from __future__ import annotations

from collections.abc import Callable

from feedmux._plumbing.sockets import HEARTBEAT_INTERVAL
from feedmux.server._delivery.ledger import Entry, Ledger

__all__ = ["SHARE_WAIT", "RedealShares"]

#: Seconds a re-deal held back for sharers that hold none of its epoch waits for them to
#: come (a DataLoader's next workers connect within a second or so of each other, also on
#: a loaded host) before it goes to whoever has credit.
SHARE_WAIT = 5 * HEARTBEAT_INTERVAL


class RedealShares:
    """Which of the trainers with credit may take a message dealt again, for one free
    audience's ``ledger``; ``sharers(client_id)`` is how many trainers share the stream
    with that trainer, itself included (1: it said nothing).

    Examples
    --------
    >>> import numpy as np
    >>> from feedmux.protocol import Data, encode
    >>> from feedmux.server._delivery.ledger import Recovery
    >>> def message(epoch, position):
    ...     return list(encode(Data(np.array([[epoch, position]]), ["x"])))
    >>> ledger = Ledger(Recovery.REDEAL)
    >>> for seq, position in enumerate([0, 1, 2], 1):  # a worker of a pass leaves holding
    ...     _ = ledger.record(b"old", b"old", message(2, position), seq=seq)
    >>> ledger.lose(b"old")
    3
    >>> shares = RedealShares(ledger, lambda client_id: 2)  # workers of two
    >>> def offer(candidates, now):  # the dealer's turn: the first taker takes it
    ...     entry = ledger.next_redeal()
    ...     takers = shares.takers(candidates, entry, now)
    ...     if takers:
    ...         _ = ledger.resent(takers[0][0], entry, takers[0][0], seq=ledger.next_seq)
    ...     else:
    ...         ledger.redeal_later(entry)
    ...     return [identity for identity, _ in takers]
    >>> offer([(b"a", b"a")], now=0.0), offer([(b"a", b"a")], now=0.0)  # a holds none, one
    ([b'a'], [b'a'])
    >>> offer([(b"a", b"a")], now=0.0)  # the last one is kept for the other worker
    []
    >>> offer([(b"a", b"a"), (b"b", b"b")], now=1.0)  # b comes
    [b'b']

    A sharer that does not come within :data:`SHARE_WAIT` is not waited for:

    >>> _ = ledger.lose(b"b"), ledger.record(b"a", b"a", message(3, 0), seq=9)
    >>> offer([(b"a", b"a")], now=2.0), offer([(b"a", b"a")], now=2.0 + SHARE_WAIT)
    ([], [b'a'])
    """

    def __init__(self, ledger: Ledger, sharers: Callable[[str], int]) -> None:
        self.ledger = ledger
        self.sharers = sharers
        #: Since when the re-deal has been held back without a break (None: it is not).
        self._held_since: float | None = None

    def takers(self, candidates: list[tuple[bytes, bytes]], entry: Entry,
               now: float) -> list[tuple[bytes, bytes]]:
        """Those of ``candidates`` (``(data identity, client id)`` of the trainers with
        credit, in the order to try them) that may take ``entry``, just taken from the
        re-deal queue (the rest of its epoch is still in it)."""
        if not candidates:
            self._held_since = None  # nobody to hold back from: a later wait starts afresh
            return candidates
        held_since = self._held_since
        if held_since is not None and now - held_since >= SHARE_WAIT:
            takers = candidates  # the sharers held out for did not come: until it is dealt
        else:
            epoch = entry.epoch
            holding = self.ledger.holding(epoch)
            left = self.ledger.queued(epoch)
            takers = [(identity, trainer) for identity, trainer in candidates
                      if identity not in holding
                      or left >= self.sharers(trainer.decode(errors="replace")) - len(holding)]
            if not takers:
                if held_since is None:
                    self._held_since = now
                return takers
        if not self.ledger.redeal:  # its last message: the next re-deal starts afresh
            self._held_since = None
        return takers
