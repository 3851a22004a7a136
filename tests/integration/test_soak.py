"""The soak's verdict (``benchmarks._soakcheck``) and its schedule, on records made up here.

The soak itself runs in ``.ci/run`` (``make soak-ci``: a minute of real processes);
these check that its verdict fails on what it must fail on and lets through only
a SIGKILL's documented edge, and that a seed gives one scenario.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks._soakcheck import (
    KILL_WINDOW,
    FreeVerdict,
    _example,
    _ids_twice,
    check_free,
    check_ranked,
)
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


# -- the typed-array check against the plain one --------------------------------------------
def reference_check_free(records: Iterable[Sequence[str]], killed: Iterable[str], items: int,
               stopped: Iterable[str] = ()) -> FreeVerdict:
    """The soak's check as it was before its records went into typed arrays (a
    dict and lists per record): the reference the arrays must agree with."""
    killed = set(killed)
    ids: dict[tuple[int, int], str] = {}  # a seeded run: one sample per (epoch, position)
    copies: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    tail: dict[str, list[tuple[int, int]]] = defaultdict(list)  # pid -> its (epoch, position)s
    verdict = FreeVerdict()
    last_epoch = 0
    pids: dict[str, str] = {}  # one string per trainer, not one per record
    for _, epoch_text, position_text, id_text, ok, pid_text in records:
        pid = pids.setdefault(pid_text, pid_text)
        key = (int(epoch_text), int(position_text))
        epoch = key[0]
        index = len(tail[pid])
        tail[pid].append(key)
        copies[key].append((pid, index))
        last_epoch = max(last_epoch, epoch)
        if ok != "1" or ids.setdefault(key, id_text) != id_text:
            verdict.wrong += 1
    ends = [tail[pid][-1][0] for pid in stopped if tail[pid]]
    complete = range(1, min([last_epoch - 1, *ends]))
    edges = {(epoch, position + 1) for pid in killed for epoch, position in tail[pid][-1:]}
    verdict.epochs = len(complete)
    twice = _ids_twice({key: value for key, value in ids.items() if key[0] in complete})
    verdict.wrong += sum(twice.values())
    for epoch in complete:
        for position in range(items):
            found = copies.get((epoch, position), [])
            verdict.samples += len(found)
            if not found:
                if (epoch, position) in edges:
                    verdict.missing_at_kills += 1
                else:
                    verdict.missing += 1
                    _example(verdict, f"epoch {epoch} position {position} missing")
                continue
            extra = len(found) - 1
            if not extra:
                continue
            at_kill = sum(1 for pid, index in found
                          if pid in killed and index >= len(tail[pid]) - KILL_WINDOW)
            explained = min(extra, at_kill)
            verdict.repeated_at_kills += explained
            verdict.repeated += extra - explained
            if extra > explained:
                _example(verdict, f"epoch {epoch} position {position} handed out "
                                  f"{len(found)} times (pids {[pid for pid, _ in found]})")
    return verdict


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_array_check_agrees_with_the_plain_one(data: st.DataObject) -> None:
    epochs = data.draw(st.integers(1, 6))
    rows = free_rows(epochs)
    for row in rows:  # a few trainers share the work
        row[5] = str(data.draw(st.integers(1, 3)))
    edits = data.draw(st.lists(st.tuples(st.sampled_from(["drop", "copy", "id", "bad", "pid"]),
                                         st.integers(0, 10_000)), max_size=12))
    for edit, at in edits:
        if not rows:
            break
        row = rows[at % len(rows)]
        if edit == "drop":
            rows.remove(row)
        elif edit == "copy":
            rows.insert(at % (len(rows) + 1), [*row[:5], str(1 + at % 4)])
        elif edit == "id":
            rows.insert(at % (len(rows) + 1), [*row[:3], str(at % ITEMS), *row[4:]])
        elif edit == "bad":
            row[4] = "0"
        else:
            row[5] = "4"
    killed = data.draw(st.lists(st.sampled_from(["1", "2", "3", "4", "9"]), max_size=2))
    stopped = data.draw(st.lists(st.sampled_from(["1", "2", "3", "4"]), max_size=2))
    assert check_free(rows, killed, ITEMS, stopped) == reference_check_free(rows, killed, ITEMS,
                                                                             stopped)
