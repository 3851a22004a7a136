"""The soak's verdict (``benchmarks._soakcheck``) and its schedule, on records made up here.

The soak itself runs in ``.ci/run`` (``make soak-ci``: a minute of real processes);
these check that its verdict fails on what it must fail on and lets through only
a SIGKILL's documented edge, and that a seed gives one scenario.
"""

from __future__ import annotations

from benchmarks._soakcheck import check_free, check_ranked
from benchmarks.soak import Schedule

ITEMS = 8


def free_rows(epochs: int, pid: str = "1", server: str = "s") -> list[list[str]]:
    """Every sample of ``epochs`` epochs once, handed out by ``pid``."""
    return [[server, str(epoch), str(position), str(position), "1", pid]
            for epoch in range(1, epochs + 1) for position in range(ITEMS)]


def test_every_sample_once_across_a_server_restart_passes() -> None:
    # The restarted server continues epoch 3 under a new id: the epochs are the job's.
    rows = free_rows(6)
    for row in rows[2 * ITEMS + 3:]:
        row[0] = "restarted"
    verdict = check_free(rows, killed=[], items=ITEMS)
    assert verdict.ok and verdict.epochs == 4 and verdict.samples == 4 * ITEMS


def test_a_lost_and_a_repeated_sample_fail() -> None:
    rows = free_rows(6)
    del rows[ITEMS + 2]  # epoch 2, position 2
    rows.append(["s", "3", "5", "5", "1", "2"])  # a second copy of epoch 3, position 5
    verdict = check_free(rows, killed=[], items=ITEMS)
    assert not verdict.ok
    assert (verdict.missing, verdict.repeated) == (1, 1)
    assert verdict.examples[0] == "epoch 2 position 2 missing"


def test_only_a_sigkilled_trainers_last_samples_may_come_again() -> None:
    # Trainer 9 handed out positions 0-3 of epoch 2, then was SIGKILLed before its marks
    # went out; trainer 1 got them again. Trainer 9 was also handed position 4 and died
    # before recording it.
    rows = free_rows(6)
    killed = [["s", "2", str(position), str(position), "1", "9"] for position in range(5)]
    rows = [*rows[:ITEMS], *killed[:4], *rows[ITEMS:ITEMS + 4], *rows[ITEMS + 5:]]
    verdict = check_free(rows, killed=["9"], items=ITEMS)
    assert verdict.ok, verdict.examples
    assert (verdict.repeated_at_kills, verdict.missing_at_kills) == (4, 1)
    # The same records from a trainer that was not killed: repeats.
    assert check_free(rows, killed=[], items=ITEMS).repeated == 4


def test_epochs_after_a_stopped_trainers_last_sample_are_not_counted() -> None:
    rows = free_rows(8)
    rows.insert(ITEMS, ["s", "2", "0", "0", "1", "5"])
    rows = [row for row in rows if not (row[1] == "2" and row[2] == "0" and row[5] == "1")]
    # Trainer 5 ran to the end with epoch 2 last: what it held was never handed out.
    assert check_free(rows, killed=[], items=ITEMS, stopped=["5"]).epochs == 1


def test_a_ranked_job_resumed_from_its_checkpoint_must_be_the_uninterrupted_sequence() -> None:
    def rank(r: int, steps: range) -> list[list[str]]:
        return [[str(step), str((step - 1) // (ITEMS // 2) + 1),
                 str(r + 2 * ((step - 1) % (ITEMS // 2))),
                 str(r + 2 * ((step - 1) % (ITEMS // 2))), "1"] for step in steps]

    # Killed at step 7 after a checkpoint at step 4: the job resumes from step 4.
    lives = [[(0, rank(r, range(1, 8))), (4, rank(r, range(5, 13)))] for r in range(2)]
    verdict = check_ranked(lives, ITEMS)
    assert verdict.ok and verdict.steps == [12, 12] and verdict.resumes == 1
    # A resumed rank that skipped a sample (its step 5 is its step 6's) fails.
    lives[1][1] = (4, rank(1, range(6, 13)))
    for row in lives[1][1][1]:
        row[0] = str(int(row[0]) - 1)
    assert check_ranked(lives, ITEMS).mismatches > 0


def test_a_seed_gives_one_schedule_clear_of_the_restart() -> None:
    assert Schedule.draw(60, 11) == Schedule.draw(60, 11) != Schedule.draw(60, 12)
    schedule = Schedule.draw(600, 5)
    for churner in schedule.churners:
        end = churner.start + (churner.seconds if churner.kill_at is None else churner.kill_at)
        assert end < schedule.restart - 3 or churner.start > schedule.restart + 3


def test_with_several_workers_a_position_keeps_its_sample() -> None:
    # Two workers' merge order numbers the samples: ids are not positions, but a
    # position holds the same sample in every epoch's deal, and an epoch holds each once.
    rows = free_rows(6)
    for row in rows:
        row[3] = str((int(row[2]) * 3) % ITEMS)  # a fixed permutation of the ids
    assert check_free(rows, killed=[], items=ITEMS).ok
    rows.append(["s", "2", "1", "5", "1", "4"])  # position 1 again, with another sample
    verdict = check_free(rows, killed=[], items=ITEMS)
    assert (verdict.repeated, verdict.wrong) == (1, 1)
