"""``python -m benchmarks.bench_audit``: what ``RemoteLoader(audit_log=...)`` costs a trainer.

One server of small samples (``benchmarks.chaos:source``, 64 int32 each) runs
for the whole benchmark; a loader in this process takes ``--samples`` samples,
without an audit log, with one, and with one that also records each sample's
``id``, in interleaved rounds (free and ranked delivery: a free loader writes
once per message, a rank too, each message's samples before it hands out the
first, so before any server hears of them). Per variant it reports the
median over the rounds of the samples per second and of this process's CPU
time per sample (all its threads), and their ratios to the loader without a
log in the same round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import feedmux

__all__ = ["main"]

VARIANTS = ("no audit log", "audit_log", "audit_log + audit_key")
DELIVERIES = ("free", "ranked")


def _take(server: feedmux.Server, samples: int, delivery: str, log: Path | None,
          key: str | None) -> tuple[float, float]:
    """(samples per second, CPU µs per sample) of one loader taking ``samples``."""
    ranked = {"rank": 0, "world_size": 1} if delivery == "ranked" else {}
    with feedmux.RemoteLoader(server.data_address, control=server.control_address,
                              timeout=60, audit_log=log, audit_key=key,
                              **ranked) as loader:
        iterator = iter(loader)
        next(iterator)  # connected, first message in
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(samples):
            next(iterator)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return samples / wall, cpu / samples * 1e6


def _server() -> feedmux.Server:
    return feedmux.Server("benchmarks.chaos:source", bind="tcp://127.0.0.1:0", seed=1).start()


def run(samples: int, rounds: int) -> int:
    with tempfile.TemporaryDirectory(prefix="feedmux-bench-audit-") as scratch:
        for delivery in DELIVERIES:
            figures: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
            server = _server()
            try:
                for round_ in range(rounds):
                    for name in VARIANTS:
                        if delivery == "ranked":  # a rank's next loader is a new job
                            server.stop()
                            server = _server()
                        log = None if name == VARIANTS[0] else Path(scratch) / f"{round_}.log"
                        key = "id" if name == VARIANTS[2] else None
                        figures[name].append(_take(server, samples, delivery, log, key))
            finally:
                server.stop()
            print(f"{delivery} delivery, {samples} samples x "
                  f"{rounds} rounds (median; ratio to no audit log in the same round):")
            for name in VARIANTS:
                rates = [rate for rate, _ in figures[name]]
                cpus = [cpu for _, cpu in figures[name]]
                rate_ratio = statistics.median(
                    rate / base for (rate, _), (base, _) in zip(
                        figures[name], figures[VARIANTS[0]], strict=True))
                cpu_ratio = statistics.median(
                    cpu / base for (_, cpu), (_, base) in zip(
                        figures[name], figures[VARIANTS[0]], strict=True))
                print(f"  {name:>22}: {statistics.median(rates):9.0f} samples/s "
                      f"({rate_ratio:.2f}x), {statistics.median(cpus):6.2f} µs CPU/sample "
                      f"({cpu_ratio:.2f}x)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_audit", description=__doc__)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run(args.samples, args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
