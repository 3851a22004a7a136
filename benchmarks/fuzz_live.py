"""``python -m benchmarks.fuzz_live``: random and mutated messages at a live server.

For each mode (the one free delivery, with or without CURVE) it starts a server on
port 0, serves a legitimate trainer from a thread, and meanwhile sends random
and mutated-valid messages to the server's control and data endpoints from a
pool of short-lived sockets (with CURVE, half of them hold a key the server
accepts and half do not). It checks that the trainer keeps receiving samples
and that each one is exact (its array holds its id), and samples the server's
RSS: the run fails if it grows more than ``--max-growth-mib`` above its value
once the trainer was served. It owns the processes and sockets it starts and
stops each by pid or handle; it never binds a port.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

import feedmux
from benchmarks.attacks import HostileSockets, rss
from feedmux.protocol import (
    Ack,
    Credit,
    Data,
    Heartbeat,
    Hello,
    StatsRequest,
    encode,
    pack_envelope,
)

__all__ = ["Mode", "Report", "main", "run_mode", "source"]

MiB = 1 << 20
ITEMS = 500
WIDTH = 256


def _items() -> Iterator[dict[str, Any]]:
    for i in range(ITEMS):
        yield {"id": np.int64(i), "x": np.full(WIDTH, i, dtype=np.int32)}


def source() -> feedmux.Streamer:
    """The legitimate stream: ITEMS samples an epoch, each array full of its id."""
    return feedmux.Streamer(_items)


@dataclass(frozen=True)
class Mode:
    curve: bool

    @property
    def name(self) -> str:
        return "CURVE" if self.curve else "default"


@dataclass
class Report:
    mode: str
    sent: int = 0
    samples: int = 0
    wrong: int = 0
    rss_start: int = 0
    rss_peak: int = 0
    server_alive: bool = True
    errors: list[str] = field(default_factory=list)

    @property
    def growth_mib(self) -> float:
        return (self.rss_peak - self.rss_start) / MiB


# -- what the fuzzer sends -----------------------------------------------------------------

def _valid_messages() -> list[list[bytes]]:
    tags = np.array([[1, 0], [1, 1]], dtype=np.int64)
    data = Data(tags=tags, samples=[{"x": np.arange(4)}, {"x": np.zeros(70_000, np.uint8)}])
    messages = [Hello("fuzz"), Heartbeat("fuzz", 3), StatsRequest("fuzz"),
                Credit(credits=4, client_id="fuzz"), Ack(seqs=[1, 2, 3]), data,
                # ranked delivery's forms: a rank's hello, a hand-out mark (rank or seqs)
                Hello("fuzz", world_size=2, rank=1),
                Ack(client_id="fuzz", server_id="s", rank=0, epoch=1, position=3),
                Ack(seqs=[1], client_id="fuzz", epoch=1, position=3)]
    return [[bytes(frame) for frame in encode(message)] for message in messages]


def _mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    frames = list(frames)
    index = rng.randrange(len(frames))
    frame = bytearray(frames[index])
    action = rng.randrange(6)
    if action == 0 and frame:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
    elif action == 1:  # truncate
        del frame[rng.randrange(len(frame) + 1):]
    elif action == 2:  # append garbage
        frame += rng.randbytes(rng.randint(1, 64))
    elif action == 3:  # drop or duplicate a frame
        if len(frames) > 1 and rng.random() < 0.5:
            del frames[index]
            return frames
        frames.insert(index, bytes(frame))
    elif action == 4:  # a huge declared length
        frame[:1] = rng.choice([b"\xdd\xff\xff\xff\xff", b"\xdf\x7f\xff\xff\xff", b"\xc6\xff"])
    else:  # an envelope in front (or not)
        frames.insert(0, pack_envelope(rng.randrange(1 << 20)))
    frames[index if index < len(frames) else -1] = bytes(frame)
    return frames


def _random_message(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.randint(0, 512)) for _ in range(rng.randint(1, 4))]


class _Fuzzer:
    """A pool of DEALER sockets that send, read and throw away replies, and are replaced
    by new ones now and then (closed as :class:`HostileSockets` says)."""

    def __init__(self, targets: list[str], security: list[Any], seed: int) -> None:
        self.hostile = HostileSockets()
        self.rng = random.Random(seed)
        self.targets = targets
        self.security = security
        self.valid = _valid_messages()
        self.sockets: list[zmq.Socket[Any]] = []
        self.sent = 0

    def _socket(self) -> zmq.Socket[Any]:
        return self.hostile.open(self.rng.choice(self.targets),
                                 security=self.rng.choice(self.security))

    def burst(self, count: int) -> None:
        rng = self.rng
        while len(self.sockets) < 8:
            self.sockets.append(self._socket())
        for _ in range(count):
            index = rng.randrange(len(self.sockets))
            frames = (_mutate(rng.choice(self.valid), rng) if rng.random() < 0.7
                      else _random_message(rng))
            try:
                self.sockets[index].send_multipart(frames, flags=zmq.NOBLOCK)
                self.sent += 1
            except zmq.Again:  # its queue is full, or the server dropped it: a new peer
                self.hostile.retire(self.sockets[index])
                self.sockets[index] = self._socket()
        for socket in self.sockets:  # read and drop the answers, data a fake credit bought
            while socket.poll(0):
                socket.recv_multipart()
        if rng.random() < 0.2:  # a new identity now and then
            self.hostile.retire(self.sockets.pop(rng.randrange(len(self.sockets))))
        self.hostile.close_idle()

    def close(self) -> None:
        self.hostile.close(self.sockets)


# -- the legitimate trainer ----------------------------------------------------------------

def _train(loader: feedmux.RemoteLoader, report: Report, stop: threading.Event) -> None:
    try:
        for sample in loader:
            report.samples += 1
            if not (sample["x"] == int(sample["id"])).all():
                report.wrong += 1
            if stop.is_set():
                return
    except Exception as error:  # reported, and the run fails
        report.errors.append(f"trainer: {type(error).__name__}: {error}")


def _keys(directory: Path) -> tuple[str, Any, Any]:
    from feedmux._plumbing.curve import ClientCurve, create_keys, load_public_key

    _, secret = create_keys(directory, "server")
    server_key = load_public_key(str(directory / "server.key"))
    accepted = ClientCurve.create(server_key)  # the server lets in any key pair...
    stranger = ClientCurve(b"0" * 40, accepted.public, accepted.secret)  # ...not a wrong server key
    return str(secret), accepted, stranger


def run_mode(mode: Mode, seconds: float, *, seed: int = 0,
             log: Callable[[str], None] = print) -> Report:
    """Fuzz one server for ``seconds`` while a trainer is served; return what was seen."""
    report = Report(mode.name)
    with tempfile.TemporaryDirectory(prefix="feedmux-fuzz-") as scratch:
        options: dict[str, Any] = {"bind": "tcp://127.0.0.1:0"}
        loader_options: dict[str, Any] = {"timeout": 20.0}
        security: list[Any] = [None]
        if mode.curve:
            secret, accepted, stranger = _keys(Path(scratch))
            options["curve_secret"] = secret
            loader_options["curve_server_key"] = accepted.server_key
            security = [accepted, stranger, None]
        server = feedmux.Server("benchmarks.fuzz_live:source", **options).start()
        stop = threading.Event()
        fuzzer = None
        try:
            assert server.pid is not None
            loader = feedmux.RemoteLoader(server.data_address, control=server.control_address,
                                          **loader_options)
            trainer = threading.Thread(target=_train, args=(loader, report, stop))
            trainer.start()
            deadline = time.monotonic() + 20
            while report.samples < ITEMS and time.monotonic() < deadline and not report.errors:
                time.sleep(0.05)
            report.rss_start = report.rss_peak = rss(server.pid)
            fuzzer = _Fuzzer([server.control_address, server.data_address], security, seed)
            end = time.monotonic() + seconds
            next_sample = 0.0
            while time.monotonic() < end and not report.errors:
                fuzzer.burst(200)
                now = time.monotonic()
                if now >= next_sample:
                    next_sample = now + 0.25
                    report.rss_peak = max(report.rss_peak, rss(server.pid))
            report.sent = fuzzer.sent
            before = report.samples
            settle = time.monotonic() + 10
            while report.samples < before + ITEMS and time.monotonic() < settle:
                time.sleep(0.05)  # after the fuzz: the trainer is still served
            if report.samples < before + ITEMS:
                report.errors.append("the trainer was not served after the fuzz")
            stop.set()
            trainer.join(30)
            if trainer.is_alive():
                report.errors.append("the trainer thread did not stop")
            loader.close()
            report.server_alive = server.exitcode is None
        finally:
            stop.set()
            if fuzzer is not None:
                fuzzer.close()
            server.stop()
    log(f"{report.mode:>18}: {report.sent} messages sent, {report.samples} samples "
        f"({report.wrong} wrong), server RSS +{report.growth_mib:.1f} MiB "
        f"(from {report.rss_start / MiB:.0f} MiB), alive {report.server_alive}"
        + (f", errors: {report.errors}" if report.errors else ""))
    return report


MODES = [Mode(curve=False), Mode(curve=True)]


def run(seconds: float, max_growth_mib: float, seed: int = 0,
        log: Callable[[str], None] = print) -> list[str]:
    """Every mode for ``seconds`` in all; the list of failures (empty: passed)."""
    failures = []
    total = 0
    for number, mode in enumerate(MODES):
        report = run_mode(mode, seconds / len(MODES), seed=seed + number, log=log)
        total += report.sent
        failures += [f"{report.mode}: {error}" for error in report.errors]
        if report.wrong:
            failures.append(f"{report.mode}: {report.wrong} wrong samples")
        if report.growth_mib > max_growth_mib:
            failures.append(f"{report.mode}: server RSS grew {report.growth_mib:.1f} MiB")
        if not report.server_alive:
            failures.append(f"{report.mode}: the server died")
    log(f"{total} messages in all")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_live", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="in all, split over modes")
    parser.add_argument("--max-growth-mib", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    failures = run(args.seconds, args.max_growth_mib, args.seed)
    for failure in failures:
        print("FAILED:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
