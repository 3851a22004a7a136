"""Every combination of delivery modes, end to end, with a trainer SIGKILLed and restarted.

{free, ranked} x {one group, two groups} x {sockets, shared memory} x
{--workers 1, 2}: real server and trainer processes, 2 epochs, one trainer
killed mid-epoch 1 and started again. Each cell checks what its mode promises
(docs/server.md, docs/ddp.md, docs/groups.md): free trainers hand out every
sample exactly once across the kill (the default: there is no at-most-once
delivery left to choose); a restarted rank continues right after its
predecessor; with two groups, each group on its own, and the group without the
kill gets everything exactly once (groups on a server started with no group
flag). A combination the server refuses today asserts
today's refusal (``REFUSED_TODAY``) and one where shared memory is off today
asserts that, and the reason the server logs (``NO_SHM_TODAY``): both fail, to be
updated, the day the combination works. Run by ``make test-matrix`` and
``.ci/run``, not by ``make test``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.kill_restart import (
    CELLS,
    DIE_AFTER,
    EPOCH,
    EPOCHS,
    Cell,
    Outcome,
    Record,
    kill_and_restart,
    refusal_of,
)

pytestmark = [pytest.mark.matrix, pytest.mark.timeout(300)]

#: Combinations refused today, with the start of the refusal each one gets (first match):
#: by the loader itself, or by the server's combination table (feedmux.server.config.REFUSED).
REFUSED_TODAY: list[tuple[Callable[[Cell], bool], str]] = []

#: Where the pool is off today although the server has one, with the start of the reason
#: the server logs (feedmux.server.config.OFF).
NO_SHM_TODAY: list[tuple[Callable[[Cell], bool], str]] = []

EVERY_SAMPLE = Counter((epoch, sample_id) for epoch in range(1, EPOCHS + 1)
                       for sample_id in range(EPOCH))


def today_refused(cell: Cell) -> str | None:
    return next((message for applies, message in REFUSED_TODAY if applies(cell)), None)


@pytest.mark.parametrize("cell", CELLS, ids=[cell.name for cell in CELLS])
def test_a_killed_and_restarted_trainer_keeps_the_modes_promise(
    cell: Cell, serve: Callable[..., Any], spawn: Callable[..., Any], tmp_path: Path
) -> None:
    refused = today_refused(cell)
    if refused is not None:
        stderr = refusal_of(cell, spawn, tmp_path)
        assert refused in stderr, (
            f"{cell.name} is refused today with {refused!r}; if it now works, move it out of "
            f"REFUSED_TODAY. What it said:\n{stderr}")
        return
    outcome = kill_and_restart(cell, serve, tmp_path)
    records = outcome.records
    assert len(records["doomed"]) == DIE_AFTER
    assert records["restarted"], "the restarted trainer got nothing"
    if cell.ranked:
        check_ranks(records["survivor"], records["doomed"] + records["restarted"], world_size=2)
    else:
        killed_group = records["survivor"] + records["doomed"] + records["restarted"]
        check_free(killed_group)
    if cell.groups:
        undisturbed = records["undisturbed"]
        if cell.ranked:
            check_ranks(undisturbed, world_size=1)
        else:
            check_free(undisturbed)
    check_carrier(cell, outcome)


def check_free(records: Record) -> None:
    """Free trainers: every sample of every epoch handed out exactly once."""
    handed = Counter((row[0], row[1]) for row in records)
    repeated = sorted(key for key, count in handed.items() if count > 1)
    assert not repeated, f"samples handed out twice: {repeated[:10]}"
    assert not handed.keys() - EVERY_SAMPLE.keys(), "samples outside the stream"
    lost = sorted(EVERY_SAMPLE.keys() - handed.keys())
    assert not lost, f"{len(lost)} sample(s) lost: {lost[:10]}"


def check_ranks(*ranks: Record, world_size: int) -> None:
    """Each rank takes exactly its positions in order; each epoch has every sample once."""
    for rank, record in enumerate(ranks):
        positions = [(row[0], row[2]) for row in record]
        assert positions == [(epoch, position) for epoch in range(1, EPOCHS + 1)
                             for position in range(rank, EPOCH, world_size)], (
            f"rank {rank} took positions out of order, twice or not at all")
    handed = Counter((row[0], row[1]) for record in ranks for row in record)
    assert handed == EVERY_SAMPLE, "an epoch does not hold every sample exactly once"


def check_carrier(cell: Cell, outcome: Outcome) -> None:
    """Same-host trainers get views of the pool where it is on, and none where it is off."""
    off = next((reason for applies, reason in NO_SHM_TODAY if applies(cell)), None)
    if not cell.shm:
        assert outcome.views == 0, "views of a pool with --no-shm"
    elif off is not None:
        assert outcome.views == 0, (
            f"{cell.name}: shared memory is off today ({off}); views came, so it works "
            "now: update NO_SHM_TODAY")
        assert off in outcome.server_log, f"the server did not say why the pool is off: {off}"
    else:
        assert outcome.views > 0, f"{cell.name}: no sample came as a view of the pool"
