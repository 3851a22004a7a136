"""Sampling workers SIGKILLed at random moments under the shared-memory pool: nothing lost.

Run from the repository root::

    python -m benchmarks.worker_kills                            # 4 workers, 20 kills, 120 s
    python -m benchmarks.worker_kills --workers 8 --kills 7      # fewer kills, more workers
    python -m benchmarks.worker_kills --seconds 20 --seed 3      # a short one

A seeded server (``feedmux serve benchmarks.worker_kills:source --workers W --seed
1``, the pool on, 1 MiB samples that travel through it) and one free trainer on
this host reading views of the pool. At ``--kills`` moments drawn from ``--seed``
(printed, so that a run replays) over the middle of the run, a worker that is
still alive (one of the server's zygote's children, from ``/proc``) is SIGKILLed.
A dead worker is replaced by a new one that the zygote forks, so there may be
more kills than workers. The trainer reads for
``--seconds`` and holds a view of every 50th sample to the end. The oracle knows
nothing of the code path: every sample's array is filled with its id; every
epoch the trainer finished holds every id once (the last, partial one none
twice); the samples come in the order of an uninterrupted run of the same seed
(``--reference``: one sampling process, the same shards, as many samples); the
held views still hold their ids; the server is still running, its log naming
every death and the new worker that took the dead one's shards, and as many
workers run at the end as at the start. Prints one line of figures and exits 1 on a
miss.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import feedmux

ROOT = Path(__file__).resolve().parents[1]
#: The source, for ``feedmux serve``.
SOURCE = "benchmarks.worker_kills:source"
#: The source's streamers (at least; two per worker) and samples per streamer (epochs of
#: 16 x 8 = 128 samples with up to 8 workers).
STREAMS, PER_STREAM = 16, 8
#: Floats of a sample's array: 1 MiB, above the pool's threshold (256 KiB).
WIDTH = 1 << 18
_STARTED = re.compile(r"started (\d+) sampling worker\(s\): pids ([\d, ]+)")
_SERVING = re.compile(r"serving .*?: data (\S+), control (\S+),")


def _large(start: int, count: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + count):
        yield {"id": np.int64(i), "x": np.full(WIDTH, i, dtype=np.float32)}


def source(streams: int = STREAMS,
           per_stream: int = PER_STREAM) -> feedmux.StochasticMux[dict[str, Any]]:
    """An exhaustive mux of 1 MiB samples, each array filled with its id (0 .. streams x
    per_stream - 1): a mux over plain streamers, so a moved shard skips earlier epochs."""
    return feedmux.StochasticMux(
        [feedmux.Streamer(_large, s * per_stream, per_stream) for s in range(streams)],
        2, rate=None, mode="exhaustive", random_state=0)


@dataclass
class Outcome:
    """What one run saw: the samples in order, the kills, the misses."""

    rows: list[tuple[int, int]] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    stderr: str = ""
    seconds: float = 0.0
    #: Messages the server sent through the pool, shards it moved and workers it forked in
    #: place of a dead one (its statistics).
    pooled: int = 0
    moved: int = 0
    replaced: int = 0


class _Server:
    """``python -m feedmux serve`` with its stderr read to the end by a thread."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "feedmux", "serve", SOURCE,
             "--bind", "tcp://127.0.0.1:0", "--control", "tcp://127.0.0.1:0", *args],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._text = bytearray()
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        while chunk := os.read(self.process.stderr.fileno(), 1 << 16):
            with self._changed:
                self._text += chunk
                self._changed.notify_all()

    @property
    def stderr(self) -> str:
        with self._changed:
            return self._text.decode(errors="replace")

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while (match := pattern.search(self._text.decode(errors="replace"))) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None:
                    raise RuntimeError(f"no {pattern.pattern!r} from the server; stderr:\n"
                                       f"{self._text.decode(errors='replace')}")
                self._changed.wait(min(remaining, 0.5))
        return match

    def stop(self) -> None:
        """SIGKILL the server and what is left of its zygote and workers (by pid)."""
        if self.process.poll() is None:
            for child in [*worker_pids(self.process.pid), *_children(self.process.pid)]:
                with contextlib.suppress(ProcessLookupError):  # gone with its zygote
                    os.kill(child, signal.SIGKILL)
            self.process.kill()
        self.process.wait(30)
        self._reader.join(30)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(child) for child in path.read_text().split()]
    except OSError:
        return []


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def worker_pids(server: int) -> list[int]:
    """The server's sampling workers: its zygote's children (``feedmux-wkr-N`` once they
    have started)."""
    zygotes = [pid for pid in _children(server) if _name(pid) == "feedmux-zygote"]
    return sorted(pid for zygote in zygotes for pid in _children(zygote))


def streams_for(workers: int) -> int:
    """The source's streamers for a run of ``workers`` workers: two per shard at least."""
    return max(STREAMS, 2 * workers)


def _options(workers: int, shm_size: int) -> tuple[str, ...]:
    """The server's options but ``--workers``: the same source, seed and shards (one per
    worker) for the run and its reference."""
    return ("--arg", f"streams={streams_for(workers)}", "--seed", "1", "--shards",
            str(workers), "--shm-size", str(shm_size), "--samples-per-message", "1")


