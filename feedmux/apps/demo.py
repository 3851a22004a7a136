"""``feedmux demo``: a sampler server and trainer processes on example data.

It builds the data of pescador's epoch example (N ``.npz`` files of M examples,
every example with a unique id), serves
``StochasticMux(streams, 100, rate=None, mode="exhaustive")`` for a few epochs
from a real server process, and runs trainer processes that iterate a
:class:`~feedmux.Stream` over a :class:`~feedmux.RemoteLoader`. It then checks
that, in every epoch, the trainers together saw every example exactly once.
Every process it starts is waited for or killed, whatever happens. The server binds
port 0 and the trainers are given the ports it got: the demo never picks a port
itself (a port probed free can be taken by another process before the server binds).

The same sampler and trainer, as files to copy, are in ``examples/``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feedmux.client.remote import RemoteLoader
from feedmux.client.stream import Stream
from feedmux.errors import TransportError
from feedmux.sampling import StochasticMux, Streamer
from feedmux.server.server import Server

__all__ = [
    "check_exactly_once", "check_results", "make_example_mux", "make_mux", "record_ids",
    "run_demo", "write_example_files",
]

#: How long the whole demo may take before its processes are killed.
DEMO_TIMEOUT = 120.0


def write_example_files(
    directory: str | Path, files: int, examples: int, seed: int = 0
) -> list[Path]:
    """Write ``files`` npz files of ``examples`` examples each: X float32[8], y int, id int."""
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(files):
        path = Path(directory) / f"part-{index:03d}.npz"
        ids = np.arange(index * examples, (index + 1) * examples, dtype=np.int64)
        np.savez(path, X=rng.standard_normal((examples, 8)).astype(np.float32),
                 y=rng.integers(0, 10, examples), id=ids)
        paths.append(path)
    return paths


def npz_examples(path: str) -> Iterator[dict[str, Any]]:
    """Yield the examples of one npz file, one dict per example."""
    with np.load(path) as data:
        features, labels, ids = data["X"], data["y"], data["id"]
    for index in range(len(ids)):
        yield {"X": features[index], "y": labels[index], "id": ids[index]}


def make_mux(
    data_dir: str, n_active: int = 100, seed: int | None = None
) -> StochasticMux[dict[str, Any]]:
    """The sampler of pescador's epoch example, over every npz file in ``data_dir``."""
    paths = sorted(str(p) for p in Path(data_dir).glob("*.npz"))
    streams: list[Streamer[dict[str, Any]]] = [Streamer(npz_examples, path) for path in paths]
    return StochasticMux(streams, n_active, rate=None, mode="exhaustive", random_state=seed)


def make_example_mux(
    files: int = 3, examples: int = 1000, n_active: int = 100, seed: int | None = None
) -> StochasticMux[dict[str, Any]]:
    """:func:`make_mux` over freshly written example files: ids ``0 .. files*examples-1``.

    A factory that needs no data directory (``feedmux serve
    feedmux.apps.demo:make_example_mux --arg files=3``), as in the container image.
    The files go to a new temporary directory, removed when this process exits.
    """
    directory = tempfile.mkdtemp(prefix="feedmux-examples-")
    atexit.register(_remove_directory, directory, os.getpid())
    write_example_files(directory, files, examples)
    return make_mux(directory, n_active=n_active, seed=seed)


