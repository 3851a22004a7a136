"""feedmux across a real link: a server in one host, trainers in another, raw pyzmq beside it.

Run from the repository root, as root (network namespaces; ``make bench`` runs it)::

    python -m benchmarks.bench_hosts             # the full run (a few minutes)
    python -m benchmarks.bench_hosts --quick     # a smoke run (small payload, 1 trainer)

Two hosts on one machine (``tests/multihost/hosts.py``: two network namespaces joined by a
veth pair, a private ``/dev/shm`` each, so the trainers never take the shared-memory path):
the server runs in host A on its link address, the trainers in host B. Each cell serves one
payload in one delivery mode to 1 or 8 trainers over one link, and the trainers count what
they hand out over a timed window after a warm-up; raw pyzmq (PUSH in host A, PULL in host
B, the same bytes per message, ``copy=False`` for large frames) is measured over the same
link in the same run. The links: the veth pair unshaped, and shaped to 1 Gbit/s with ``tc``'s
token bucket (``tbf``; ``netem``'s delay is not available on the machine this was written on).

Payloads: ``small`` (``{'X': float32[16], 'y': int64}``, 256 samples a message),
``batches`` (the same samples, the trainers asking the server for batches of 256:
``RemoteLoader(batch_size=256)``, each a dict of two stacked arrays),
``large`` (a float32 ramp of 1 MiB a sample, 4 a message), ``floats`` (1 MiB of random
float32 a sample, incompressible, 4 a message) and ``images`` (a batch of 10 RGB 224x224
tiles of scikit-image's bundled photographs a sample, 1.5 MB, no tile twice in a batch;
random noise without scikit-image, said in the output). Modes: ``free`` (free
trainers: credit and acknowledgements, the one free delivery; the at-most-once
``plain`` mode of earlier runs is gone), ``ranked`` (one DDP job of 1 or 8 ranks),
``curve`` (free delivery with CURVE encryption, any client let in). ``--compress``
lists the compressions (feedmux's ``--compress``) compared on free delivery (default
``off,auto``); ``auto`` is measured after a warm-up of 3.5 s, past its first trial.
``--workers N`` serves with N sampling workers (the payload from N streamers); the
``server us/msg`` column is the server process's own CPU per data message sent (its
workers not counted).

Every figure is printed, with the ratio of feedmux's bytes/s to raw pyzmq's on the same
link and payload and the issue's targets, met or not.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PAYLOADS = ("small", "batches", "large", "images", "floats")
MODES = ("free", "ranked", "curve")
LINKS = {"veth": None, "1gbit": "1gbit"}
#: Samples a message, per payload.
PER_MESSAGE = {"small": 256, "batches": 256, "large": 4, "images": 1, "floats": 4}
#: The target: feedmux's free delivery, compression off, at least this share of raw pyzmq's
#: bytes/s.
RAW_TARGET = 0.90


def _photos() -> tuple[list[np.ndarray], str]:
    """RGB photographs shipped with scikit-image (or noise, saying so)."""
    try:
        from skimage import data
    except ImportError:
        rng = np.random.default_rng(0)
        return [rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)], "random noise"
    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()], "photographs"


def image_batches(count: int = 4, batch: int = 16, size: int = 224) -> list[np.ndarray]:
    """``count`` batches of ``batch`` crops of ``size`` x ``size``: distinct tiles of the
    photographs (no tile twice in a batch, so a batch holds no repeat to compress away),
    shuffled per batch."""
    photos, _ = _photos()
    tiles = [photo[y:y + size, x:x + size, :3] for photo in photos
             for y in range(0, photo.shape[0] - size + 1, size)
             for x in range(0, photo.shape[1] - size + 1, size)]
    rng = np.random.default_rng(1)
    return [np.ascontiguousarray(np.stack([tiles[i] for i in rng.permutation(len(tiles))[:batch]]))
            for _ in range(count)]


def samples(kind: str) -> list[dict[str, Any]]:
    """A few samples of ``kind``, yielded again and again (made once: sampling is not what
    this measures)."""
    rng = np.random.default_rng(0)
    if kind in ("small", "batches"):
        return [{"X": rng.random(16, dtype=np.float32), "y": np.int64(i)} for i in range(64)]
    if kind == "large":  # 1 MiB of float32 that compress (a ramp)
        ramp = np.arange(1 << 18, dtype=np.float32)
        return [{"X": ramp + i, "y": np.int64(i)} for i in range(8)]
    if kind == "images":
        return [{"X": images, "y": np.int64(i)} for i, images in enumerate(image_batches())]
    if kind == "floats":  # incompressible
        return [{"X": rng.random(1 << 18, dtype=np.float32), "y": np.int64(i)} for i in range(8)]
    raise ValueError(f"expected a payload of {PAYLOADS}, got {kind!r}")


def sample_bytes(kind: str) -> int:
    sample = samples(kind)[0]
    return int(sum(np.asarray(value).nbytes for value in sample.values()))


def _repeat(kind: str, count: int) -> Iterator[dict[str, Any]]:
    made = samples(kind)
    for i in range(count):
        yield made[i % len(made)]


def source(kind: str = "small", epoch: int = 1 << 20, streams: int = 1) -> Any:
    """What the server serves: ``epoch`` samples of ``kind`` an epoch (``feedmux serve
    benchmarks.bench_hosts:source``), from ``streams`` streamers (an exhaustive mux of
    them: one shard each, for ``--workers``). Long epochs: the server logs each one, and
    its log is read only up to its start line (a pipe that fills would stop it)."""
    import feedmux

    if streams == 1:
        return feedmux.Streamer(_repeat, kind, epoch)
    return feedmux.StochasticMux(
        [feedmux.Streamer(_repeat, kind, epoch // streams) for _ in range(streams)],
        streams, rate=None, mode="exhaustive", random_state=0)


# -- the processes in the hosts ----------------------------------------------------------------
def _window(counts: Iterator[int], warmup: float, seconds: float) -> dict[str, float]:
    """Count what ``counts`` yields (bytes per item) over ``seconds`` after ``warmup``."""
    started = time.monotonic()
    for _ in counts:
        if time.monotonic() - started >= warmup:
            break
    begun = time.monotonic()
    items = nbytes = 0
    cpu = time.process_time()
    for size in counts:
        items += 1
        nbytes += size
        if time.monotonic() - begun >= seconds:
            break
    elapsed = time.monotonic() - begun
    return {"items": items, "bytes": nbytes, "seconds": elapsed,
            "cpu": time.process_time() - cpu}


def _trainer(args: argparse.Namespace) -> None:
    from feedmux import RemoteLoader

    options: dict[str, Any] = {}
    if args.mode == "ranked":
        options.update(rank=args.rank, world_size=args.trainers)
    if args.mode == "curve":
        options.update(curve_server_key=args.curve_key)
    size = sample_bytes(args.kind)
    batch = 1
    if args.kind == "batches":  # the server stacks them: one array a field a message
        batch = options["batch_size"] = PER_MESSAGE["batches"]
    with RemoteLoader(args.data, control=args.control, timeout=60, **options) as loader:
        counts = (size * batch for _ in loader)
        result = _window(counts, args.warmup, args.seconds)
        result["items"] *= batch  # samples, as the other trainers count them
        print(json.dumps(result), flush=True)
        if args.mode == "ranked":
            # The other ranks may still be in their windows: a rank that left would hold
            # their job back (its share waits for a successor). Read on until killed.
            for _ in counts:
                pass


def _push(args: argparse.Namespace) -> None:
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.PUSH)
    socket.sndhwm = 8
    port = socket.bind_to_random_port(f"tcp://{args.address}")
    print(port, flush=True)
    frame = bytes(sample_bytes(args.kind) * PER_MESSAGE[args.kind])
    copy = len(frame) < (64 << 10)
    while True:
        socket.send(frame, copy=copy)


def _pull(args: argparse.Namespace) -> None:
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.PULL)
    socket.rcvhwm = 8
    socket.connect(args.data)
    socket.rcvtimeo = 60_000

    def sizes() -> Iterator[int]:
        while True:
            yield len(socket.recv(copy=False))

    result = _window(sizes(), args.warmup, args.seconds)
    result["items"] *= PER_MESSAGE[args.kind]  # samples, as the trainers count them
    print(json.dumps(result), flush=True)


# -- the run ---------------------------------------------------------------------------------
@dataclass
class Cell:
    link: str
    kind: str
    mode: str  # a feedmux mode, or "raw"
    trainers: int
    compress: str = "off"
    samples_per_s: float = 0.0
    bytes_per_s: float = 0.0
    trainer_cpu: float = 0.0  # trainer CPU seconds per second (summed over trainers)
    server_cpu_per_message: float = 0.0  # the server process's (not its workers') CPU seconds
    error: str = ""
    decision: str = ""  # auto: the server's decision and reason for the first trainer


def _read_json(process: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The first line a role prints (its figures), within ``timeout`` seconds."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else b""
    if not line:
        process.kill()
        _, err = process.communicate(timeout=10)
        raise RuntimeError(f"no figures (exit {process.returncode}): {err.decode()[-800:]}")
    figures: dict[str, Any] = json.loads(line)
    return figures


def _measure(hosts: Any, cell: Cell, warmup: float, seconds: float, keys: Path,
             workers: int = 0) -> None:
    from tests.integration.conftest import Spawned

    me = [sys.executable, "-m", "benchmarks.bench_hosts"]
    window = ["--warmup", str(warmup), "--seconds", str(seconds), "--kind", cell.kind]
    address = hosts.address("a")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    if cell.mode == "raw":
        server = hosts.popen("a", [*me, "--role", "push", "--address", address, *window],
                             **pipes)
        assert server.stdout is not None
        port = int(server.stdout.readline())
        data = control = f"tcp://{address}:{port}"
        roles = [["--role", "pull"] for _ in range(cell.trainers)]
    else:
        mode = {"curve": ["--curve-secret", str(keys / "server.key_secret")]}.get(cell.mode, [])
        spawned = Spawned(hosts.popen("a", [
            sys.executable, "-m", "feedmux", "serve", "benchmarks.bench_hosts:source",
            "--arg", f"kind={cell.kind}", "--bind", f"tcp://{address}:0",
            "--control", f"tcp://{address}:0", "--samples-per-message",
            str(PER_MESSAGE[cell.kind]), "--min-trainers", str(cell.trainers),
            "--shm-size", "16", "--log-level", "info", *mode,
            "--compress", cell.compress,  # off said: the server's default is auto
            *(["--workers", str(workers), "--arg", f"streams={workers}"] if workers else []),
        ], **pipes))
        server = spawned.process
        data, control = spawned.endpoints().data, spawned.endpoints().control
        roles = [["--role", "trainer", "--mode", cell.mode, "--trainers", str(cell.trainers),
                  "--rank", str(rank), "--curve-key", str(keys / "server.key")]
                 for rank in range(cell.trainers)]
    trainers = [hosts.popen("b", [*me, *role, "--data", data, "--control", control, *window],
                            **pipes) for role in roles]
    try:
        deadline = time.monotonic() + 90 + warmup + seconds
        # A CURVE server's control endpoint answers only a client that holds its key.
        stats = [sys.executable, "-m", "feedmux", "stats", control, "--timeout", "5", *(
            ["--curve-server-key", str(keys / "server.key")] if cell.mode == "curve" else [])]
        load = _server_load(hosts, stats, server.pid) if cell.mode != "raw" else None
        results = [_read_json(trainer, max(0.0, deadline - time.monotonic()))
                   for trainer in trainers]
        if load is not None:
            cpu, messages = _server_load(hosts, stats, server.pid, load)
            cell.server_cpu_per_message = cpu / max(messages, 1)
        cell.samples_per_s = sum(r["items"] / r["seconds"] for r in results)
        cell.bytes_per_s = sum(r["bytes"] / r["seconds"] for r in results)
        cell.trainer_cpu = sum(r["cpu"] / r["seconds"] for r in results)
        if cell.compress == "auto":
            cell.decision = _decision(hosts, stats)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, IndexError) as error:
        cell.error = str(error).strip().splitlines()[-1][:200] if str(error) else repr(error)
    finally:
        for process in [server, *trainers]:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


def _server_load(hosts: Any, stats: list[str], pid: int,
                 since: tuple[float, int] | None = None) -> tuple[float, int]:
    """The server process's CPU seconds and data messages sent (since ``since``), asked once
    the trainers have begun (the statistics say so, ``stats`` the command that asks them);
    its workers are processes of their own."""
    messages = 0
    if since is None:
        time.sleep(1.0)  # into the trainers' warm-up: the server's start is not counted
    for _ in range(100):
        done = hosts.run("a", stats)
        try:
            messages = int(json.loads(done.stdout).get("messages_sent", 0))
        except ValueError:
            messages = 0
        if since is not None or messages > 0:
            break
        time.sleep(0.1)  # the trainers have not started: look again
    with open(f"/proc/{pid}/stat", "rb") as stat:  # user + system clock ticks
        fields = stat.read().rsplit(b")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    if since is None:
        return cpu, messages
    return cpu - since[0], messages - since[1]


def _decision(hosts: Any, stats: list[str]) -> str:
    """What ``auto`` decided for a trainer, and why (the server's statistics, asked by the
    command ``stats``)."""
    done = hosts.run("a", stats)
    try:
        figures = json.loads(done.stdout)
    except ValueError:
        return "no statistics"
    for key in sorted(figures):
        if key.endswith(".compress"):
            return f"{figures[key]}: {figures.get(key + '_reason', '')}"
    return "no decision"


def _cells(args: argparse.Namespace) -> list[Cell]:
    cells = []
    for link in args.links:
        for kind in args.payloads:
            for trainers in args.trainers:
                cells.append(Cell(link, kind, "raw", trainers))
                for mode in args.modes:
                    # The compressions are compared on free delivery only (one run's time).
                    for compress in args.compress if mode == "free" else ["off"]:
                        cells.append(Cell(link, kind, mode, trainers, compress))
    return cells


def _report(cells: list[Cell], images: str) -> None:
    raw = {(c.link, c.kind, c.trainers): c for c in cells if c.mode == "raw"}
    print(f"\nfeedmux across two hosts (image batches from {images}); bytes/s of the "
          "payload handed out, summed over the trainers")
    print(f"{'link':6} {'payload':7} {'mode':8} {'trainers':>8} {'compress':8} "
          f"{'samples/s':>11} {'MB/s':>9} {'vs raw':>7} {'trainer CPU':>11} "
          f"{'server us/msg':>13}")
    for c in cells:
        base = raw.get((c.link, c.kind, c.trainers))
        ratio = (f"{c.bytes_per_s / base.bytes_per_s:7.2f}"
                 if base and base.bytes_per_s and c.mode != "raw" else "")
        figures = (f"{c.samples_per_s:11.0f} {c.bytes_per_s / 1e6:9.1f} {ratio:>7} "
                   f"{c.trainer_cpu:11.2f} {c.server_cpu_per_message * 1e6:13.0f}"
                   ) if not c.error else f"  failed: {c.error}"
        print(f"{c.link:6} {c.kind:7} {c.mode:8} {c.trainers:8d} "
              f"{c.compress if c.mode != 'raw' else '':8} {figures}")
        if c.decision:
            print(f"{'':41}auto: {c.decision}")
    print(f"\ntarget: feedmux free delivery (compress off) >= {RAW_TARGET:.0%} of raw "
          "pyzmq's bytes/s on the 1 Gbit link")
    for c in cells:
        base = raw.get((c.link, c.kind, c.trainers))
        if (c.link == "1gbit" and c.mode == "free" and c.compress == "off"
                and base and base.bytes_per_s and not c.error):
            share = c.bytes_per_s / base.bytes_per_s
            verdict = "met" if share >= RAW_TARGET else "NOT met"
            print(f"  {c.kind:7} {c.mode:8} {c.trainers} trainer(s): {share:.2f} {verdict}")


def _rate(cells: list[Cell], **where: Any) -> float | None:
    for c in cells:
        if all(getattr(c, key) == value for key, value in where.items()) and not c.error:
            return c.samples_per_s
    return None


def _judge(what: str, value: float | None, base: float | None, target: float) -> None:
    if value is None or not base:
        print(f"  {what}: not measured")
        return
    ratio = value / base
    print(f"  {what}: {ratio:.2f} (target {target:g}) {'met' if ratio >= target else 'NOT met'}")


def _targets(cells: list[Cell]) -> None:
    """The issue's compression targets, free delivery, 1 trainer, samples/s ratios."""
    if not any(c.compress == "auto" for c in cells):
        return
    print("\ncompression targets (free delivery, 1 trainer, samples/s):")
    one = {"mode": "free", "trainers": 1}
    _judge("1gbit images: auto / off", _rate(cells, link="1gbit", kind="images",
                                            compress="auto", **one),
           _rate(cells, link="1gbit", kind="images", compress="off", **one), 1.8)
    _judge("1gbit floats: auto / off", _rate(cells, link="1gbit", kind="floats",
                                            compress="auto", **one),
           _rate(cells, link="1gbit", kind="floats", compress="off", **one), 0.95)
    for kind in sorted({c.kind for c in cells}):
        _judge(f"veth {kind}: auto / off", _rate(cells, link="veth", kind=kind,
                                                  compress="auto", **one),
               _rate(cells, link="veth", kind=kind, compress="off", **one), 0.95)
    for link in sorted({c.link for c in cells}):
        for kind in sorted({c.kind for c in cells}):
            _judge(f"{link} {kind}: off / raw pyzmq", _rate(cells, link=link, kind=kind,
                                                             compress="off", **one),
                   _rate(cells, link=link, kind=kind, mode="raw", trainers=1), 0.90)


