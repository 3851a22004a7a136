"""The control core as the data path sees it: the few things a stage reads or tells it.

The stages of this package deal to trainers that the control core
(:mod:`feedmux.server._control.core`) admits, ranks and forgets. They ask it a
few things: the trainers connected (each one's record), the live members of each
group, who holds a rank, and they tell it what was sent and which given-up
group's trainers are gone. This module states those things as
:class:`typing.Protocol` classes, one per kind of stage (:class:`TrainerRegistry`
for the carrier and the pool, :class:`DealerControl` for the dealer,
:class:`FanoutControl` for the groups' fan-out), which
:class:`~feedmux.server._control.core.ControlCore` meets as it is, and the one
reading over them (:func:`shm_trainers`). So the data path never imports the
control core: a stage knows the questions, not who answers them, and a test can
answer them with a few lines. It must never hold state or decide anything.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from feedmux.protocol import Message
from feedmux.server._delivery.batches import BatchRequest
from feedmux.server._delivery.ledger import Ledger
from feedmux.server.config import ServerConfig

__all__ = ["DealerControl", "FanoutControl", "GroupRanks", "RankHolders", "Send", "Sends",
           "TrainerRecord", "TrainerRegistry", "shm_trainers"]

#: A control message and the identity it goes to.
Send = tuple[bytes, Message]
Sends = Sequence[Send]


class TrainerRecord(Protocol):
    """What the data path reads of one connected trainer."""

    @property
    def client_id(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def shm(self) -> bool:
        """It mapped this server's shared-memory pool."""


class TrainerRegistry(Protocol):
    """The trainers connected, by control-socket identity."""

    @property
    def trainers(self) -> Mapping[bytes, TrainerRecord]: ...


class DealerControl(Protocol):
    """What the dealer asks the control core, and tells it."""

    @property
    def config(self) -> ServerConfig: ...

    def batch_shape(self, client_id: bytes) -> tuple[int, bool, str]:
        """A free trainer's ``(batch_size, drop_last, bucket_by)``, by data-socket identity."""

    def batch_shapes(self, audience: str,
                     refused: Collection[bytes] = ()) -> set[tuple[int, bool, str]]:
        """The batch shapes the live trainers of ``audience`` asked for."""

    def data_sent(self, n_samples: int, epoch: int) -> None:
        """A data message of ``n_samples`` of ``epoch`` went to a trainer."""


class RankHolders(Protocol):
    """One audience's ranks: a ranked job's world size and who holds each rank."""

    @property
    def ranked(self) -> bool: ...

    @property
    def world_size(self) -> int | None: ...

    @property
    def holders(self) -> Mapping[int, tuple[bytes, str]]: ...

    def holder(self, rank: int) -> tuple[bytes, str] | None: ...

    @property
    def resumed(self) -> tuple[int, ...]:
        """The resume announcement the job's ranks agreed on (``()``: a fresh start)."""

    @property
    def resumed_at(self) -> tuple[int, int] | None:
        """The ``(epoch, position)`` the job resumed at, or None."""


class GroupRanks(Protocol):
    """Every group's ranks, the ledger of each ranked group and its batch request."""

    def of(self, group: str) -> RankHolders: ...

    def retention_of(self, group: str) -> Ledger: ...

    def batches_of(self, group: str) -> BatchRequest: ...

    def forget(self, group: str) -> None: ...


class FanoutControl(TrainerRegistry, Protocol):
    """What the consumer groups' fan-out asks the control core, and tells it."""

    @property
    def epoch(self) -> int: ...

    @property
    def epochs_completed(self) -> int: ...

    @property
    def tables(self) -> GroupRanks: ...

    def live_members(self, now: float) -> dict[str, list[bytes]]:
        """Each group's live trainers, by data-socket identity."""

    def rank_target(self, rank: int, group: str = "") -> bytes | None:
        """The data-socket identity of the holder of ``rank`` in ``group``, if live."""

    def peer_gone(self, identity: bytes) -> None:
        """The trainer of ``identity`` is gone (its group was given up)."""

    def gave_up(self, identity: bytes, lost: bool = True) -> None:
        """``identity``'s group was given up, and it was told why."""

    def data_sent(self, n_samples: int, epoch: int) -> None: ...


def shm_trainers(registry: TrainerRegistry) -> set[bytes]:
    """The data-socket identities of the trainers that mapped the pool."""
    return {trainer.client_id.encode() for trainer in list(registry.trainers.values())
            if trainer.shm}
