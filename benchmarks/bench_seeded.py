"""A seeded run against an unseeded one: the server's CPU per small sample.

Run from the repository root (``make bench`` runs it)::

    python -m benchmarks.bench_seeded --repeats 5   # the full run (about a minute)
    python -m benchmarks.bench_seeded --quick       # a few seconds, for a smoke test

One feedmux server (``--workers 1``, tcp on 127.0.0.1) serves small samples
(``{'X': float32[16], 'y': int64}``) from 8 streamers under a
``StochasticMux`` to one trainer, unseeded and with ``seed=1``. Seeded, the
source is split into shards that take turns in blocks, each with its own
process-wide random state (docs/sampling.md): the figure is what that costs the
server per sample. The modes run interleaved round by round, rotated each
round, and the ratio is paired (seeded over unseeded in the same round).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks import _harness, peers
from benchmarks.bench_modes import (
    _fmt,
    _median,
    failures_line,
    paired,
    rotated_rounds,
    rounds_main,
)
from benchmarks.scenarios import Contender

MODES = ("unseeded", "seeded")
SOURCE = "benchmarks.scenarios:small_mux"
#: The workers issue's target: seeded server CPU per sample over unseeded, at most.
TARGET = 1.2


def _starter(mode: str) -> _harness.StartProducer:
    def start(contender: Contender, kind: str, endpoints: peers.Endpoints,
              timeout: float) -> peers.Producer:
        import feedmux

        seed = 1 if mode == "seeded" else None
        return peers.started_server(feedmux.Server(
            SOURCE, bind=endpoints.data, control=endpoints.control, seed=seed))

    return start


def _connect(contender: Contender, kind: str, endpoints: peers.Endpoints, timeout: float,
             trainers: int = 1, index: int = 0) -> peers.Consumer:
    import feedmux

    loader = feedmux.RemoteLoader(endpoints.data, control=endpoints.control, timeout=timeout)
    return peers.Consumer(samples=iter(loader), close=loader.close)


def run(repeats: int, quick: bool = False, seconds: float | None = None,
        progress: Callable[[str], None] | None = print) -> dict[str, list[dict[str, Any]]]:
    """Both modes once per round, rotated; the raw records per mode."""
    return rotated_rounds(MODES, repeats, _starter, lambda mode: _connect, quick, seconds,
                          progress)


def markdown(records: dict[str, list[dict[str, Any]]]) -> str:
    rounds = max(len(r) for r in records.values())
    cpu = paired(records, "seeded", "unseeded", key="server_cpu_us_per_sample")
    rate = paired(records, "seeded", "unseeded")
    lines = [f"### Small samples from an 8-streamer mux, one trainer: seeded against "
             f"unseeded ({rounds} round(s), medians)", "",
             "| mode | samples/s | server CPU µs/sample | trainer CPU µs/sample |",
             "|---|---|---|---|"]
    for mode in MODES:
        lines.append(f"| {mode} | {_fmt(_median(records[mode], 'samples_per_second'), ',.0f')} "
                     f"| {_fmt(_median(records[mode], 'server_cpu_us_per_sample'), '.2f')} "
                     f"| {_fmt(_median(records[mode], 'trainer_cpu_us_per_sample'), '.2f')} |")
    if cpu:
        ratio = statistics.median(cpu)
        verdict = "met" if ratio <= TARGET else "MISSED"
        lines += ["", f"Seeded / unseeded server CPU per sample (paired): {ratio:.2f}x "
                      f"({min(cpu):.2f}-{max(cpu):.2f}); target <= {TARGET}: {verdict}."]
    if rate:
        lines.append(f"Seeded / unseeded samples/s (paired): {statistics.median(rate):.2f}x.")
    return "\n".join(lines + failures_line(records))


def main(argv: list[str] | None = None) -> int:
    return rounds_main("benchmarks.bench_seeded", __doc__ or "", run, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
