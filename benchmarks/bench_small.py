"""Where a small sample's time goes: each step of its path, timed alone in one process.

Run from the repository root::

    python -m benchmarks.bench_small            # the full run (about half a minute)
    python -m benchmarks.bench_small --quick    # a few seconds, for a smoke test

The sample is scenario 1's ``{'X': float32[16], 'y': int64}`` (the generator of
``benchmarks/scenarios.py``), 256 samples per message as the server makes them.
Each step is timed with ``time.thread_time`` (this thread's CPU, so a busy
machine inflates it less than wall time); the steps run interleaved, round
after round, and the table shows each one's best round, in µs per sample.

The server steps add up: *generator* is what the in-process contender pays;
*drawn* adds the epoch accounting and the streamer around it; *produce* is the
server's whole sampling path (drawing, stacking as drawn, tags, encoding,
pacing) with a send that only counts; *produce, zero-copy* is the same with
``zero_copy=True`` (stacked by the codec). The trainer steps are *decode* (a
received message's frames into a batch), *unstacked* (every sample of the
batch built at once, what ``RemoteLoader`` does per message) and, for
comparison, *indexed* (each sample built on its own, ``batch[i]``).
"""

from __future__ import annotations

import argparse
import itertools
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import feedmux
from benchmarks.scenarios import small_samples
from feedmux.protocol import Data, SampleBatch, decode, encode
from feedmux.sampling.epochs import EpochIterator
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import produce

SAMPLES_PER_MESSAGE = 256


def _generator(messages: int) -> None:
    samples = small_samples()
    for _ in range(messages * SAMPLES_PER_MESSAGE):
        next(samples)


def _drawn(messages: int) -> None:
    epochs = EpochIterator(feedmux.Streamer(small_samples))
    for _ in range(messages):
        epochs.take(SAMPLES_PER_MESSAGE)


def _producing(copy_arrays: bool) -> Callable[[int], None]:
    def run(messages: int) -> None:
        sent = itertools.count(1)

        def send(frames: Any, n_samples: int, epoch: int) -> bool:
            return next(sent) < messages

        produce(EpochIterator(feedmux.Streamer(small_samples)), send,
                policy=BatchPolicy(samples_per_message=SAMPLES_PER_MESSAGE,
                                   copy_arrays=copy_arrays), server_id="bench")

    return run


def _one_message() -> list[bytearray]:
    samples = list(itertools.islice(small_samples(), SAMPLES_PER_MESSAGE))
    tags = np.zeros((SAMPLES_PER_MESSAGE, 2), np.int64)
    tags[:, 1] = np.arange(SAMPLES_PER_MESSAGE)
    # Received frames are writable memory, as zmq Frames are.
    return [bytearray(frame) for frame in encode(Data(tags, samples, "bench", 1))]


def _trainer_steps() -> dict[str, Callable[[int], None]]:
    frames = _one_message()
    batch = decode(frames).samples  # type: ignore[union-attr]
    assert isinstance(batch, SampleBatch)

    def decoding(messages: int) -> None:
        for _ in range(messages):
            decode(frames)

    def unstacked(messages: int) -> None:
        for _ in range(messages):
            batch.unstacked()

    def indexed(messages: int) -> None:
        for _ in range(messages):
            for index in range(SAMPLES_PER_MESSAGE):
                batch[index]

    return {"decode": decoding, "unstacked": unstacked, "indexed": indexed}


STEPS: dict[str, Callable[[int], None]] = {
    "generator": _generator,
    "drawn": _drawn,
    "produce": _producing(copy_arrays=True),
    "produce, zero-copy": _producing(copy_arrays=False),
}


def run(quick: bool = False) -> dict[str, Any]:
    """Time every step; return ``rows`` (step, side, µs per sample) and a markdown table."""
    messages, rounds = (20, 1) if quick else (2000, 7)
    steps = {**STEPS, **_trainer_steps()}
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, step in steps.items():
            started = time.thread_time()
            step(messages)
            seconds = time.thread_time() - started
            per_sample = seconds / (messages * SAMPLES_PER_MESSAGE) * 1e6
            best[name] = min(best.get(name, per_sample), per_sample)
    rows = [{"step": name, "side": "server" if name in STEPS else "trainer",
             "us_per_sample": best[name]} for name in steps]
    lines = ["| step | side | µs per sample |", "|---|---|---|"]
    lines += [f"| {row['step']} | {row['side']} | {row['us_per_sample']:.3f} |" for row in rows]
    environment = f"Python {platform.python_version()}, numpy {np.__version__}"
    return {"rows": rows, "markdown": "\n".join(lines), "rounds": rounds,
            "environment": environment}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a few messages, one round")
    arguments = parser.parse_args(argv)
    result = run(quick=arguments.quick)
    print(f"A small sample's path, {SAMPLES_PER_MESSAGE} per message, best of "
          f"{result['rounds']} interleaved rounds of thread CPU ({result['environment']})")
    print()
    print(result["markdown"])


if __name__ == "__main__":
    main()
