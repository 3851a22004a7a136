"""``python -m benchmarks.soak --minutes N``: a reliable server under churn, its memory watched.

A reliable server (``benchmarks.fuzz_live:source``: every sample's array holds
its id) serves one trainer for the whole run and a stream of short-lived
trainers that come and go, every third of them SIGKILLed mid-stream; halfway
through, the server is stopped and a new one started on the same endpoints.
Every few seconds the RSS of every process is sampled. At the end it reports
each process's RSS slope once warm (least squares after its first quarter),
and checks that nothing was lost: for every server and every epoch it
completed, the trainers together received every id. Trainers are child
processes of this script (``python -m benchmarks.soak trainer ...``), each
stopped by pid; the server is stopped through its handle.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import feedmux
from benchmarks.attacks import rss
from benchmarks.fuzz_live import ITEMS

__all__ = ["main", "slope"]

MiB = 1 << 20
SAMPLE_EVERY = 2.0


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over time, in MiB per minute, after the first quarter."""
    if len(points) < 4:
        return float("nan")
    start = points[0][0] + (points[-1][0] - points[0][0]) / 4
    warm = [(t, value) for t, value in points if t >= start]
    n = len(warm)
    mean_t = sum(t for t, _ in warm) / n
    mean_v = sum(v for _, v in warm) / n
    var = sum((t - mean_t) ** 2 for t, _ in warm)
    if var == 0:
        return float("nan")
    cov = sum((t - mean_t) * (v - mean_v) for t, v in warm)
    return cov / var * 60 / MiB


def _trainer(argv: list[str]) -> int:
    data, control, out, seconds = argv[0], argv[1], argv[2], float(argv[3])
    end = time.monotonic() + seconds
    with open(out, "a", buffering=1) as log, feedmux.RemoteLoader(
        data, control=control, timeout=60, reliable=True, with_meta=True, hwm=4,
    ) as loader:
        for meta, sample in loader:
            ok = int((sample["x"] == int(sample["id"])).all())
            log.write(f"{meta.server_id} {meta.epoch} {int(sample['id'])} {ok}\n")
            if time.monotonic() > end:
                break
    return 0


class _Soak:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.rss: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.trainers: dict[str, subprocess.Popen[bytes]] = {}
        self.count = 0
        self.server: feedmux.Server | None = None
        self.servers = 0

    def start_server(self, data: str = "tcp://127.0.0.1:0", control: str | None = None) -> None:
        self.servers += 1
        options: dict[str, Any] = {"bind": data, "reliable": True}
        if control is not None:
            options["control"] = control
        self.server = feedmux.Server("benchmarks.fuzz_live:source", **options).start()

    def start_trainer(self, seconds: float) -> str:
        assert self.server is not None
        self.count += 1
        name = f"trainer-{self.count}"
        self.trainers[name] = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.soak", "trainer", self.server.data_address,
             self.server.control_address, str(self.scratch / "received.txt"), str(seconds)],
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        return name

    def sample(self, now: float) -> None:
        if self.server is not None and self.server.pid is not None:
            self.rss[f"server-{self.servers}"].append((now, rss(self.server.pid)))
        for name, process in list(self.trainers.items()):
            if process.poll() is not None:
                continue
            try:
                self.rss[name].append((now, rss(process.pid)))
            except (OSError, RuntimeError):
                pass

    def stop_all(self) -> None:
        for process in self.trainers.values():
            if process.poll() is None:
                process.terminate()
        for process in self.trainers.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(15)
        if self.server is not None:
            self.server.stop()


def _check(received: Path) -> tuple[int, int, int]:
    """(complete epochs checked, ids missing from them, wrong samples)."""
    seen: dict[tuple[str, int], set[int]] = defaultdict(set)
    wrong = 0
    for line in received.read_text().splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue  # a line cut by a SIGKILL
        seen[(parts[0], int(parts[1]))].add(int(parts[2]))
        wrong += parts[3] != "1"
    last: dict[str, int] = defaultdict(int)
    for server, epoch in seen:
        last[server] = max(last[server], epoch)
    # A server's last two epochs may be unfinished (stopped, or re-sends still due).
    complete = [key for key in seen if key[1] < last[key[0]] - 1]
    missing = sum(ITEMS - len(seen[key]) for key in complete)
    return len(complete), missing, wrong


def run(minutes: float) -> int:
    seconds = minutes * 60
    with tempfile.TemporaryDirectory(prefix="feedmux-soak-") as scratch_dir:
        soak = _Soak(Path(scratch_dir))
        soak.start_server()
        assert soak.server is not None
        data, control = soak.server.data_address, soak.server.control_address
        soak.start_trainer(seconds + 60)  # the long-lived one
        begin = time.monotonic()
        restarted = False
        next_churn = next_sample = begin
        churn: list[str] = []
        try:
            while (now := time.monotonic()) - begin < seconds:
                if now >= next_sample:
                    soak.sample(now - begin)
                    next_sample = now + SAMPLE_EVERY
                if now >= next_churn:
                    next_churn = now + 4.0
                    churn.append(soak.start_trainer(seconds=6.0))
                    if len(churn) % 3 == 0:  # this one dies mid-stream
                        victim = soak.trainers[churn[-2]]
                        if victim.poll() is None:
                            victim.send_signal(signal.SIGKILL)
                if not restarted and now - begin > seconds / 2:
                    restarted = True
                    soak.server.stop()
                    soak.start_server(data, control)
                time.sleep(0.05)
        finally:
            soak.stop_all()
        epochs, missing, wrong = _check(Path(scratch_dir) / "received.txt")
    print(f"{minutes:g} min: {soak.count} trainers ({soak.count // 3} SIGKILLed), "
          f"{soak.servers} server runs")
    short = 0
    for name, points in sorted(soak.rss.items()):
        if points[-1][0] - points[0][0] < 20:  # too short-lived for a slope: start-up only
            short += 1
            continue
        if len(points) >= 4:
            print(f"  {name:>12}: RSS {points[0][1] / MiB:6.1f} -> {points[-1][1] / MiB:6.1f} MiB "
                  f"over {points[-1][0] - points[0][0]:5.0f} s, slope once warm "
                  f"{slope(points):+.2f} MiB/min")
    print(f"  ({short} short-lived trainers not listed: they never got warm)")
    print(f"  reliable delivery: {epochs} complete epochs checked, {missing} ids missing, "
          f"{wrong} wrong samples")
    return 1 if missing or wrong or not epochs else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trainer"]:
        return _trainer(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    return run(parser.parse_args(argv).minutes)


if __name__ == "__main__":
    raise SystemExit(main())
