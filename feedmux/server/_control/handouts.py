"""Which sampled epochs the trainers have handed out whole: "epoch N handed out".

"Epoch N sampled" says the sampler drew (and sent) an epoch's last sample; with a
deep queue and a slow trainer that is long before any trainer's loop reaches it.
Where the server learns what the trainers handed out (the ranks' hand-out marks,
the free trainers' acknowledgements), an epoch is handed out once it is
sampled and no ledger still holds a message of it or of an earlier epoch.
:class:`HandOuts` owns the sampled epochs not yet handed out and that rule; it is
pure (the ledgers' oldest epoch is passed in) and must never read a ledger, log or
send anything itself: the control core asks and logs.
"""

from __future__ import annotations

__all__ = ["MAX_PENDING", "HandOuts"]

#: Sampled epochs waited on at most (a run whose trainers hand nothing out must not
#: grow this without bound: the oldest are dropped, never said handed out).
MAX_PENDING = 64


class HandOuts:
    """The sampled epochs whose hand-out is still to be seen.

    Examples
    --------
    >>> handouts = HandOuts()
    >>> handouts.sampled(1); handouts.sampled(2)
    >>> handouts.handed(oldest=1)       # a message of epoch 1 is still held
    []
    >>> handouts.handed(oldest=2)       # only epoch 2's remain
    [1]
    >>> handouts.handed(oldest=None)    # nothing is held any more
    [2]
    """

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[int] = []

    def sampled(self, epoch: int) -> None:
        """Every sample of ``epoch`` was sent."""
        if epoch not in self.pending:
            self.pending = [*self.pending, epoch][-MAX_PENDING:]

    def handed(self, oldest: int | None) -> list[int]:
        """The epochs now handed out, given the oldest epoch a ledger still holds a
        message of (None: it holds none); they are forgotten."""
        done = [epoch for epoch in self.pending if oldest is None or epoch < oldest]
        if done:
            self.pending = [epoch for epoch in self.pending if epoch not in done]
        return done
