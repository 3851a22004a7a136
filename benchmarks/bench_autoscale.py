"""``--workers auto`` against the best fixed ``--workers N``, in one run.

Run from the repository root (``make bench`` runs it after the suite)::

    python -m benchmarks.bench_autoscale            # the four cases, about 4 minutes
    python -m benchmarks.bench_autoscale --quick    # a few seconds each, for a smoke test
    python -m benchmarks.bench_autoscale --cases 1,3  # some of the cases

Each case starts a seeded feedmux server (``Server.start()``: its own process,
tcp on 127.0.0.1) and one trainer in this process that reads as fast as it can
(or sleeps 1 ms a sample: trainer-bound). The rate is the trainer's samples over
the wall time of a window after a warm-up. The cases (the issue's targets in
brackets):

1. **I/O-bound**: each sample waits 2 ms (a simulated storage read) and uses
   little CPU (epochs of 3200 samples over 16 shards: a shard moved mid-epoch
   replays up to 200 samples, 0.4 s of waiting); fixed N in 1, 2, 4, 8, 12, 16
   and ``auto``: the seconds from the first sample until a 2 s window reaches
   90 % of the best fixed rate [<= 15 s].
2. **CPU-bound** (scenario 4's sampler, about 1 ms of numpy a sample): fixed 1, 2,
   3 and ``auto``: its rate over the last window against the best fixed one
   [>= 90 %] and the most workers it ran [<= usable cores + 1].
3. **Trainer-bound** (the trainer sleeps 1 ms a sample, the I/O sampler without
   its wait), 40 s each (``--trainer-seconds``):
   ``--workers 1`` and ``auto``: the workers it ends with [MIN] and the CPU of the
   server's processes (``/proc``: the server and its children) over the run against
   ``--workers 1`` [<= 1.2x]; apart, its two phases: the fill (the server sends as
   fast as it can until the trainer's queues hold tens of seconds of samples: CPU
   per sample sent) and the wait (once the server waits for the trainer: the
   cores its processes use).
4. **A sampler 4x slower after 20 s** (the I/O wait goes from 2 to 8 ms): the best
   fixed rate at the new cost (N in 4, 8, 16) and the seconds after the change
   until a 2 s window of ``auto`` is back to 80 % of it [<= 15 s].
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import feedmux
from feedmux import RemoteLoader, Server, fetch_stats
from feedmux.server._sources.autoscale import usable_cpus

#: Streamers of the I/O sampler: 16 shards of 2; samples of each in an epoch (an epoch
#: of 3200 samples, 6.4 s of waiting: a moved shard replays at most 200 samples).
IO_STREAMS = 32
PER_STREAM = 100


def _waiting(index: int, wait: float, slow_at: float | None, count: int,
             ) -> Iterator[dict[str, Any]]:
    for position in range(count):
        if wait:
            slow = slow_at is not None and time.time() >= slow_at
            time.sleep(wait * 4 if slow else wait)
        yield {"x": np.full(4, index, dtype=np.float32), "i": np.int64(position)}


def io_bound(wait: float = 0.002, slow_at: float | None = None,
             per_stream: int = PER_STREAM) -> feedmux.StochasticMux:
    """Epochs of samplers that each wait ``wait`` s a sample (4x from time ``slow_at``)."""
    return feedmux.StochasticMux(
        [feedmux.Streamer(_waiting, index, wait, slow_at, per_stream)
         for index in range(IO_STREAMS)], 2, rate=None, mode="exhaustive", random_state=0)


def cpu_bound() -> Any:
    """Scenario 4's sampler (about 1 ms of numpy a sample)."""
    from benchmarks.scenarios import CPU, feedmux_source

    return feedmux_source(CPU)


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its children that are alive (``/proc``)."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        children = []
    for each in [str(pid), *children]:
        try:
            fields = open(f"/proc/{each}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def serve_and_read(source: str, workers: int | str, seconds: float, kwargs: dict[str, Any],
                   step: float = 0.0) -> dict[str, Any]:
    """Serve ``source`` with ``workers`` to one trainer for ``seconds``: its counts over time,
    the most workers seen and the server's CPU over the run."""
    server = Server(source, factory_kwargs=kwargs, workers=workers, seed=0,
                    samples_per_message=None).start()
    counts: list[tuple[float, int]] = []
    #: Once a second: (time, CPU seconds of the server's processes, samples sent, seconds
    #: the server waited for the trainer).
    load: list[tuple[float, float, int, float]] = []
    most = 0
    try:
        pid = server.pid
        assert pid is not None
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=30) as loader:
            taken = 0
            first = cpu0 = None
            checked = 0.0
            for _ in loader:
                taken += 1
                if step:
                    time.sleep(step)
                if taken % 50:
                    continue
                now = time.monotonic()
                if first is None:
                    first, cpu0 = now, _cpu_seconds(pid)
                counts.append((now - first, taken))
                if now - checked >= 1.0:
                    checked = now
                    seen = fetch_stats(server.control_address)
                    most = max(most, int(seen["workers"]))
                    load.append((now - first, _cpu_seconds(pid), int(seen["samples_sent"]),
                                 float(seen["send_blocked_seconds"])))
                if now - first >= seconds:
                    break
            stats = fetch_stats(server.control_address)
            cpu = _cpu_seconds(pid) - (cpu0 or 0.0)
    finally:
        server.stop()
    return {"counts": counts, "most_workers": max(most, int(stats["workers"])),
            "workers": int(stats["workers"]), "changes": int(stats.get("worker_changes", 0)),
            "cpu": cpu, "seconds": counts[-1][0] if counts else 0.0, "load": load}


