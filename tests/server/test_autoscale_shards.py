"""The shards' assignment and ledger: an earlier owner's (or run's) messages never count."""

from __future__ import annotations

import itertools

import pytest

from feedmux.errors import FeedmuxError
from feedmux.server._sources.assignment import ShardLedger, pack_shard, plan_owners, unpack_shard


def test_a_new_run_never_reuses_a_ticket_of_an_earlier_one() -> None:
    # Found by a resumed job: the first run's last messages carried the new run's tickets.
    tickets = itertools.count(1)
    first = ShardLedger(2, tickets)
    old = first.assign(0, epoch=1, position=0)
    second = ShardLedger(2, tickets)
    new = second.assign(0, epoch=2, position=0)
    assert new != old
    assert not second.take_data(0, old, epoch=3, start=64, count=8)
    assert second.take_data(0, new, epoch=2, start=0, count=8)


def test_a_moved_shard_resumes_after_what_the_server_took() -> None:
    ledger = ShardLedger(1)
    first = ledger.assign(0, 1, 0)
    assert ledger.take_data(0, first, 1, 0, 16)
    assert ledger.take_data(0, first, 1, 16, 5)
    assert ledger.resume_point(0) == (1, 21)
    second = ledger.assign(0, *ledger.resume_point(0))
    assert not ledger.take_data(0, first, 1, 21, 11)  # the old owner's, still on its way
    assert ledger.take_data(0, second, 1, 21, 11)
    assert not ledger.take_end(0, first, 1)
    assert ledger.take_end(0, second, 1)
    assert ledger.resume_point(0) == (2, 0)


def test_a_gap_in_a_shard_under_its_own_ticket_is_a_clear_error() -> None:
    ledger = ShardLedger(1)
    ticket = ledger.assign(0, 1, 0)
    with pytest.raises(FeedmuxError, match="expected shard 0's samples from epoch 1 position 0, "
                                           "got epoch 1 position 5"):
        ledger.take_data(0, ticket, 1, 5, 3)


@pytest.mark.parametrize(("owners", "slots"), [
    ([0] * 12, [0, 1, 2]), ([0, 1, 2, 3] * 3, [0, 2]), ([0, 1] * 6, [0, 1, 2, 3]),
    ([-1] * 5, [3]), ([0, 1, 2] * 4, [1]),
])
def test_owners_are_balanced_and_only_the_needed_shards_move(
        owners: list[int], slots: list[int]) -> None:
    planned = plan_owners(owners, slots)
    counts = [planned.count(slot) for slot in slots]
    assert set(planned) <= set(slots) and max(counts) - min(counts) <= 1
    share = -(-len(owners) // len(slots))
    kept = sum(1 for before, after in zip(owners, planned, strict=True) if before == after)
    assert kept >= sum(min(owners.count(slot), share - 1) for slot in slots)


def test_shard_and_ticket_travel_in_one_number() -> None:
    assert unpack_shard(pack_shard(1023, 2**40)) == (1023, 2**40)


def _runner_ids(part: object, start: tuple[int, int], ticket: int, messages: int) -> list[int]:
    """The ids a ShardRunner of ``part`` sends in its first ``messages`` messages."""
    from feedmux.protocol import Data, decode
    from feedmux.server._sources.meters import SamplerMeter
    from feedmux.server._sources.producer import Draw
    from feedmux.server._sources.runner import ShardRunner
    from feedmux.server.config import ServerConfig

    config = ServerConfig("x:y", seed=4, samples_per_message=4)
    runner = ShardRunner(part, 0, 1, config, ticket, start, 8, Draw(None, None))
    ids: list[int] = []

    def send(frames: list[object]) -> bool:
        message = decode(frames)
        if isinstance(message, Data):
            ids.extend(int(sample["id"]) for sample in message.samples)
        return True

    for _ in range(messages):
        runner.step(send, SamplerMeter())
    runner.close()
    return ids


def test_a_shard_that_comes_back_to_a_worker_resumes_where_the_server_stands() -> None:
    # Found by exact-epoch tests under changes: a process that had run the shard before
    # counted its mux's passes on from there, and drew another epoch's order.
    from tests.integration.samplers import numbered

    whole = _runner_ids(numbered(streams=2, per_stream=12), (1, 0), 1, 6)
    part = numbered(streams=2, per_stream=12)
    first = _runner_ids(part, (1, 0), 1, 2)  # 8 samples, then the shard moves away
    again = _runner_ids(part, (1, 8), 2, 4)  # and comes back at position 8
    assert first + again == whole[:len(first) + len(again)]
