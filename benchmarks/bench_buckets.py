"""Coordinated steps (``bucket_by=``) against today's ranked dealing, for variable lengths.

Run from the repository root (``make bench`` runs it after the suite)::

    python -m benchmarks.bench_buckets            # the full run (about a minute)
    python -m benchmarks.bench_buckets --quick    # a few seconds, for a smoke test

A simulated DDP job of 4 ranks, ``batch_size=32``, over samples whose lengths
follow a long-tailed distribution (lognormal, median 128, as token counts of
real text do). Each rank is a real trainer process with a real
``RemoteLoader(rank=r, world_size=4, batch_size=32)`` on a real server; the
sample is ``{"n": length}`` (small: the server's rate is what is measured),
and a rank's step time is taken proportional to its padded batch size
(``batch_size x`` its batch's longest), the job's step time the maximum over
its ranks. Two configurations, interleaved and repeated:

- ``today``: the ranked dealing without buckets (position ``p`` to rank
  ``p % n``, each rank's share cut into batches in order);
- ``coordinated``: the same with ``bucket_by="n"`` (the default window, 16
  steps of 4 x 32 samples).

Figures: the mean job step time (in padded samples, i.e. tokens; the ratio
today / coordinated, target >= 1.5x), the padding waste (the padded tokens
that are not a sample's own, target <= 10% coordinated against about 50% or
more today) over the first steps of each run, and the server's rate (samples
per second delivered to the 4 ranks in a timed window; coordinated / today,
target >= 80%; every rank takes the same steps in it, the job's rate is set by
its slowest rank), and the server process's CPU per sample in that window.
Ratios are paired (round by round), then the median.

Beside it, the dealing rule alone (no processes): the same figures for
several window sizes and two spreads of the distribution, and the dealing
cost per sample, from :class:`feedmux.server._delivery.buckets.BucketWindow`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil

import feedmux
from feedmux import RemoteLoader, Server
from feedmux.server._delivery.buckets import BucketWindow

_FORK = multiprocessing.get_context("fork")
CONFIGURATIONS = ("today", "coordinated")
WORLD, BATCH, MEDIAN = 4, 32, 128
SIGMA = 0.6  # lognormal spread of the lengths served (today's waste about 60%)
TIMEOUT = 60.0


def lognormal_lengths(sigma: float = SIGMA, streams: int = 8,
                      per_stream: int = 2500) -> feedmux.StochasticMux:
    """An exhaustive mux of ``{"n": length}`` samples, lengths lognormal (median 128)."""
    return feedmux.StochasticMux(
        [feedmux.Streamer(_lengths, stream, per_stream, sigma) for stream in range(streams)],
        4, rate=None, mode="exhaustive", random_state=0)


def _lengths(stream: int, count: int, sigma: float) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(stream)
    for length in np.maximum(1, rng.lognormal(np.log(MEDIAN), sigma, count)).astype(int):
        yield {"n": int(length)}


def _rank(data: str, control: str, rank: int, bucket: bool, steps: int, timed: int,
          barrier: Any, results: Any) -> None:
    try:
        with RemoteLoader(data, control=control, rank=rank, world_size=WORLD,
                          batch_size=BATCH, bucket_by="n" if bucket else None,
                          timeout=TIMEOUT) as loader:
            batches = iter(loader)
            longest, total, sizes = np.zeros(steps), np.zeros(steps), np.zeros(steps)
            for step in range(steps):
                lengths = next(batches)["n"]
                longest[step], total[step], sizes[step] = lengths.max(), lengths.sum(), len(lengths)
            barrier.wait(TIMEOUT)  # (the parent is the barrier's last party)
            # The same steps on every rank (a rank that stopped early, or left, would hold
            # the others up: the ranks of a job move together).
            count, start = 0, time.perf_counter()
            for _ in range(timed):
                count += len(next(batches)["n"])
            rate = count / (time.perf_counter() - start)
            barrier.wait(TIMEOUT)  # every rank done before any leaves
            results.put(("ok", rank, longest, total, sizes, rate))
    except BaseException as error:
        results.put(("error", rank, repr(error), None, None, 0.0))


def measure(configuration: str, steps: int, timed: int) -> dict[str, float]:
    """One run of ``configuration``: its mean job step time, waste and server rate."""
    server = Server("benchmarks.bench_buckets:lognormal_lengths", bind="tcp://127.0.0.1:0",
                    control="tcp://127.0.0.1:0", seed=1).start()
    barrier, results = _FORK.Barrier(WORLD + 1), _FORK.Queue()
    ranks = [_FORK.Process(target=_rank, daemon=True, args=(
        server.data_address, server.control_address, rank, configuration == "coordinated",
        steps, timed, barrier, results)) for rank in range(WORLD)]
    try:
        for process in ranks:
            process.start()
        watched = psutil.Process(server.pid)
        try:
            barrier.wait(2 * TIMEOUT)
        except threading.BrokenBarrierError:
            problem = results.get(timeout=1) if not results.empty() else "none reported"
            raise RuntimeError(f"{configuration}: a rank did not start: {problem}") from None
        cpu = sum(watched.cpu_times()[:2])
        barrier.wait(2 * TIMEOUT)
        cpu = sum(watched.cpu_times()[:2]) - cpu
        outcomes = sorted((results.get(timeout=2 * TIMEOUT) for _ in ranks),
                          key=lambda outcome: outcome[1])
    finally:
        for process in ranks:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
        server.stop()
    failed = [outcome[2] for outcome in outcomes if outcome[0] != "ok"]
    if failed:
        raise RuntimeError(f"{configuration}: a rank failed: {failed[0]}")
    padded = np.array([sizes * longest for _, _, longest, _, sizes, _ in outcomes])
    real = sum(total.sum() for _, _, _, total, _, _ in outcomes)
    # The job's rate: every rank took the same steps, the slowest rank's time is the job's.
    rate = WORLD * min(outcome[5] for outcome in outcomes)
    return {"step": float(padded.max(axis=0).mean()), "waste": 1 - real / padded.sum(),
            "rate": rate, "cpu": 1e6 * cpu / (WORLD * timed * BATCH)}


def run(repeats: int, steps: int, timed: int) -> dict[str, Any]:
    rounds: list[dict[str, dict[str, float]]] = []
    for number in range(repeats):
        order = CONFIGURATIONS if number % 2 == 0 else CONFIGURATIONS[::-1]
        rounds.append({name: measure(name, steps, timed) for name in order})
    medians = {name: {key: statistics.median(r[name][key] for r in rounds)
                      for key in ("step", "waste", "rate", "cpu")} for name in CONFIGURATIONS}
    ratios = {"step": statistics.median(r["today"]["step"] / r["coordinated"]["step"]
                                        for r in rounds),
              "rate": statistics.median(r["coordinated"]["rate"] / r["today"]["rate"]
                                        for r in rounds)}
    return {"medians": medians, "ratios": ratios}


def simulate(samples: int) -> list[tuple[float, int, float, float, float, float]]:
    """The dealing rule alone: (sigma, window steps, step ratio, waste today, waste
    coordinated, µs per sample dealt) over ``samples`` lognormal lengths."""
    rows = []
    for sigma in (0.6, 1.0):
        lengths = np.maximum(1, np.random.default_rng(7).lognormal(
            np.log(MEDIAN), sigma, samples)).astype(np.int64)
        step = WORLD * BATCH
        today = [[lengths[start + rank:start + step:WORLD] for rank in range(WORLD)]
                 for start in range(0, samples - step + 1, step)]
        for window_steps in (4, 8, 16):
            window = BucketWindow(WORLD, BATCH, window_steps * step)
            started, dealt = time.perf_counter(), []
            for start in range(0, samples, 1024):
                chunk = lengths[start:start + 1024]
                dealt += window.add(1, chunk, chunk.tolist())
            dealt += window.finish_epoch(1)
            cost = (time.perf_counter() - started) / samples * 1e6
            coordinated = [[np.array(rows) for rows in s.ranks] for s in dealt
                           if all(len(rows) == BATCH for rows in s.ranks)]
            (t0, w0), (t1, w1) = _steps(today), _steps(coordinated)
            rows.append((sigma, window_steps, t0 / t1, w0, w1, cost))
    return rows


def _steps(steps: list[list[np.ndarray]]) -> tuple[float, float]:
    padded = np.array([[len(batch) * batch.max() for batch in step] for step in steps])
    real = sum(int(batch.sum()) for step in steps for batch in step)
    return float(padded.max(axis=1).mean()), 1 - real / float(padded.sum())


def report(result: dict[str, Any], simulated: list[tuple[float, int, float, float, float,
                                                          float]]) -> str:
    medians, ratios = result["medians"], result["ratios"]
    lines = [f"4 ranks, batch_size={BATCH}, lognormal lengths (median {MEDIAN}, sigma "
             f"{SIGMA}), real servers and trainer processes:", "",
             "| dealing | mean job step (padded tokens) | padding waste | server rate "
             "(samples/s to 4 ranks) | server CPU µs per sample |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {medians[name]['step']:,.0f} | {medians[name]['waste']:.1%} | "
              f"{medians[name]['rate']:,.0f} | {medians[name]['cpu']:.2f} |"
              for name in CONFIGURATIONS]
    waste = medians["coordinated"]["waste"]
    lines += ["",
              f"today / coordinated, mean job step time: {ratios['step']:.2f}x (target >= "
              f"1.5x): {'met' if ratios['step'] >= 1.5 else 'missed'}",
              f"coordinated padding waste: {waste:.1%} (target <= 10%, today "
              f"{medians['today']['waste']:.1%}): {'met' if waste <= 0.1 else 'missed'}",
              f"coordinated / today, server rate: {ratios['rate']:.0%} (target >= 80%): "
              f"{'met' if ratios['rate'] >= 0.8 else 'missed'}", "",
              "The dealing rule alone (BucketWindow, no processes):", "",
              "| sigma | window (steps) | step time today / coordinated | waste today | "
              "waste coordinated | dealing µs/sample |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {sigma} | {steps} | {ratio:.2f}x | {w0:.1%} | {w1:.1%} | {cost:.2f} |"
              for sigma, steps, ratio, w0, w1, cost in simulated]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_buckets",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timed-steps", type=int, default=4000,
                        help="steps each rank takes in the timed window (default 4000)")
    args = parser.parse_args(argv)
    repeats, steps, timed, samples = ((1, 40, 200, 20_000) if args.quick else
                                      (args.repeats, 400, args.timed_steps, 200_000))
    print(report(run(repeats, steps, timed), simulate(samples)))
    return 0


if __name__ == "__main__":
    if threading.current_thread() is threading.main_thread():
        raise SystemExit(main())
