"""Codec micro-benchmark: feedmux.protocol against msgpack-numpy and pickle 5.

Measures encode and decode cost per sample, side by side in one run, for

- a small sample ``{"X": float32[16], "y": int}``, one sample per message;
- the same small sample, 256 per message (feedmux stacks them; the peers get
  the list of 256 samples);
- a large sample ``float32[4M]`` (16 MiB), one per message.

Contenders: ``feedmux.protocol.encode`` / ``decode`` (decode includes building
every sample, since a batch is lazy), ``msgpack.packb(x, default=msgpack_numpy.encode)``
/ ``unpackb(object_hook=msgpack_numpy.decode)`` (trusted local bytes only: its
decoder unpickles object arrays), and ``pickle`` protocol 5 with out-of-band
buffers. Each decoder gets its own encoder's output as it is (the feedmux and
pickle buffers of a large array are views of it, so both decode without a copy).

Every (case, codec) pair is measured once per round, the pairs in a fresh
random order each round; the table shows medians over the rounds and each
codec's time relative to feedmux.

Run ``python -m benchmarks.bench_codec`` from the repository root
(``--quick`` for a tiny run).
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np

from feedmux.protocol import Data, decode, encode

BATCH = 256


@dataclass(frozen=True)
class Case:
    name: str
    samples: list[Any]
    payload_bytes: int  # array bytes of all samples: what GB/s is computed from


@dataclass(frozen=True)
class Codec:
    name: str
    encode: Callable[[list[Any], np.ndarray], Any]
    decode: Callable[[Any], list[Any]]


def _small_samples(count: int) -> list[Any]:
    rng = np.random.default_rng(0)
    return [{"X": rng.random(16, dtype=np.float32), "y": index} for index in range(count)]


def make_cases(quick: bool) -> list[Case]:
    large_items = 64 * 1024 if quick else 4 * 1024 * 1024
    large = np.random.default_rng(1).random(large_items, dtype=np.float32)
    return [
        Case("small x1", _small_samples(1), 16 * 4 + 8),
        Case(f"small x{BATCH}", _small_samples(BATCH), BATCH * (16 * 4 + 8)),
        Case(
            f"large float32[{large_items // (1024 * 1024) or large_items // 1024}"
            f"{'M' if large_items >= 1024 * 1024 else 'K'}]",
            [large],
            large.nbytes,
        ),
    ]


def _feedmux_encode(samples: list[Any], tags: np.ndarray) -> Any:
    return encode(Data(tags, samples))


def _feedmux_decode(frames: Any) -> list[Any]:
    samples = decode(frames).samples  # type: ignore[union-attr]
    return [samples[index] for index in range(len(samples))]


def _msgpack_numpy_encode(samples: list[Any], tags: np.ndarray) -> Any:
    return msgpack.packb(samples[0] if len(samples) == 1 else samples, default=msgpack_numpy.encode)


def _msgpack_numpy_decode(packed: Any) -> list[Any]:
    value = msgpack.unpackb(packed, object_hook=msgpack_numpy.decode)
    return value if isinstance(value, list) else [value]


def _pickle_encode(samples: list[Any], tags: np.ndarray) -> Any:
    buffers: list[pickle.PickleBuffer] = []
    payload = samples[0] if len(samples) == 1 else samples
    return pickle.dumps(payload, protocol=5, buffer_callback=buffers.append), buffers


def _pickle_decode(encoded: Any) -> list[Any]:
    data, buffers = encoded
    value = pickle.loads(data, buffers=buffers)
    return value if isinstance(value, list) else [value]


CODECS = [
    Codec("feedmux", _feedmux_encode, _feedmux_decode),
    Codec("msgpack-numpy", _msgpack_numpy_encode, _msgpack_numpy_decode),
    Codec("pickle-5 out-of-band", _pickle_encode, _pickle_decode),
]


def _tags(count: int) -> np.ndarray:
    return np.stack([np.ones(count, np.int64), np.arange(count, dtype=np.int64)], axis=1)


def _time_loop(function: Callable[[], Any], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        function()
    return (time.perf_counter() - start) / iterations


def _iterations(case: Case, codec: Codec, target_seconds: float) -> int:
    tags = _tags(len(case.samples))
    encoded = codec.encode(case.samples, tags)
    single = _time_loop(lambda: codec.decode(codec.encode(case.samples, tags)), 1)
    del encoded
    return max(1, min(100_000, int(target_seconds / max(single, 1e-7))))


def _measure(case: Case, codec: Codec, iterations: int) -> tuple[float, float]:
    tags = _tags(len(case.samples))
    encoded = codec.encode(case.samples, tags)
    codec.decode(encoded)  # warm caches
    encode_seconds = _time_loop(lambda: codec.encode(case.samples, tags), iterations)
    decode_seconds = _time_loop(lambda: codec.decode(encoded), iterations)
    return encode_seconds, decode_seconds


def _check_round_trip(case: Case, codec: Codec) -> None:
    decoded = codec.decode(codec.encode(case.samples, _tags(len(case.samples))))
    assert len(decoded) == len(case.samples), (case.name, codec.name)
    first, back = case.samples[0], decoded[0]
    if isinstance(first, dict):
        np.testing.assert_array_equal(first["X"], back["X"])
        assert first["y"] == back["y"]
    else:
        np.testing.assert_array_equal(first, back)


def run(quick: bool = False, *, repeats: int | None = None, echo: bool = True) -> dict[str, Any]:
    """Run the benchmark; return the medians per (case, codec) and the markdown table.

    ``quick`` uses tiny sizes and few rounds, for a smoke test.
    """
    repeats = repeats or (2 if quick else 7)
    target = 0.002 if quick else 0.1
    cases = make_cases(quick)
    for case in cases:
        for codec in CODECS:
            _check_round_trip(case, codec)
    iterations = {
        (case.name, codec.name): _iterations(case, codec, target)
        for case in cases
        for codec in CODECS
    }
    timings: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in iterations}
    plan = [(case, codec) for case in cases for codec in CODECS]
    order = random.Random(0)
    for _ in range(repeats):
        order.shuffle(plan)
        for case, codec in plan:
            key = (case.name, codec.name)
            timings[key].append(_measure(case, codec, iterations[key]))
    rows = []
    for case in cases:
        per_sample = len(case.samples)
        reference = None
        for codec in CODECS:
            measured = timings[(case.name, codec.name)]
            encode_s = statistics.median(e for e, _ in measured)
            decode_s = statistics.median(d for _, d in measured)
            total_s = statistics.median(e + d for e, d in measured)
            if reference is None:
                reference = total_s
            rows.append(
                {
                    "case": case.name,
                    "codec": codec.name,
                    "samples_per_message": per_sample,
                    "encode_us_per_sample": encode_s / per_sample * 1e6,
                    "decode_us_per_sample": decode_s / per_sample * 1e6,
                    "total_us_per_sample": total_s / per_sample * 1e6,
                    "gb_per_s": case.payload_bytes / total_s / 1e9,
                    "time_vs_feedmux": total_s / reference,
                }
            )
    markdown = _markdown(rows, repeats)
    if echo:
        print(markdown)
    return {"rows": rows, "markdown": markdown, "repeats": repeats, "quick": quick}


def _markdown(rows: list[dict[str, Any]], repeats: int) -> str:
    lines = [
        f"Codec cost per sample: medians of {repeats} interleaved rounds "
        "(encode + decode, every sample built).",
        "",
        "| case | codec | encode µs/sample | decode µs/sample | total µs/sample | GB/s "
        "| time vs feedmux |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['case']} | {row['codec']} | {row['encode_us_per_sample']:.2f} "
            f"| {row['decode_us_per_sample']:.2f} | {row['total_us_per_sample']:.2f} "
            f"| {row['gb_per_s']:.2f} | {row['time_vs_feedmux']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_codec", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, two rounds")
    parser.add_argument("--repeats", type=int, help="interleaved rounds (default 7)")
    args = parser.parse_args(argv)
    run(quick=args.quick, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
