"""How long ``feedmux stats`` waits while the streamer is slow: the control plane's latency.

Run from the repository root::

    python -m benchmarks.bench_control            # 100 calls per row (about a minute)
    python -m benchmarks.bench_control --quick    # a few calls, for a smoke test

Each row serves a streamer that takes ``--ms`` (50) ms a sample, either asleep
(``time.sleep``: the GIL released) or spinning in pure Python (the GIL held, as
a decoder written in Python holds it), with ``--workers`` 1 (the default: the
streamer on the server's own thread, control answered meanwhile by the stand-in
thread, :mod:`feedmux.server._standin`) and 2 (sampling processes). A trainer
process reads all along; then ``--calls`` calls of :func:`fetch_stats`, the
request of ``feedmux stats``, ``ping`` and ``top``, are timed one after the
other, round trip (a fresh connection each, as the command makes). The table
gives the median, the p99 and the slowest, and the calls that got no answer
within ``--timeout`` (2 s, the command's default).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import feedmux
from feedmux.client.remote import fetch_stats
from feedmux.errors import FeedmuxError

WORKERS = (1, 2)
KINDS = ("sleep", "spin")


def _samples(kind: str, ms: float) -> Iterator[dict[str, Any]]:
    i = 0
    while True:
        if kind == "sleep":
            time.sleep(ms / 1000)
        else:
            end = time.perf_counter() + ms / 1000
            while time.perf_counter() < end:  # pure Python: the GIL held
                pass
        yield {"id": np.int64(i), "x": np.zeros(16, dtype=np.float32)}
        i += 1


def slow(kind: str = "spin", ms: float = 50.0) -> feedmux.Streamer:
    """Endless small samples, ``ms`` ms each: asleep (``sleep``) or in pure Python (``spin``)."""
    return feedmux.Streamer(_samples, kind, float(ms))


def _trainer(data: str, control: str, started: Any) -> None:
    with feedmux.RemoteLoader(data, control=control, timeout=60) as loader:
        for _ in loader:
            started.set()


def one_row(kind: str, workers: int, ms: float, calls: int, timeout: float) -> dict[str, Any]:
    """Serve ``slow(kind, ms)`` with ``workers``, a trainer reading; time ``calls`` requests."""
    server = feedmux.Server("benchmarks.bench_control:slow", bind="tcp://127.0.0.1:0",
                            workers=workers, factory_kwargs={"kind": kind, "ms": ms})
    spawn = multiprocessing.get_context("spawn")
    started = spawn.Event()
    with server:
        trainer = spawn.Process(target=_trainer, args=(server.data_address,
                                                       server.control_address, started),
                                daemon=True)
        trainer.start()
        try:
            if not started.wait(60):
                raise RuntimeError("the trainer got no sample within 60 s")
            seconds, unanswered = [], 0
            for _ in range(calls):
                begun = time.perf_counter()
                try:
                    fetch_stats(server.control_address, timeout=timeout)
                except FeedmuxError:
                    unanswered += 1
                seconds.append(time.perf_counter() - begun)
        finally:
            trainer.kill()
            trainer.join(10)
    seconds.sort()
    return {"kind": kind, "workers": workers, "calls": calls, "unanswered": unanswered,
            "p50_ms": 1e3 * statistics.median(seconds),
            "p99_ms": 1e3 * seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))],
            "max_ms": 1e3 * seconds[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_control",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a few calls (smoke test)")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--ms", type=float, default=50.0, help="ms per sample (default 50)")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--workers", type=int, action="append",
                        help=f"only these worker counts (repeatable; default {WORKERS})")
    parser.add_argument("--kind", choices=KINDS, action="append",
                        help="only this streamer (repeatable; default both)")
    args = parser.parse_args(argv)
    calls = 5 if args.quick else args.calls
    rows = [one_row(kind, workers, args.ms, calls, args.timeout)
            for kind in args.kind or KINDS for workers in args.workers or WORKERS]
    print(f"### `feedmux stats` while the streamer takes {args.ms:g} ms a sample "
          f"({calls} calls a row, ms)\n")
    print("| streamer | --workers | p50 | p99 | slowest | no answer within "
          f"{args.timeout:g} s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['kind']} | {row['workers']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
              f"| {row['max_ms']:.1f} | {row['unanswered']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
