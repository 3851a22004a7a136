"""What resuming a ranked job in the middle of a 1 M-sample epoch costs.

Run from the repository root (``make bench`` runs it after the suite)::

    python -m benchmarks.bench_resume            # the full run (under a minute)
    python -m benchmarks.bench_resume --quick    # a few seconds, for a smoke test

The source is a seeded exhaustive ``StochasticMux`` over 16 streamers of the
suite's small samples (``{'X': float32[16], 'y': int64}``), 1,000,000 samples
per epoch. Two figures, medians over the rounds:

- *whole epochs*: ``resume_at(3, 0)``: the two epochs before are not drawn at
  all (a mux over plain streamers: its passes are counted, not run);
- *fast-forward*: ``EpochIterator.resume_at(1, half)`` then the first chunk,
  against drawing the same ``half`` samples the normal way (chunks of 256, the
  copy of each drawn sample included, as a server draws them): what the
  server spends before the first resumed sample, per skipped sample;
- *first sample*: a real server and two ranked trainers (threads), from the
  trainers' start to both ranks' first sample, resumed at the middle of the
  epoch against a fresh start.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import feedmux
from benchmarks.scenarios import small_samples
from feedmux import RemoteLoader, Server
from feedmux.sampling import EpochIterator
from feedmux.server._sources.owning import own

STREAMS = 16
TIMEOUT = 120.0


def _stream(index: int, count: int) -> Any:
    samples = small_samples(index)
    for _ in range(count):
        yield next(samples)


def resume_source(epoch_size: int = 1_000_000) -> feedmux.StochasticMux:
    """The benchmark's source (resolved as ``benchmarks.bench_resume:resume_source``)."""
    per_stream = epoch_size // STREAMS
    return feedmux.StochasticMux(
        [feedmux.Streamer(_stream, index, per_stream) for index in range(STREAMS)],
        n_active=4, rate=None, mode="exhaustive", random_state=0,
    )


def whole_epochs(epoch_size: int) -> float:
    """Seconds to resume at the start of epoch 3 (two whole epochs skipped) and take a chunk."""
    resumed = EpochIterator(resume_source(epoch_size), max_epochs=3)
    started = time.perf_counter()
    resumed.resume_at(3, 0)
    resumed.take(256, prepare=own)
    return time.perf_counter() - started


def fast_forward(epoch_size: int) -> tuple[float, float]:
    """Seconds to resume at the middle of the epoch, and to draw that half normally."""
    half = epoch_size // 2
    resumed = EpochIterator(resume_source(epoch_size), max_epochs=1)
    started = time.perf_counter()
    resumed.resume_at(1, half)
    resumed.take(256, prepare=own)
    skipping = time.perf_counter() - started
    drawn = EpochIterator(resume_source(epoch_size), max_epochs=1)
    started = time.perf_counter()
    count = 0
    while count < half:
        count += len(drawn.take(min(256, half - count), prepare=own).items)
    return skipping, time.perf_counter() - started


def first_sample(epoch_size: int, position: int | None) -> float:
    """Seconds from two ranked trainers' start to both ranks' first sample."""
    server = Server("benchmarks.bench_resume:resume_source",
                    factory_kwargs={"epoch_size": epoch_size}, bind="tcp://127.0.0.1:0",
                    control="tcp://127.0.0.1:0", epochs=1, rank_timeout=TIMEOUT).start()
    times: list[float] = []
    errors: list[BaseException] = []

    def rank(r: int, started: float) -> None:
        try:
            with RemoteLoader(server.data_address, control=server.control_address, rank=r,
                              world_size=2, timeout=TIMEOUT) as loader:
                if position is not None:  # what a rank's state_dict() saved mid-epoch
                    loader.load_state_dict({"last_epoch": None, "last_position": None,
                                            "last_server_id": None,
                                            "resume": [[1, position, 2]]})
                next(loader)
                times.append(time.perf_counter() - started)
        except BaseException as error:  # reported by the caller
            errors.append(error)

    try:
        started = time.perf_counter()
        threads = [threading.Thread(target=rank, args=(r, started)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
    finally:
        server.stop()
    if errors or len(times) != 2:
        raise RuntimeError(f"a rank failed: {errors!r}")
    return max(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_resume",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    epoch_size = 20_000 if args.quick else 1_000_000
    repeats = 1 if args.quick else args.repeats
    half = epoch_size // 2
    skip, draw, fresh, resumed, epochs = [], [], [], [], []
    for _ in range(repeats):
        epochs.append(whole_epochs(epoch_size))
        seconds, normal = fast_forward(epoch_size)
        skip.append(seconds)
        draw.append(normal)
        fresh.append(first_sample(epoch_size, None))
        resumed.append(first_sample(epoch_size, half))
    med = statistics.median
    print(f"### Resuming at position {half:,} of a {epoch_size:,}-sample epoch "
          f"({repeats} round(s), medians)\n")
    print("| figure | seconds | µs per skipped sample | ratio |")
    print("|---|---|---|---|")
    print(f"| fast-forward (resume_at + first chunk) | {med(skip):.3f} | "
          f"{1e6 * med(skip) / half:.3f} | {med(draw) / med(skip):.2f}x faster than drawing |")
    print(f"| drawing the same samples (take + copy) | {med(draw):.3f} | "
          f"{1e6 * med(draw) / half:.3f} | 1.00x |")
    print(f"| resuming at epoch 3 (two whole epochs skipped: passes counted, not run) | "
          f"{med(epochs):.3f} | {1e6 * med(epochs) / (2 * epoch_size):.4f} | "
          f"{4 * med(draw) / max(med(epochs), 1e-9):.0f}x faster than drawing them |")
    print(f"| first sample of 2 ranks, fresh start | {med(fresh):.3f} | - | 1.00x |")
    print(f"| first sample of 2 ranks, resumed | {med(resumed):.3f} | "
          f"{1e6 * (med(resumed) - med(fresh)) / half:.3f} | "
          f"{med(resumed) / med(fresh):.2f}x the fresh start |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
