"""The ``--workers auto`` decision (a pure object), driven by synthetic and noisy traces."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from feedmux.server._sources.autoscale import (
    CEILING_SECONDS,
    Autoscaler,
    Change,
    Signals,
)
from feedmux.server._sources.scaling import idle_cpu_seconds
from feedmux.server._sources.shards import DEFAULT_SHARDS
from feedmux.server.config import parse_workers


def run(scaler: Autoscaler, capacity: Callable[[float, int], float], demand: float,
        seconds: float, start: int = 1, noise: float = 0.0, seed: int = 0,
        cpu_per_sample: float | None = 0.0001) -> tuple[list[tuple[float, int]], list[Change]]:
    """Feed ``scaler`` one window a second: the workers sample ``capacity(now, n)``/s, the
    trainers take ``demand``/s. Returns the count after each window and every change."""
    draw = random.Random(seed)
    count, trace, changes = start, [], []
    now = 0.0
    while now < seconds:
        now += 1.0
        can = capacity(now, count) * (1 + draw.uniform(-noise, noise))
        rate = min(can, demand)
        busy = min(1.0, rate / can) * (1 + draw.uniform(-noise, noise) / 2)
        blocked = 1.0 - demand / can if can > demand else 0.0
        waited = 1.0 - can / demand if can < demand else 0.0
        cpu = None if cpu_per_sample is None else rate * cpu_per_sample
        change = scaler.observe(now, Signals(count, min(busy, 1.0), blocked, rate, waited, cpu))
        if change is not None:
            changes.append(change)
            count = change.target
        trace.append((now, count))
    return trace, changes


def io_bound(now: float, count: int) -> float:
    """Each worker waits 2 ms a sample and uses little CPU: 500/s each, no CPU limit."""
    return 500.0 * count


def cpu_bound(cpus: int) -> Callable[[float, int], float]:
    def capacity(now: float, count: int) -> float:
        return 1000.0 * min(count, cpus)
    return capacity


def test_an_io_bound_sampler_grows_until_it_meets_the_trainers_and_stops() -> None:
    scaler = Autoscaler(1, 16, cpus=2)
    trace, changes = run(scaler, io_bound, demand=4000.0, seconds=60)
    assert trace[-1][1] in (8, 9), changes  # 8 x 500/s meets 4000/s
    # The trainers waited 88% at one worker (8x the rate asked for, 4x at most), then 50%
    # at four: two changes, the second 2 s after the first.
    assert [change.target for change in changes] == [4, 8]
    assert min(now for now, count in trace if count == 8) <= 5.0
    assert "trainers waited" in changes[0].reason and "workers busy" in changes[0].reason


def test_a_growth_is_held_to_the_idle_cpus() -> None:
    # Each worker uses 0.3 of a CPU (300/s at 1 ms of CPU a sample): 2 CPUs hold 6.7 of
    # them, whatever the trainers ask for. 1 -> 4 (4x at most), then 4 -> 7 (the idle 0.8
    # CPU holds 2.7 more); at 7 the CPUs are used up and the growth stops.
    def third_cpu(now: float, count: int) -> float:
        return 300.0 * min(count, 20 / 3)

    scaler = Autoscaler(1, 16, cpus=2)
    trace, changes = run(scaler, third_cpu, demand=100_000.0, seconds=60,
                         cpu_per_sample=0.001)
    assert [change.target for change in changes] == [4, 7], changes
    assert max(count for _, count in trace) == 7


def test_what_else_uses_the_cpus_leaves_fewer_workers() -> None:
    # Two CPU-bound workers on 2 CPUs get 0.75 each; the server's threads and a trainer
    # on this host take the rest: nothing idle, so no third is added (counting only the
    # workers' own CPU, this went to 3, and back to 2 when it did not pay).
    scaler = Autoscaler(1, 16, cpus=2)
    starving = Signals(2, busy=0.98, blocked=0.0, rate=1500.0, trainer_wait=0.5, cpu=1.5,
                       idle=0.1)
    assert all(scaler.observe(float(second), starving) is None for second in range(10))
    # The idle CPUs bound how many fit: 1.2 idle at 0.1 a worker is 12 more; 4x at most.
    assert Autoscaler(1, 16, cpus=2).grown(
        Signals(2, 0.98, 0.0, 900.0, trainer_wait=0.9, cpu=0.2, idle=1.2)) == 8
    # 0.25 a worker: 0.9 idle holds 3.6 more: 4.
    assert Autoscaler(1, 16, cpus=2).grown(
        Signals(2, 0.98, 0.0, 900.0, trainer_wait=0.9, cpu=0.5, idle=0.9)) == 6
    # A CPU-bound pair that leaves 0.15 CPU idle (a fifth of a worker's share): no third.
    assert Autoscaler(1, 16, cpus=2).grown(
        Signals(2, 0.98, 0.0, 1600.0, trainer_wait=0.5, cpu=1.5, idle=0.15)) == 2
    # A CPU-bound worker next to a trainer and the server: 0.3 idle is enough for one more.
    assert Autoscaler(1, 16, cpus=2).grown(
        Signals(1, 0.98, 0.0, 900.0, trainer_wait=0.5, cpu=1.0, idle=0.3)) == 2


def test_workers_that_mostly_wait_grow_by_one_on_a_host_with_nothing_idle() -> None:
    # An I/O-bound sampler (3 ms of waiting a sample, a few percent of a CPU a worker)
    # on a host whose CPUs other jobs keep busy: the idle CPUs hold no worker, but one
    # more costs little, so it is tried and the rate judges it (a loaded test run saw
    # 1 worker at 250 samples/s for 60 s, never grown). CPU-bound workers do not.
    scaler = Autoscaler(1, 16, cpus=2)
    waiting = Signals(1, busy=0.98, blocked=0.0, rate=250.0, trainer_wait=0.6, cpu=0.04,
                      idle=0.0)
    assert scaler.grown(waiting) == 2
    first = next(change for second in range(4)
                 if (change := scaler.observe(float(second), waiting)) is not None)
    assert first.target == 2 and first.reason.startswith("trainers waited 60%"), first
    assert Autoscaler(1, 16, cpus=2).grown(
        Signals(2, 0.98, 0.0, 900.0, trainer_wait=0.5, cpu=0.6, idle=0.0)) == 2


def test_cpu_bound_workers_are_never_more_than_the_usable_cpus() -> None:
    # Workers that use a CPU each: however idle the host reads (other jobs just ended)
    # and however long the trainers wait, at most one per usable CPU.
    scaler = Autoscaler(1, 16, cpus=2)
    assert scaler.grown(Signals(2, 0.99, 0.0, 2000.0, trainer_wait=0.9, cpu=1.9,
                                idle=1.5)) == 2
    assert scaler.grown(Signals(1, 0.99, 0.0, 1000.0, trainer_wait=0.9, cpu=0.95,
                                idle=1.9)) == 2
    # Three that turned CPU-bound (grown while they waited on I/O): back to two, the
    # reason quoting what each used.
    three = Signals(3, busy=0.99, blocked=0.0, rate=2000.0, trainer_wait=0.9, cpu=2.4,
                    idle=0.0)
    changes = [change for second in range(2)
               if (change := scaler.observe(float(second), three)) is not None]
    assert [change.target for change in changes] == [2], changes
    assert changes[0].reason == ("3 workers used 80% of a CPU each, 2 CPU(s) usable: "
                                 "CPU-bound workers are at most one per CPU")
    # ``auto:MIN-MAX``'s minimum still holds.
    assert Autoscaler(3, 16, cpus=2).observe(0.0, three) is None
    # Workers that mostly wait (a tenth of a CPU each) may go past the CPUs.
    assert Autoscaler(1, 16, cpus=2).grown(Signals(4, 0.99, 0.0, 2000.0, trainer_wait=0.9,
                                                   cpu=0.4, idle=1.6)) == 16


def test_the_idle_cpus_are_read_for_the_usable_cpus_only(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 10 1000 50 0 0 0 0 0\n"
                    "cpu0 5 0 5 600 20 0 0 0 0 0\n"
                    "cpu1 5 0 5 400 30 0 0 0 0 0\n"
                    "intr 12345\n")
    ticks = os.sysconf("SC_CLK_TCK")
    assert idle_cpu_seconds({1}, str(stat)) == pytest.approx(430 / ticks)
    assert idle_cpu_seconds({0, 1}, str(stat)) == pytest.approx(1050 / ticks)
    assert idle_cpu_seconds({0}, str(tmp_path / "missing")) is None


def test_a_jump_stops_at_the_ceiling_of_a_growth_that_did_not_pay() -> None:
    # 3 -> 12 did not pay: back to 3, which is the ceiling for CEILING_SECONDS. Fed
    # trainers take it down to 2; starving again, they ask for 8, but the jump stops at 3.
    scaler = Autoscaler(1, 16, cpus=8)
    now = 0.0

    def until_change(signals: Signals) -> Change:
        nonlocal now
        for _ in range(10):
            now += 1.0
            change = scaler.observe(now, signals)
            if change is not None:
                return change
        raise AssertionError(f"no change in 10 windows of {signals}")

    assert until_change(Signals(3, 0.97, 0.0, 1000.0, trainer_wait=0.8, cpu=0.3)).target == 12
    back = until_change(Signals(12, 0.97, 0.0, 1010.0, trainer_wait=0.8, cpu=1.2))
    assert back.target == 3 and "back to 3" in back.reason
    assert until_change(Signals(3, 0.3, 0.0, 1000.0, trainer_wait=0.0, cpu=0.1)).target == 2
    jump = until_change(Signals(2, 0.97, 0.0, 1000.0, trainer_wait=0.8, cpu=0.2))
    assert jump.target == 3 and now < CEILING_SECONDS, (jump, now)


def test_without_the_workers_cpu_it_grows_by_half() -> None:
    # Without the workers' CPU use (no /proc) nothing bounds a jump but the rate rule:
    # it grows by half the count, as before the budget.
    scaler = Autoscaler(1, 16, cpus=2)
    _, changes = run(scaler, io_bound, demand=4000.0, seconds=60, cpu_per_sample=None)
    assert [change.target for change in changes] == [2, 3, 4, 6, 9]


def test_without_the_trainers_report_it_doubles() -> None:
    signals = Signals(workers=3, busy=0.95, blocked=0.0, rate=900.0, trainer_wait=None,
                      cpu=0.2)
    assert Autoscaler(1, 16, cpus=2).grown(signals) == 6


@pytest.mark.parametrize("cpu_per_sample", [0.001, None])
def test_a_cpu_bound_sampler_never_runs_more_than_the_cores_plus_one(
        cpu_per_sample: float | None) -> None:
    # With the workers' CPU use known, it stops at the cores; without, when one more
    # worker did not raise the rate (it tried 3, went back to 2, holds that ceiling).
    scaler = Autoscaler(1, 16, cpus=2)
    trace, changes = run(scaler, cpu_bound(2), demand=10_000.0, seconds=120,
                         cpu_per_sample=cpu_per_sample)
    assert max(count for _, count in trace) <= 3
    assert trace[-1][1] == 2, changes
    if cpu_per_sample is None:
        assert any("back to 2" in change.reason for change in changes), changes
        assert max(count for _, count in trace) == 3


def test_a_trainer_bound_run_shrinks_to_the_minimum() -> None:
    scaler = Autoscaler(2, 16, cpus=8)
    trace, changes = run(scaler, io_bound, demand=300.0, seconds=60, start=8)
    assert trace[-1][1] == 2, changes
    # The trainers report that they hardly wait: that is the reason given.
    assert all(change.reason.startswith("trainers waited 0% of the last 1 s")
               for change in changes), changes


def test_the_maximum_and_the_minimum_hold() -> None:
    scaler = Autoscaler(1, 3, cpus=64)
    trace, _ = run(scaler, io_bound, demand=100_000.0, seconds=60)
    assert max(count for _, count in trace) == 3
    scaler = Autoscaler(3, 5, cpus=64)
    trace, _ = run(scaler, io_bound, demand=10.0, seconds=60, start=5)
    assert min(count for _, count in trace) == 3


@pytest.mark.parametrize("seed", range(5))
def test_noisy_signals_do_not_flap(seed: int) -> None:
    print(f"seed {seed}")
    scaler = Autoscaler(1, 16, cpus=2, min_interval=2.0)
    trace, changes = run(scaler, io_bound, demand=2000.0, seconds=300, noise=0.15, seed=seed)
    # Up to 4 workers (2000/s), then at most a few corrections in five minutes.
    assert len(changes) <= 8, changes
    assert all(abs(count - 4) <= 1 for _, count in trace[60:]), trace[60:]
    times = [now for (_, before), (now, count) in itertools.pairwise(trace)
             if count != before]
    assert all(b - a >= 2.0 for a, b in itertools.pairwise(times)), times


def test_a_sampler_that_becomes_four_times_slower_is_followed() -> None:
    def slowing(now: float, count: int) -> float:
        return 500.0 * count if now < 40 else 125.0 * count

    scaler = Autoscaler(1, 16, cpus=2)
    trace, changes = run(scaler, slowing, demand=1000.0, seconds=40 + CEILING_SECONDS)
    at = dict(trace)
    assert at[39.0] == 2
    assert trace[-1][1] >= 8, changes
    assert min(now for now, count in trace if now > 40 and count >= 8) <= 40 + 15.0


def test_a_trace_of_single_windows_changes_nothing() -> None:
    # Hysteresis: a condition must hold for `patience` windows in a row.
    scaler = Autoscaler(1, 16, cpus=8, patience=2)
    starving = Signals(1, busy=0.99, blocked=0.0, rate=100.0, trainer_wait=0.5)
    quiet = Signals(1, busy=0.5, blocked=0.0, rate=100.0, trainer_wait=0.0)
    for second in range(20):
        assert scaler.observe(float(second), starving if second % 2 else quiet) is None


@pytest.mark.parametrize(("text", "expected"), [
    ("4", (4, 4, False)), ("auto", (1, 16, True)), ("auto:6", (1, 6, True)),
    ("auto:2-5", (2, 5, True)), (2, (2, 2, False)),
])
def test_the_workers_option(text: str | int, expected: tuple[int, int, bool]) -> None:
    parsed = parse_workers(text)
    assert (parsed.minimum, parsed.maximum, parsed.auto) == expected


@pytest.mark.parametrize("text", ["0", "auto:5-2", "auto:", "many", "auto:0-3", True])
def test_a_bad_workers_option_says_what_was_expected(text: str | bool) -> None:
    with pytest.raises(ValueError, match=r"expected workers N >= 1, 'auto'.*got"):
        parse_workers(text)


def test_auto_runs_at_most_as_many_workers_as_there_are_shards_by_default() -> None:
    assert parse_workers("auto").maximum == DEFAULT_SHARDS


def test_top_shows_the_worker_changes_and_the_last_reason() -> None:
    from feedmux.apps.top import describe

    stats = {"server_id": "s", "uptime_s": 10.0, "samples_sent": 10, "workers": 3,
             "worker_changes": 2, "workers_auto": 1,
             "worker_change_reason": "the data path never waited for trainers"}
    line = describe("tcp://h:5556", stats, None)[0]
    assert ("3 worker(s) (auto, 2 change(s), last: the data path never waited for "
            "trainers)") in line



def reported(busy: float, blocked: float, wait: float | None, workers: int = 2) -> Signals:
    return Signals(workers, busy=busy, blocked=blocked, rate=100.0 * workers, trainer_wait=wait)


def decide(scaler: Autoscaler, signals: Signals, windows: int = 3) -> Change | None:
    """The change after ``windows`` windows of ``signals``, one a second (None: none)."""
    change = None
    for second in range(windows):
        change = scaler.observe(float(second), signals) or change
    return change


def test_the_trainers_reported_wait_drives_the_growth_and_is_quoted() -> None:
    change = decide(Autoscaler(1, 8, cpus=8), reported(0.95, 0.0, 0.42))
    assert change is not None and change.target == 3
    assert change.reason == "trainers waited 42% of the last 1 s, workers busy 95%"


def test_trainers_that_report_no_wait_get_no_more_workers() -> None:
    # The data path never waited (deep queues), but the trainers say they do not wait
    # either: before the report, this grew; now it holds.
    assert decide(Autoscaler(1, 8, cpus=8), reported(0.95, 0.0, 0.03)) is None


def test_trainers_that_wait_behind_a_blocked_data_path_get_no_more_workers() -> None:
    # The way out is the limit (the network, one slow trainer): workers would not help.
    assert decide(Autoscaler(1, 8, cpus=8), reported(0.95, 0.4, 0.5)) is None


def test_trainers_that_wait_between_bursts_still_get_more_workers() -> None:
    # Measured at 13 of 16 workers on an I/O-bound sampler: the trainer waited 40 % of
    # each second, the data path 5-15 % (the merge's bursts filled the trainer's queue
    # for moments). Before, any wait of the data path over 5 % held the count there.
    change = decide(Autoscaler(1, 16, cpus=2),
                    Signals(13, busy=0.95, blocked=0.12, rate=3500.0, trainer_wait=0.4,
                            cpu=0.4, idle=1.0))
    assert change is not None and change.target == 16


def test_fed_trainers_shrink_the_workers_by_their_report() -> None:
    change = decide(Autoscaler(1, 8, cpus=8), reported(0.3, 0.0, 0.01, workers=4))
    assert change is not None and change.target == 3
    assert change.reason == "trainers waited 1% of the last 1 s, workers busy 30%"


def test_without_reports_the_data_paths_waits_stand_in() -> None:
    change = decide(Autoscaler(1, 8, cpus=8), reported(0.95, 0.0, None))
    assert change is not None and change.reason.startswith(
        "the data path never waited for trainers of the last 1 s")
    change = decide(Autoscaler(1, 8, cpus=8), reported(0.3, 0.5, None, workers=4))
    assert change is not None and change.target == 3 and change.reason.startswith(
        "the data path waited for trainers 50% of the last 1 s")


def test_a_count_asked_for_that_auto_already_runs_is_logged_and_shown(
        caplog: pytest.LogCaptureFixture) -> None:
    # ``feedmux scale 2`` while auto had just grown to 2: the request fixed the count but
    # left no line and no reason (a loaded test run waited for the line and failed).
    from types import SimpleNamespace

    from feedmux.server._sources.scaling import WorkerScaling
    from feedmux.server.config import WorkerRange

    pool = SimpleNamespace(target=2, slots=4, running=2)
    pool.resize = lambda count: setattr(pool, "target", count)
    scaling = WorkerScaling(pool, WorkerRange(1, 4, auto=True))  # type: ignore[arg-type]
    caplog.set_level("INFO", logger="feedmux.server")
    scaling.request(2)
    assert "workers 2, kept: asked for over control (feedmux scale)" in caplog.text
    assert scaling.stats()["worker_change_reason"] == "asked for over control (feedmux scale)"
    assert scaling.stats()["workers_auto"] == 0 and scaling.changes == 0