def run(workers: int, kills: int, seconds: float, seed: int, samples: int | None = None,
        shm_size: int = 512) -> Outcome:
    """One server with ``workers`` workers, ``kills`` of them SIGKILLed at moments drawn
    from ``seed`` over the middle of a read of ``seconds`` (or of ``samples`` samples:
    the kills then at drawn sample counts); the trainer's samples and the misses."""
    if kills < 0 or workers < 1:
        raise ValueError(f"expected kills >= 0 and workers >= 1, got {kills} kills of "
                         f"{workers} workers")
    draw = random.Random(seed)
    server = _Server(*_options(workers, shm_size), "--workers", str(workers))
    outcome = Outcome()
    try:
        server.wait_for(_STARTED, 60)
        data, control = server.wait_for(_SERVING, 60).groups()
        if samples is None:
            moments = sorted(draw.uniform(0.1, 0.9) * seconds for _ in range(kills))
        else:
            moments = sorted(draw.randrange(samples // 10, samples * 9 // 10)
                             for _ in range(kills))
        held: list[tuple[int, np.ndarray]] = []
        began = time.monotonic()
        with feedmux.RemoteLoader(data, control=control, timeout=60) as loader:
            for sample in loader:
                elapsed = time.monotonic() - began
                ident = int(sample["id"])
                x = sample["x"]
                if x[0] != ident or x[-1] != ident or not (x == ident).all():
                    outcome.misses.append(f"sample {ident} holds other values")
                outcome.rows.append((int(loader.last_epoch or 0), ident))
                if len(outcome.rows) % 50 == 0:
                    held.append((ident, x))
                del sample, x
                now = elapsed if samples is None else len(outcome.rows)
                while moments and now >= moments[0]:
                    moments.pop(0)
                    alive = [pid for pid in worker_pids(server.process.pid)
                             if pid not in outcome.killed]
                    if not alive:
                        outcome.misses.append("no worker ran to kill")
                        continue
                    victim = draw.choice(alive)
                    os.kill(victim, signal.SIGKILL)
                    outcome.killed.append(victim)
                if (elapsed >= seconds if samples is None else len(outcome.rows) >= samples):
                    break
            outcome.seconds = time.monotonic() - began
            for ident, view in held:
                if not (view == ident).all():
                    outcome.misses.append(f"a held view of sample {ident} changed")
            del held
        if server.process.poll() is not None:
            outcome.misses.append(f"the server exited with {server.process.returncode}")
        else:
            stats = feedmux.fetch_stats(control, timeout=30)
            outcome.pooled, outcome.moved = stats["shm_messages"], stats["shards_moved"]
            outcome.replaced = stats["workers_replaced"]
            if not outcome.pooled:
                outcome.misses.append("no message went through the pool")
            if stats["workers"] != workers or outcome.replaced != len(outcome.killed):
                outcome.misses.append(f"{stats['workers']} workers at the end, "
                                      f"{outcome.replaced} replaced, {workers} at first "
                                      f"and {len(outcome.killed)} killed")
        for pid in outcome.killed:
            if not re.search(rf"\(pid {pid}\) exited unexpectedly with code -9; its shards "
                             r"[\d, ]+ go to a new worker", server.stderr):
                outcome.misses.append(f"the server's log does not replace worker {pid}")
    finally:
        server.stop()
        outcome.stderr = server.stderr
    outcome.misses += exact(outcome.rows, streams_for(workers) * PER_STREAM)
    return outcome


def reference(workers: int, count: int, shm_size: int = 512) -> list[tuple[int, int]]:
    """The first ``count`` samples of the same seeded run, one sampling process, no kill."""
    server = _Server(*_options(workers, shm_size), "--workers", "1")
    rows: list[tuple[int, int]] = []
    try:
        data, control = server.wait_for(_SERVING, 60).groups()
        with feedmux.RemoteLoader(data, control=control, timeout=60) as loader:
            for sample in loader:
                rows.append((int(loader.last_epoch or 0), int(sample["id"])))
                del sample
                if len(rows) >= count:
                    break
    finally:
        server.stop()
    return rows


def exact(rows: list[tuple[int, int]], epoch_size: int) -> list[str]:
    """The misses of exactly once: every epoch before the last seen holds every id once,
    the last none twice, and the epochs come one after the other."""
    misses = []
    epochs = [epoch for epoch, _ in rows]
    if epochs != sorted(epochs):
        misses.append("the epochs came out of order")
    last = max(epochs, default=0)
    for epoch in sorted(set(epochs)):
        ids = sorted(ident for each, ident in rows if each == epoch)
        if epoch < last and ids != list(range(epoch_size)):
            lost = sorted(set(range(epoch_size)) - set(ids))
            twice = sorted({ident for ident in ids if ids.count(ident) > 1})
            misses.append(f"epoch {epoch}: {len(ids)} of {epoch_size}, lost {lost[:10]}, "
                          f"twice {twice[:10]}")
        elif len(set(ids)) != len(ids):
            misses.append(f"epoch {epoch} (partial): a sample came twice")
    return misses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the uninterrupted run that checks the order")
    args = parser.parse_args(argv)
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    print(f"seed {seed}: --workers {args.workers}, {args.kills} SIGKILLs over "
          f"{args.seconds:.0f} s", flush=True)
    outcome = run(args.workers, args.kills, args.seconds, seed)
    misses = list(outcome.misses)
    if not args.no_reference:
        if outcome.rows != reference(args.workers, len(outcome.rows)):
            misses.append("the order differs from the uninterrupted run's")
    epochs = max((epoch for epoch, _ in outcome.rows), default=0)
    print(f"workers SIGKILLed {len(outcome.killed)} times in {outcome.seconds:.0f} s with the "
          f"pool ({args.workers} workers, {outcome.replaced} forked in place of a dead one): "
          f"{len(outcome.rows)} samples ({outcome.pooled} messages through the pool, "
          f"{outcome.moved} shards moved), {epochs - 1} complete epochs, "
          f"{'nothing lost or repeated' if not misses else 'MISSES: ' + '; '.join(misses)}"
          f"{'' if args.no_reference else ', the order of the uninterrupted run'}")
    for line in outcome.stderr.splitlines():
        if "exited unexpectedly" in line:
            print(line)
    if misses:
        print(outcome.stderr[-4000:], file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
