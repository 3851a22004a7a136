"""16 MiB samples through the shared-memory pool with ``--workers 2``, against sockets.

Run from the repository root (``make bench`` runs it after the suite)::

    python -m benchmarks.bench_shm_workers --repeats 5   # the full run (about 3 minutes)
    python -m benchmarks.bench_shm_workers --quick       # a few seconds, for a smoke test

The suite's large scenario (``{'X': float32[4M]}``, one sample per message) on
one host, tcp on 127.0.0.1, one trainer that never touches the arrays (a view's
``.nbytes`` is all it could read): feedmux with 2 sampling workers through the
pool (the workers write each array into their region of it; the trainer gets
views), the same with ``--no-shm`` (every array crosses the sockets), one
sampling process through the pool, and 2 ranked trainers through the pool
against ``--no-shm``, with one sampling process and with 2 workers (the forwarder
deals the workers' messages to the ranks, reading them in place), and 2 consumer
groups of one trainer each (every group gets every sample: a message placed once,
each group's trainer holding a claim on the same runs) against ``--no-shm``. Beside
them, raw pyzmq's CPU to receive one 56-byte message (a reference's size) over
tcp in the same run: the floor of what a trainer pays per message, back to
back (the target's base) and paced at the rate the pool's trainer got its
messages in that round (a trainer that waits for each message pays the wake-up
and cold caches too). Each feedmux measurement is the suite's
(``benchmarks._harness``: a fresh trainer process, warm-up, timed loop,
watchdog); the contenders run interleaved round by round, rotated each round,
and the ratios are paired (divided round by round, median quotient).

To compare with another checkout (an older feedmux), run the same module with
that checkout's ``feedmux`` package first on the path (its ``--workers 2``
rate is the 1.5x target's base).
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import _harness
from benchmarks.bench_modes import (
    _fmt,
    _median,
    _progress_line,
    failures_line,
    paired,
    rates,
    rounds_main,
)
from benchmarks.scenarios import LARGE, SCENARIOS, Contender

CONTENDERS: dict[str, Contender] = {
    "pool, --workers 2": Contender("feedmux", "tcp", workers=2, show_workers=True),
    "--no-shm, --workers 2": Contender("feedmux", "tcp", workers=2, show_workers=True,
                                       mode="noshm"),
    "pool, 1 worker": Contender("feedmux", "tcp", workers=1, show_workers=True),
    "pool, 2 ranked trainers": Contender("feedmux", "tcp", trainers=2, ranked=True),
    "--no-shm, 2 ranked trainers": Contender("feedmux", "tcp", trainers=2, ranked=True,
                                             mode="noshm"),
    "pool, 2 ranked trainers, --workers 2": Contender("feedmux", "tcp", trainers=2, ranked=True,
                                                      workers=2, show_workers=True),
    "--no-shm, 2 ranked trainers, --workers 2": Contender(
        "feedmux", "tcp", trainers=2, ranked=True, workers=2, show_workers=True, mode="noshm"),
    "pool, 2 groups": Contender("feedmux", "tcp", trainers=2, groups=True),
    "--no-shm, 2 groups": Contender("feedmux", "tcp", trainers=2, groups=True, mode="noshm"),
}
#: (contender, the one it is divided by, the target ratio) of the issue.
RATIOS = (("pool, --workers 2", "--no-shm, --workers 2", None),
          ("pool, 2 ranked trainers", "--no-shm, 2 ranked trainers", 1.8),
          ("pool, 2 ranked trainers, --workers 2", "--no-shm, 2 ranked trainers, --workers 2",
           1.8),
          ("pool, 2 groups", "--no-shm, 2 groups", None))
#: Trainer CPU per 16 MiB sample through the pool with 2 workers, at most (µs).
TRAINER_CPU_TARGET = 300.0
#: A view's trainer CPU per sample, at most this many times raw pyzmq's per small message.
RAW_FACTOR_TARGET = 3.0
RAW_MESSAGES = 20_000
#: Messages of the paced raw pyzmq measurement (a few seconds at the pool's rate).
PACED_MESSAGES = 600
REF_BYTES = 56

_FORK = multiprocessing.get_context("fork")


def _raw_sender(address: Any, count: int, interval: float = 0.0) -> None:
    """Push ``count`` (+ a warm-up) 56-byte messages; ``interval`` s apart when paced."""
    import zmq

    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    address.send(port)
    payload = b"r" * REF_BYTES
    for _ in range(count + 1000 if not interval else count + 20):
        push.send(payload)
        if interval:
            time.sleep(interval)  # the pace of the messages the trainer waits for
    push.close(linger=5000)
    context.term()


def raw_pyzmq_receive_us(count: int = RAW_MESSAGES, rate: float | None = None) -> float:
    """Raw pyzmq's trainer CPU (µs) to receive one 56-byte message over tcp (PUSH->PULL).

    Back to back (the messages queued: the receiver never waits), or with ``rate``
    paced at that many messages per second, the receiver polling for each as a
    trainer waits for the next sample: what receiving one message costs a process
    that slept in between (its caches cold, the kernel's wake-up paid).
    """
    import zmq

    interval = 0.0 if rate is None else 1.0 / rate
    receiver, sender = _FORK.Pipe(duplex=False)
    process = _FORK.Process(target=_raw_sender, args=(sender, count, interval), daemon=True)
    process.start()
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.rcvtimeo = 10_000
    try:
        if not receiver.poll(30):
            raise RuntimeError("the raw pyzmq sender did not start in 30 s")
        pull.connect(f"tcp://127.0.0.1:{receiver.recv()}")
        for _ in range(1000 if rate is None else 20):  # warm-up
            pull.recv()
        started = time.process_time()
        for _ in range(count):
            if rate is not None and not pull.poll(10_000):
                raise RuntimeError("the paced raw pyzmq sender sent nothing for 10 s")
            pull.recv()
        return 1e6 * (time.process_time() - started) / count
    finally:
        pull.close(linger=0)
        context.term()
        process.join(10)
        if process.is_alive():
            process.kill()


def run(repeats: int, quick: bool = False, seconds: float | None = None,
        progress: Callable[[str], None] | None = print) -> dict[str, list[dict[str, Any]]]:
    """Every contender once per round, rotated, and raw pyzmq; the raw records by label."""
    scenario = next(s for s in SCENARIOS if s.key == LARGE)
    budget = (_harness.Budget.quick(scenario) if quick
              else _harness.Budget.full(scenario, seconds))
    labels = list(CONTENDERS)
    records: dict[str, list[dict[str, Any]]] = {
        label: [] for label in [*labels, "raw", "raw paced"]}
    for round_index in range(repeats):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            record = _harness.measure(scenario, CONTENDERS[label], budget)
            record.update(label=label, round=round_index)
            rates(record)
            records[label].append(record)
            if progress is not None:
                progress(_progress_line(round_index, record, "label", 28))
        raw = raw_pyzmq_receive_us(2000 if quick else RAW_MESSAGES)
        records["raw"].append({"round": round_index, "trainer_cpu_us_per_sample": raw})
        # Paced at the rate the pool's trainer got its messages in this round.
        pace = records["pool, --workers 2"][-1].get("samples_per_second") or 100.0
        paced = raw_pyzmq_receive_us(50 if quick else PACED_MESSAGES, rate=pace)
        records["raw paced"].append({"round": round_index, "trainer_cpu_us_per_sample": paced})
        if progress is not None:
            progress(f"round {round_index + 1} raw pyzmq 56 B receive: {raw:.2f} µs CPU, "
                     f"paced at {pace:.0f}/s: {paced:.2f} µs")
    return records


def _verdict(value: float | None, target: float, at_least: bool) -> str:
    if value is None:
        return "n/a"
    met = value >= target if at_least else value <= target
    return f"{'>=' if at_least else '<='} {target:g}: {'met' if met else 'MISSED'}"


def markdown(records: dict[str, list[dict[str, Any]]]) -> str:
    rounds = max(len(r) for r in records.values())
    lines = [f"### 16 MiB samples on one host: the pool with --workers 2 against sockets "
             f"({rounds} round(s), medians)", "",
             "| contender | samples/s | GB/s | trainer CPU µs/sample |", "|---|---|---|---|"]
    for label in CONTENDERS:
        rate = _median(records[label], "samples_per_second")
        cpu = _median(records[label], "trainer_cpu_us_per_sample")
        gbs = None if rate is None else rate * (16 << 20) / 1e9
        lines.append(f"| {label} | {_fmt(rate, ',.0f')} | {_fmt(gbs, '.1f')} | "
                     f"{_fmt(cpu, '.1f')} |")
    raw = _median(records["raw"], "trainer_cpu_us_per_sample")
    paced = _median(records["raw paced"], "trainer_cpu_us_per_sample")
    lines += [f"| raw pyzmq, one 56-byte message received | | | {_fmt(raw, '.2f')} |",
              f"| raw pyzmq, one 56-byte message at the pool's rate (polled) | | | "
              f"{_fmt(paced, '.2f')} |", "",
              "| figure | value (min-max over rounds) | target |", "|---|---|---|"]
    for label, base, target in RATIOS:
        ratios = paired(records, label, base)
        ratio = statistics.median(ratios) if ratios else None
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else ""
        lines.append(f"| {label} / {base} | {_fmt(ratio, '.2f')}x{spread} | "
                     f"{'-' if target is None else _verdict(ratio, target, True)} |")
    cpu = _median(records["pool, --workers 2"], "trainer_cpu_us_per_sample")
    lines.append(f"| trainer CPU per sample, pool, --workers 2 | {_fmt(cpu, '.1f')} µs | "
                 f"{_verdict(cpu, TRAINER_CPU_TARGET, False)} |")
    factors = paired(records, "pool, --workers 2", "raw", "trainer_cpu_us_per_sample")
    factor = statistics.median(factors) if factors else None
    lines.append(f"| trainer CPU per view / raw pyzmq per 56 B message | "
                 f"{_fmt(factor, '.1f')}x | {_verdict(factor, RAW_FACTOR_TARGET, False)} |")
    factors = paired(records, "pool, --workers 2", "raw paced", "trainer_cpu_us_per_sample")
    factor = statistics.median(factors) if factors else None
    lines.append(f"| trainer CPU per view / raw pyzmq per 56 B message at the same rate | "
                 f"{_fmt(factor, '.1f')}x | - |")
    return "\n".join(lines + failures_line(records))


def main(argv: list[str] | None = None) -> int:
    return rounds_main("benchmarks.bench_shm_workers", __doc__ or "", run, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
