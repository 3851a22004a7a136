"""The soak's verdict on a ranked job (benchmarks._soakcheck), pure: a job restarted
before its first checkpoint continues, as its ranks do (docs/ddp.md)."""

from __future__ import annotations

from benchmarks._soakcheck import check_ranked


def _records(rank: int, steps: range, world_size: int = 2) -> list[list[str]]:
    """``step epoch position id ok`` of the uninterrupted run (epochs of 8 samples)."""
    rows = []
    for step in steps:
        epoch, slot = divmod(step - 1, 8 // world_size)
        position = rank + slot * world_size
        rows.append([str(step), str(epoch + 1), str(position), str(position), "1"])
    return rows


def test_a_job_restarted_before_any_checkpoint_continues_its_ranks_shares() -> None:
    # The 10-minute soak's first SIGKILL came before the first common checkpoint: the job
    # restarted from step 0 and its ranks rightly went on from their predecessors' last
    # hand-outs, which the check took for 3680 samples off the uninterrupted sequence.
    lives = [[(0, _records(rank, range(1, 4))),
              (0, [[str(int(row[0]) - 3), *row[1:]] for row in _records(rank, range(4, 10))])]
             for rank in range(2)]
    verdict = check_ranked(lives, items=8)
    assert verdict.mismatches == 0, verdict.examples
    assert verdict.steps == [9, 9]


def test_a_rank_that_started_over_from_the_first_position_is_off() -> None:
    lives = [[(0, _records(rank, range(1, 4))), (0, _records(rank, range(1, 4)))]
             for rank in range(2)]
    assert check_ranked(lives, items=8).mismatches == 6
