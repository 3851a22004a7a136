"""Per-sample overhead of StochasticMux: feedmux next to pescador 3.0, in one run.

Run from the repository root::

    python -m benchmarks.bench_mux            # the full run (about a minute)
    python -m benchmarks.bench_mux --quick    # a few seconds, for a smoke test

Configurations: 256 streamers of small dicts; ``mode="with_replacement"``
(``rate=16``, the default binomial dist) and ``mode="exhaustive"``
(``rate=None``, one pass = one epoch), each with ``n_active`` 1 and 32. For
each configuration the two libraries run interleaved (alternating which one
goes first), several times; the table shows medians.

*Overhead* is the time per sample through the mux minus the time per sample
of reading the same items straight from their lists (the floor no mux can
beat); the ratio is pescador's overhead over feedmux's. pescador 3.0 draws
``rng.choice(k, p=weights)`` for every sample (pescador issue #49); feedmux
maps blocks of uniforms through the cumulative slot weights.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import platform
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import feedmux.sampling as feedmux_sampling

try:  # pescador 3.0 is a benchmark dependency only
    import pescador
except ImportError:  # pragma: no cover - reported in the table instead
    pescador = None

N_STREAMERS = 256
MODES = ("with_replacement", "exhaustive")
N_ACTIVE = (1, 32)
RATE = 16


def make_items(n_streamers: int, length: int) -> list[list[dict[str, int]]]:
    return [
        [
            {"streamer": index, "position": position, "label": position % 2}
            for position in range(length)
        ]
        for index in range(n_streamers)
    ]


def make_mux(
    library: Any, items: list[list[dict[str, int]]], mode: str, n_active: int, seed: int
) -> Any:
    streamers = [library.Streamer(values) for values in items]
    rate = RATE if mode == "with_replacement" else None
    return library.StochasticMux(streamers, n_active, rate, mode=mode, random_state=seed)


def consume(iterable: Iterable[Any]) -> None:
    deque(iterable, maxlen=0)


def seconds_per_sample(draw: Callable[[], Iterable[Any]], n_samples: int) -> float:
    gc.collect()
    start = time.perf_counter()
    consume(draw())
    return (time.perf_counter() - start) / n_samples


def run(quick: bool = False) -> dict[str, Any]:
    """Measure every configuration; return the rows and a markdown table.

    Parameters
    ----------
    quick : bool
        Tiny sizes and one repetition, for a smoke test.

    Returns
    -------
    dict
        ``rows`` (one dict per configuration, times in microseconds),
        ``markdown`` (the table), ``environment`` and ``pescador`` (whether it
        ran).
    """
    length = 4 if quick else 64
    samples = 512 if quick else 20_000
    repeats = 1 if quick else 5
    items = make_items(N_STREAMERS, length)
    libraries: dict[str, Any] = {"feedmux": feedmux_sampling}
    if pescador is not None:
        libraries["pescador"] = pescador

    def floor_draw(n_samples: int) -> Callable[[], Iterable[Any]]:
        return lambda: itertools.islice(
            itertools.chain.from_iterable(
                itertools.repeat(values) for values in itertools.cycle(items)
            ),
            n_samples,
        )

    configs = [(mode, n_active) for mode in MODES for n_active in N_ACTIVE]
    # Untimed warm-up: the first calls into numpy's random module are slow.
    for mode, n_active in configs:
        for library in libraries.values():
            consume(make_mux(library, items, mode, n_active, seed=12345)(max_iter=200))
    times: dict[tuple[str, int, str], list[float]] = {}
    for repeat in range(repeats):
        for mode, n_active in configs:
            n_samples = samples if mode == "with_replacement" else N_STREAMERS * length
            order = list(libraries) if repeat % 2 == 0 else list(reversed(libraries))
            for name in order:
                mux = make_mux(libraries[name], items, mode, n_active, seed=repeat)
                limit = n_samples if mode == "with_replacement" else None
                elapsed = seconds_per_sample(
                    lambda mux=mux, limit=limit: mux(max_iter=limit), n_samples
                )
                times.setdefault((mode, n_active, name), []).append(elapsed)
            times.setdefault((mode, n_active, "floor"), []).append(
                seconds_per_sample(floor_draw(n_samples), n_samples)
            )

    rows = []
    for mode, n_active in configs:
        row: dict[str, Any] = {"mode": mode, "n_active": n_active}
        floor = statistics.median(times[(mode, n_active, "floor")]) * 1e6
        row["floor_us"] = floor
        for name in libraries:
            per_sample = statistics.median(times[(mode, n_active, name)]) * 1e6
            row[f"{name}_us"] = per_sample
            row[f"{name}_overhead_us"] = max(per_sample - floor, 1e-9)
        if "pescador" in libraries:
            row["ratio"] = row["pescador_overhead_us"] / row["feedmux_overhead_us"]
        rows.append(row)
    environment = (
        f"Python {platform.python_version()}, numpy {np.__version__}, "
        f"pescador {getattr(pescador, '__version__', 'not installed')}"
    )
    return {
        "rows": rows,
        "markdown": markdown(rows, "pescador" in libraries),
        "environment": environment,
        "pescador": "pescador" in libraries,
        "repeats": repeats,
    }


def markdown(rows: list[dict[str, Any]], with_pescador: bool) -> str:
    """The rows as a markdown table (times per sample, in microseconds)."""
    header = ["mode", "n_active", "feedmux µs", "feedmux overhead µs"]
    if with_pescador:
        header += ["pescador µs", "pescador overhead µs", "overhead ratio"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [
            row["mode"],
            str(row["n_active"]),
            f"{row['feedmux_us']:.3f}",
            f"{row['feedmux_overhead_us']:.3f}",
        ]
        if with_pescador:
            cells += [
                f"{row['pescador_us']:.2f}",
                f"{row['pescador_overhead_us']:.2f}",
                f"{row['ratio']:.0f}x",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition")
    arguments = parser.parse_args(argv)
    result = run(quick=arguments.quick)
    print(
        f"StochasticMux per-sample cost, {N_STREAMERS} streamers of small dicts, "
        f"median of {result['repeats']} interleaved runs ({result['environment']}); "
        "overhead = time per sample minus reading the same items from lists"
    )
    print()
    print(result["markdown"])
    if not result["pescador"]:
        print("\npescador is not installed: pip install pescador==3.0.0 to compare.")


if __name__ == "__main__":
    main()