def phases(load: list[tuple[float, float, int, float]]) -> dict[str, float | None]:
    """A trainer-bound run's two phases: the fill (the server sends as fast as it can
    until the trainer's queues are full: CPU µs per sample sent) and the wait (seconds in
    which the server waited for the trainer 90 % of the time or more: CPU cores used)."""
    fill_cpu = fill_sent = 0.0
    waits: list[float] = []
    filling = True
    for (t0, cpu0, sent0, blocked0), (t1, cpu1, sent1, blocked1) in itertools.pairwise(load):
        span = max(t1 - t0, 1e-9)
        waiting = (blocked1 - blocked0) / span >= 0.9
        filling = filling and not waiting
        if filling:
            fill_cpu, fill_sent = fill_cpu + cpu1 - cpu0, fill_sent + sent1 - sent0
        elif waiting:
            waits.append((cpu1 - cpu0) / span)
    return {"fill_us_per_sample": 1e6 * fill_cpu / fill_sent if fill_sent else None,
            "waiting_cores": sorted(waits)[len(waits) // 2] if waits else None}


def rate_between(counts: list[tuple[float, int]], start: float, end: float) -> float:
    """Samples per second between times ``start`` and ``end`` of a run."""
    inside = [(t, n) for t, n in counts if start <= t <= end]
    if len(inside) < 2:
        return 0.0
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / max(t1 - t0, 1e-9)


def reached(counts: list[tuple[float, int]], target: float, after: float = 0.0,
            window: float = 2.0) -> float | None:
    """The first time (after ``after``) a ``window`` s window ends at ``target``/s or more."""
    for t, _ in counts:
        if t - window >= after and rate_between(counts, t - window, t) >= target:
            return t
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds a run")
    parser.add_argument("--cases", default="1,2,3,4",
                        help="the cases to run, comma-separated (default: all four)")
    parser.add_argument("--trainer-seconds", type=float, default=40.0,
                        help="how long each run of case 3 lasts (default 40 s: mostly the "
                             "fill; a longer run also counts the refills as the trainer "
                             "drains its queues)")
    args = parser.parse_args(argv)
    quick = args.quick
    cases = {case.strip() for case in args.cases.split(",")}
    if not cases <= {"1", "2", "3", "4"}:
        parser.error(f"expected --cases among 1,2,3,4, got {args.cases!r}")
    fixed_s, auto_s = (2.0, 4.0) if quick else (6.0, 25.0)
    warm = 1.0
    io, cpu = "benchmarks.bench_autoscale:io_bound", "benchmarks.bench_autoscale:cpu_bound"
    cores = usable_cpus()
    rows: list[str] = []
    report: dict[str, Any] = {"usable_cpus": cores}

    if "1" in cases:
        # 1. I/O-bound.
        fixed = {n: rate_between(serve_and_read(io, n, fixed_s, {})["counts"], warm, fixed_s)
                 for n in ((1, 4, 16) if quick else (1, 2, 4, 8, 12, 16))}
        best_n = max(fixed, key=fixed.__getitem__)
        auto = serve_and_read(io, "auto", auto_s, {})
        when = reached(auto["counts"], 0.9 * fixed[best_n])
        final = rate_between(auto["counts"], auto_s - 5.0, auto_s)
        report["io"] = {"fixed": fixed, "auto_final": final, "reached_90_s": when,
                        "auto_workers": auto["workers"], "changes": auto["changes"]}
        rows.append(f"| 1. I/O-bound (2 ms wait) | best fixed {fixed[best_n]:.0f}/s (N={best_n}); "
                    + ", ".join(f"N={n}: {r:.0f}" for n, r in fixed.items())
                    + f" | auto {final:.0f}/s = {final / fixed[best_n]:.2f}x, {auto['workers']} "
                    f"workers | 90 % reached after {when if when is None else f'{when:.1f} s'} "
                    "(target <= 15 s) |")

    if "2" in cases:
        # 2. CPU-bound.
        fixed = {n: rate_between(serve_and_read(cpu, n, fixed_s, {})["counts"], warm, fixed_s)
                 for n in (1, 2, 3)}
        best_n = max(fixed, key=fixed.__getitem__)
        auto = serve_and_read(cpu, "auto", auto_s, {})
        final = rate_between(auto["counts"], auto_s - 5.0, auto_s)
        report["cpu"] = {"fixed": fixed, "auto_final": final, "most_workers": auto["most_workers"]}
        rows.append(f"| 2. CPU-bound (scenario 4) | best fixed {fixed[best_n]:.0f}/s (N={best_n}); "
                    + ", ".join(f"N={n}: {r:.0f}" for n, r in fixed.items())
                    + f" | auto {final:.0f}/s = {final / fixed[best_n]:.2f}x (target >= 0.9) | "
                    f"most workers {auto['most_workers']} (target <= {cores + 1}) |")

    if "3" in cases:
        # 3. Trainer-bound.
        fast = {"wait": 0.0}  # a sampler far faster than the trainer
        # The trainer's queues take tens of seconds of its samples: the server first fills them
        # as fast as it can (not trainer-bound yet), then waits for the trainer. Both phases
        # are reported; the CPU of the whole run is the target's figure.
        long_s = auto_s / 2 if quick else args.trainer_seconds
        one = serve_and_read(io, 1, long_s, fast, step=0.001)
        auto = serve_and_read(io, "auto", long_s, fast, step=0.001)
        ratio = auto["cpu"] / max(one["cpu"], 1e-9)
        one_phases, auto_phases = phases(one["load"]), phases(auto["load"])
        report["trainer"] = {"cpu_one": one["cpu"], "cpu_auto": auto["cpu"],
                             "auto_workers": auto["workers"], "seconds": long_s,
                             "phases_one": one_phases, "phases_auto": auto_phases}

        def shown(value: float | None, unit: str) -> str:
            return "-" if value is None else f"{value:.3f} {unit}"
        rows.append(f"| 3. Trainer-bound (1 ms a sample, {long_s:g} s) | --workers 1: "
                    f"{one['cpu']:.2f} CPU s (fill {shown(one_phases['fill_us_per_sample'], 'µs')}"
                    f" a sample sent; waiting {shown(one_phases['waiting_cores'], 'cores')}) | "
                    f"auto: {auto['cpu']:.2f} CPU s = {ratio:.2f}x (target <= 1.2; fill "
                    f"{shown(auto_phases['fill_us_per_sample'], 'µs')} a sample, waiting "
                    f"{shown(auto_phases['waiting_cores'], 'cores')}), ends with "
                    f"{auto['workers']} worker(s) (target 1) | |")

    if "4" in cases:
        # 4. 4x slower after 20 s.
        change_at = 4.0 if quick else 20.0
        slow = {"wait": 0.002, "slow_at": 0.0}
        fixed = {n: rate_between(serve_and_read(io, n, fixed_s, slow)["counts"], warm, fixed_s)
                 for n in ((4, 16) if quick else (4, 8, 16))}
        best_n = max(fixed, key=fixed.__getitem__)
        started = time.time()
        auto = serve_and_read(io, "auto", change_at + (8.0 if quick else 20.0),
                              {"wait": 0.002, "slow_at": started + change_at})
        # The server's first sample came a little after `started`: the change is at least
        # that much earlier in the trainer's clock; counted from the change as the sampler saw it.
        offset = auto["counts"][0][0] if auto["counts"] else 0.0
        when = reached(auto["counts"], 0.8 * fixed[best_n], after=change_at - offset)
        back = None if when is None else when - (change_at - offset)
        report["slowdown"] = {"fixed_new_cost": fixed, "back_after_s": back}
        rows.append(f"| 4. 4x slower after {change_at:g} s | best fixed at the new cost "
                    f"{fixed[best_n]:.0f}/s (N={best_n}) | auto back to 80 % after "
                    f"{back if back is None else f'{back:.1f} s'} (target <= 15 s) | |")

    print(f"usable CPUs: {cores}\n")
    print("| case | fixed --workers | --workers auto | target |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print("\n" + json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