def _decompression_cost() -> None:
    """Trainer CPU per byte: one decompression against the copy it replaces (a received
    frame copied into fresh memory), per codec and payload, in this process."""
    from feedmux.protocol import Codec, compress_frames, decode, encode
    from feedmux.protocol import Data as DataMessage

    print("\ndecompression / copy, trainer CPU per byte received (target 1.5):")
    for kind in ("images", "floats", "large"):
        frames = [bytes(memoryview(f).cast("B")) for f in encode(DataMessage(
            np.array([[1, 0]]), [samples(kind)[0]]))]
        for codec in (Codec("lz4"), Codec("zstd", 1), Codec("zstd", 1, delta=True)):
            wire = compress_frames(frames, codec)
            best_inflate = best_copy = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                decode(wire)
                best_inflate = min(best_inflate, time.perf_counter() - started)
                started = time.perf_counter()
                decode([bytearray(frame) for frame in frames])
                best_copy = min(best_copy, time.perf_counter() - started)
            ratio = best_inflate / best_copy
            print(f"  {kind:7} {codec.label:12}: {ratio:5.2f} "
                  f"({'met' if ratio <= 1.5 else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("bench", "trainer", "push", "pull"), default="bench")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kind", default="small")
    parser.add_argument("--mode", default="free")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--data", default="")
    parser.add_argument("--control", default="")
    parser.add_argument("--address", default="")
    parser.add_argument("--curve-key", default="")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--payloads", default=",".join(PAYLOADS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--links", default=",".join(LINKS))
    parser.add_argument("--trainers", default="1,8")
    parser.add_argument("--compress", default="off,auto")
    parser.add_argument("--workers", type=int, default=0,
                        help="sampling worker processes of the server (0: none)")
    args = parser.parse_args(argv)
    if args.role == "trainer":
        args.trainers = int(args.trainers)
        _trainer(args)
        return 0
    if args.role == "push":
        _push(args)
        return 0
    if args.role == "pull":
        _pull(args)
        return 0
    unknown = sorted(set(args.modes.split(",")) - set(MODES))
    if unknown:  # an earlier run's command line: its plain and reliable modes are one now
        parser.error(f"expected modes among {','.join(MODES)}, got {','.join(unknown)} "
                     "(plain delivery is gone and reliable is the default: every free "
                     "trainer gets the acknowledged delivery, mode free)")
    from tests.multihost.hosts import TwoHosts, unavailable

    reason = unavailable()
    if reason is not None:
        print(f"bench_hosts skipped: {reason}")
        return 0
    if args.quick:
        args.payloads, args.modes, args.trainers, args.links = "small", "free", "1", "veth"
        args.compress = "off"
        args.warmup, args.seconds = 0.5, 1.0
    args.payloads = args.payloads.split(",")
    args.modes = args.modes.split(",")
    args.links = args.links.split(",")
    args.trainers = [int(n) for n in args.trainers.split(",")]
    args.compress = args.compress.split(",")
    cells = _cells(args)
    from feedmux._plumbing.curve import create_keys

    keys = Path(tempfile.mkdtemp(prefix="feedmux-bench-hosts-keys-"))
    create_keys(keys, "server")  # CURVE: any client let in (no --curve-clients)
    with TwoHosts() as hosts:
        for link in args.links:
            hosts.shape(LINKS[link])
            for cell in (c for c in cells if c.link == link):
                # auto decides within its first trial (two windows of a second): measure after.
                warmup = max(args.warmup, 3.5) if cell.compress == "auto" else args.warmup
                _measure(hosts, cell, warmup, args.seconds, keys, args.workers)
                print(f"  {cell}", file=sys.stderr, flush=True)
    shutil.rmtree(keys, ignore_errors=True)
    _report(cells, _photos()[1])
    _targets(cells)
    _decompression_cost()
    return 0 if not any(c.error for c in cells) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
