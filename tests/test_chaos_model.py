"""The chaos test's model (benchmarks._chaos_model): seeded set-ups and schedules, pure.

What a chaos run does is drawn from its seed alone, so that ``--seed S``
replays it: the same seed gives the same set-up and the same events, and the
schedule respects the model's bounds (free trainers between the least and the
most, a rank's stop inside an epoch). The runs themselves are real processes:
``python -m benchmarks.chaos`` (docs/chaos.md), and tests/integration/test_audit.py
runs its ranks.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import chaos
from benchmarks._chaos_model import (
    EPOCH,
    EVENTS,
    FOCUS,
    FREE_LOADER,
    FREE_SERVER,
    MAX_FREE,
    MIN_FREE,
    draw,
)


@pytest.mark.parametrize("focus", sorted(FOCUS))
def test_a_seed_replays_its_set_up_and_schedule(focus: str) -> None:
    assert draw(7, FOCUS[focus], 2) == draw(7, FOCUS[focus], 2)
    assert draw(7, FOCUS[focus], 2).describe() == draw(7, FOCUS[focus], 2).describe()


def test_seeds_draw_different_schedules_of_known_events() -> None:
    schedules = {draw(seed, FOCUS["mix"], 2).events for seed in range(10)}
    assert len(schedules) == 10
    kinds = {event.kind for events in schedules for event in events}
    assert kinds <= set(EVENTS) and len(kinds) >= 6


@pytest.mark.parametrize("seed", range(30))
def test_the_free_trainers_stay_within_the_bounds(seed: int) -> None:
    setup = draw(seed, FOCUS["server-restart"], 3)
    free = setup.scenario.free
    for event in setup.events:
        free += {"join": 1, "leave": -1, "kill-free": -1}.get(event.kind, 0)
        assert MIN_FREE <= free <= MAX_FREE


@pytest.mark.parametrize("seed", range(30))
def test_a_rank_restart_stops_inside_an_epoch_of_the_run(seed: int) -> None:
    setup = draw(seed, FOCUS["rank-restart"], 1)
    (event,) = setup.events
    per_epoch = -(-EPOCH[setup.scenario.source] // setup.ranks)
    assert event.kind == "kill-rank" and event.how == "alone" and 0 <= event.target < 2
    assert 1 <= event.step <= per_epoch * (setup.scenario.ranked_epochs or 0)
    assert event.step % per_epoch not in (0, per_epoch - 1)  # neither an epoch's last step


def test_the_checkpoint_scenario_restarts_a_killed_rank_with_its_job() -> None:
    hows = {event.how for seed in range(20)
            for event in draw(seed, FOCUS["checkpoint"], 2).events if event.kind == "kill-rank"}
    assert hows == {"job"}


def test_free_delivery_flags_are_said_in_one_place() -> None:
    # The trainers and the servers take them from the model: acknowledged delivery is the
    # default, so none is passed (reliable= and --reliable are deprecated no-ops).
    assert FREE_LOADER == {} and FREE_SERVER == ()
    assert "loader defaults, server defaults" in draw(1, FOCUS["mix"], 1).describe()


def test_the_sources_have_the_epochs_the_model_counts() -> None:
    assert sum(1 for _ in chaos.source().iterate()) == EPOCH["benchmarks.chaos:source"]
    assert sum(1 for _ in chaos.small_source().iterate()) == EPOCH[
        "benchmarks.chaos:small_source"]


def test_list_names_every_scenario_and_event(capsys: pytest.CaptureFixture[str]) -> None:
    assert chaos.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}:" in out for name in FOCUS) and all(kind in out for kind in EVENTS)


def _spawn_python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_reference_run_may_last_while_its_logs_grow(tmp_path: Path) -> None:
    """A reference run that is slow but writing is waited for; one that stands still is
    named (the long mix's reference failed a fixed 180 s bound on a busy machine)."""
    from benchmarks._chaos_run import _progressing

    log = tmp_path / "rank0.log"
    writer = _spawn_python(
        "import time\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    for _ in range(15):\n"
        "        f.write('x'); f.flush(); time.sleep(0.1)\n")
    assert _progressing([writer], [log], stall=1.0, cap=30.0) is None
    assert writer.returncode == 0

    still = _spawn_python("import time; time.sleep(30)")
    try:
        started = time.monotonic()
        problem = _progressing([still], [tmp_path / "never.log"], stall=0.5, cap=30.0)
        assert problem is not None and "stood still for 0.5 s" in problem
        assert time.monotonic() - started < 10
    finally:
        still.kill()
        still.wait()


def test_the_mix_has_free_trainers_that_ask_for_batches() -> None:
    # The server cuts their batches as it deals, from the stream the others take samples of.
    size = FOCUS["mix"].free_batch
    assert size > 1 and f"the odd ones batch_size={size}" in draw(1, FOCUS["mix"], 1).describe()
    ids, rows = np.array([3, 4]), np.array([[3, 3], [4, 4]])
    assert chaos._exact({"id": ids, "x": rows}) and not chaos._exact({"id": ids, "x": rows.T})