def _remove_directory(directory: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not from a forked sampling worker
        shutil.rmtree(directory, ignore_errors=True)


def check_exactly_once(
    seen_by_trainer: Sequence[dict[int, list[int]]], all_ids: set[int], epochs: int
) -> list[str]:
    """Problems found (empty if every epoch had every id exactly once across trainers)."""
    problems = []
    for epoch in range(1, epochs + 1):
        counts = Counter(i for seen in seen_by_trainer for i in seen.get(epoch, []))
        duplicated = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(all_ids - counts.keys())
        unknown = sorted(counts.keys() - all_ids)
        for what, ids in (("seen twice", duplicated), ("missing", missing), ("unknown", unknown)):
            if ids:
                problems.append(f"epoch {epoch}: {len(ids)} ids {what}, e.g. {ids[:5]}")
    return problems


def _start_server(data_dir: str, epochs: int, workers: int, epoch_size: int,
                  trainers: int) -> Server:
    """The demo's server in a background process, bound to ports the system picked."""
    server_log = logging.getLogger("feedmux.server")
    level = server_log.level
    # The forked server keeps this level: its progress lines would crowd the demo's table.
    server_log.setLevel(logging.WARNING)
    try:
        return Server(
            "feedmux.apps.demo:make_mux", factory_kwargs={"data_dir": data_dir},
            bind="tcp://127.0.0.1:0", epochs=epochs, workers=workers, epoch_size=epoch_size,
            min_trainers=trainers,
        ).start()
    finally:
        server_log.setLevel(level)


def run_demo(files: int = 3, examples: int = 1000, epochs: int = 3, trainers: int = 2,
             workers: int = 1) -> int:
    """Run the demo; return 0 if every example was seen exactly once per epoch."""
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="feedmux-demo-") as scratch:
        results = Path(scratch) / "results"
        results.mkdir()
        write_example_files(scratch, files, examples)
        try:
            server = _start_server(scratch, epochs, workers, files * examples, trainers)
        except TransportError as error:
            print(f"feedmux demo: {error}")
            return 1
        print(f"feedmux demo: {files} files x {examples} examples, {epochs} epochs, "
              f"{trainers} trainers, {workers} sampling worker(s), "
              f"server at {server.data_address}")
        try:
            started = time.perf_counter()
            for _ in range(trainers):
                processes.append(subprocess.Popen([
                    sys.executable, "-m", "feedmux.apps.demo", "trainer", server.data_address,
                    "--control", server.control_address, "--results", str(results),
                    "--world-size", str(trainers), "--timeout", "30",
                ], stdout=subprocess.DEVNULL))
            deadline = time.monotonic() + DEMO_TIMEOUT
            for process in processes:
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
            elapsed = time.perf_counter() - started
            codes = [p.returncode for p in processes]
            server.join(timeout=max(1.0, deadline - time.monotonic()))
            if any(codes):
                print(f"trainer exit codes: {codes}")
                return 1
            records = _latest_records(results, trainers, wait=0)
        except subprocess.TimeoutExpired:
            print(f"feedmux demo: timed out after {DEMO_TIMEOUT:g} s")
            return 1
        finally:
            server.stop()
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    seen = [{int(e): ids for e, ids in r["seen"].items()} for r in records]
    print("\n| epoch | " + " | ".join(f"trainer {i} samples" for i in range(trainers))
          + " | samples/s (all trainers) |")
    print("|---" * (trainers + 2) + "|")
    for epoch in range(1, epochs + 1):
        counts = [len(s.get(epoch, [])) for s in seen]
        seconds = max(r["seconds"].get(str(epoch), 0.0) for r in records) or float("nan")
        cells = " | ".join(str(c) for c in counts)
        print(f"| {epoch} | {cells} | {sum(counts) / seconds:,.0f} |")
    print(f"\niterations per trainer: {[r['iterations'] for r in records]}, "
          f"wall time {elapsed:.2f} s")
    return _verdict(seen, files * examples, epochs, trainers)


def _verdict(seen: Sequence[dict[int, list[int]]], examples: int, epochs: int,
             trainers: int) -> int:
    """Print whether every id was seen once per epoch; 0 if so."""
    problems = check_exactly_once(seen, set(range(examples)), epochs)
    extra = sorted({e for s in seen for e in s} - set(range(1, epochs + 1)))
    if extra:
        problems.append(f"samples from unexpected epochs {extra}")
    if problems:
        print("FAILED: " + "; ".join(problems))
        return 1
    print(f"OK: every one of the {examples} examples was seen exactly once in each of "
          f"the {epochs} epochs, across {trainers} trainers")
    return 0


def record_ids(
    address: str, results: str | Path, *, world_size: int = 1, control: str | None = None,
    timeout: float = 60.0, step_seconds: float = 0.0,
) -> int:
    """A trainer that consumes the stream to its end and records the ids it saw per epoch.

    It writes ``SERVER_ID.HOST.PID.json`` into the ``results`` directory (shared by
    all trainers, e.g. a volume), for :func:`check_results`. ``step_seconds``
    stands in for the time of a training step. Returns 0.
    """
    loader = RemoteLoader(address, control=control, timeout=timeout, world_size=world_size)
    stream = Stream(loader)
    seen: dict[int, list[int]] = {}
    timing: dict[int, list[float]] = {}  # first and last time of each epoch
    with loader:
        for sample in stream.data(math.inf):
            epoch = loader.last_epoch
            assert epoch is not None
            seen.setdefault(epoch, []).append(int(sample["id"]))
            now = time.perf_counter()
            timing.setdefault(epoch, [now, now])[1] = now
            if step_seconds:
                time.sleep(step_seconds)
        server_ids = loader.server_ids
    host = socket.gethostname()
    name = f"{'+'.join(server_ids) or 'unknown'}.{host}.{os.getpid()}"
    record = {"server_ids": server_ids, "host": host, "iterations": stream.iteration,
              "seen": {str(e): ids for e, ids in seen.items()},
              "seconds": {str(e): last - first for e, (first, last) in timing.items()}}
    partial = Path(results) / f".{name}.partial"
    partial.write_text(json.dumps(record))
    partial.replace(Path(results) / f"{name}.json")  # readers never see half a file
    counts = {epoch: len(ids) for epoch, ids in sorted(seen.items())}
    print(f"trainer {host}: {stream.iteration} samples from server {'+'.join(server_ids)}, "
          f"per epoch {counts}", flush=True)
    return 0


def _latest_records(results: str | Path, trainers: int, wait: float) -> list[dict[str, Any]]:
    """The records of the most recent server run in ``results``, waiting up to ``wait``
    seconds for ``trainers`` of them; sorted by host."""
    deadline = time.monotonic() + wait
    while True:
        runs: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        for path in Path(results).glob("*.json"):
            record = json.loads(path.read_text())
            runs.setdefault("+".join(record["server_ids"]), []).append(
                (path.stat().st_mtime, record))
        latest = max(runs.values(), key=lambda run: max(t for t, _ in run), default=[])
        if len(latest) >= trainers or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if len(runs) > 1:
        print(f"{len(runs) - 1} older run(s) in {results} ignored")
    return sorted((record for _, record in latest), key=lambda r: str(r["host"]))


def check_results(
    results: str | Path, files: int, examples: int, epochs: int, trainers: int,
    wait: float = 120.0,
) -> int:
    """Check the records of :func:`record_ids`: 0 if every id was seen once per epoch.

    Waits up to ``wait`` seconds for ``trainers`` records of one server run
    (the most recent one, if the directory holds older runs), then prints
    each trainer's share per epoch and the verdict.
    """
    records = _latest_records(results, trainers, wait)
    if len(records) != trainers:
        print(f"FAILED: expected the records of {trainers} trainers in {results}, found "
              f"{len(records)} after {wait:g} s")
        return 1
    seen = [{int(e): ids for e, ids in r["seen"].items()} for r in records]
    print(f"server {'+'.join(records[0]['server_ids'])}, {trainers} trainers")
    print("| epoch | " + " | ".join(f"{r['host']}" for r in records) + " | total |")
    print("|---" * (trainers + 2) + "|")
    for epoch in range(1, epochs + 1):
        counts = [len(s.get(epoch, [])) for s in seen]
        print(f"| {epoch} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
    return _verdict(seen, files * examples, epochs, trainers)


def _container_cli(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m feedmux.apps.demo",
        description="The demo's trainer and checker (also used by docker-compose.yml).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    trainer = commands.add_parser("trainer", help="consume the stream, record ids in RESULTS")
    trainer.add_argument("address", help="data endpoint, e.g. tcp://sampler:5555")
    trainer.add_argument("--control", help="control endpoint (default: data port + 1)")
    trainer.add_argument("--results", required=True, help="directory shared by the trainers")
    trainer.add_argument("--world-size", type=int, default=1)
    trainer.add_argument("--timeout", type=float, default=60.0,
                         help="seconds without data before giving up (default 60)")
    trainer.add_argument("--step-ms", type=float, default=0.0,
                         help="simulated training step per sample, in ms (default 0)")
    check = commands.add_parser("check", help="verify the trainers' records in RESULTS")
    check.add_argument("results")
    for name, default in (("files", 3), ("examples", 1000), ("epochs", 3), ("trainers", 2)):
        check.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    check.add_argument("--wait", type=float, default=120.0,
                       help="seconds to wait for the records (default 120)")
    args = parser.parse_args(argv)
    if args.command == "trainer":
        return record_ids(args.address, args.results, world_size=args.world_size,
                          control=args.control, timeout=args.timeout,
                          step_seconds=args.step_ms / 1000)
    return check_results(args.results, args.files, args.examples, args.epochs, args.trainers,
                         wait=args.wait)


if __name__ == "__main__":
    sys.exit(_container_cli(sys.argv[1:]))
