"""The ImageNet-style pipeline: JPEGs decoded and cropped, batches of 64 to one trainer.

Run from the repository root (``make bench`` runs it after the suite)::

    python -m benchmarks.bench_images --repeats 5   # the full run (about 6 minutes)
    python -m benchmarks.bench_images --quick       # a few seconds, for a smoke test

The data: JPEG files (quality 90) cut from scikit-image's bundled photographs
(``skimage.data``: a random crop of 256-500 px a side, the photograph scaled up
first when it is smaller), written once to a cache folder under
``benchmarks/results/`` (or a temporary folder for ``--quick``). Each sample is
what an ImageNet training loop does with torchvision's ``RandomResizedCrop(224)``
and ``RandomHorizontalFlip``, done with Pillow and numpy (torchvision is not
needed): the file decoded by Pillow, a random area of 8-100 % of the image at an
aspect ratio of 3/4-4/3 resized (bilinear) to 224 x 224, flipped left-right with
probability 1/2, and given as **uint8 CHW** (3 x 224 x 224, 147 KiB) with its
label (normalizing to float32 is the trainer's job on its accelerator). The
trainer takes batches of 64 and only touches them (a sum over one byte of each
image), so every figure is the cost of the data pipeline alone.

Contenders, each with the same number of sampling processes (``--workers N``,
2 by default, on a 2-core machine):

- **feedmux**: ``feedmux serve`` with ``--workers N`` of the sampler written as
  users do (one ``Streamer`` per file under an exhaustive ``StochasticMux``,
  :func:`sampler`), and ``RemoteLoader(batch_size=64)`` (the server's batches,
  through the shared-memory pool on this host);
- **torch DataLoader**: a map-style ``Dataset`` over the files,
  ``DataLoader(batch_size=64, shuffle=True, num_workers=N, persistent_workers=True)``;
- **torchdata.nodes**: shuffled indices batched by 64, ``ParallelMapper`` with
  ``method="process"`` and N workers mapping each batch of indices to a collated
  batch (as a DataLoader's worker does), a ``Prefetcher``;
- **SPDL** (``spdl.pipeline``): the same batches of indices piped through a
  ``ProcessPoolExecutor`` of N processes (SPDL's threads would share one GIL
  with Pillow's Python-side work);
- **one process**: the trainer decodes its own batches (no worker at all).

Each measurement forks a fresh *leader* process in its own session (the
trainer), which starts its contender, warms up, then times its loop with
``time.perf_counter`` and ``time.process_time``; psutil reads the CPU time of
the feedmux server process and of the sampling processes (feedmux's workers,
the DataLoader's, torchdata's, SPDL's pool) over the same window. The suite's
process is the watchdog: past the deadline it kills the leader's process group.
The contenders run interleaved round by round (A B C ... then rotated), and a
ratio is paired: divided round by round, the median quotient reported.

The offloading case (with at least 2 CPUs): the trainer and a DataLoader's
workers pinned to core 0 (``os.sched_setaffinity``, inherited by the workers)
against the trainer on core 0 fed by a feedmux server (and its workers) pinned
to core 1. Each side samples with as many processes as its one core should run,
``--offload-workers`` (1 by default): a DataLoader confined to one core with
``num_workers=1`` delivered more than with 2 (203 against 191 images/s, quiet
2-core machine), and a feedmux server with ``--workers 1`` samples in its own
process, with no forwarding hop on its one core. With ``--step-ms`` the trainer
spends that much CPU per batch (a model's step on the trainer's own core: with a
step that only touches, both setups decode on one core and can only tie).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BATCH_SIZE = 64
SIZE = 224
#: Bundled photographs of scikit-image that load without a download (RGB).
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry",
          "hubble_deep_field", "retina", "colorwheel")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: The quotients of the issue: (contender, the one it is divided by, the target).
TARGETS = (("feedmux", "torch DataLoader", 0.95),
           ("offload: feedmux on core 1", "offload: DataLoader on core 0", 1.8))

_FORK = multiprocessing.get_context("fork")


# --------------------------------------------------------------------------
# The data and the sample transform (what every contender runs)


def make_images(folder: Path, count: int, seed: int = 0) -> list[str]:
    """``count`` JPEG files cut from scikit-image's photographs in ``folder`` (kept: made
    once); their paths, sorted."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{index:05d}.jpg" for index in range(count)]
    if all(path.exists() for path in paths):
        return [str(path) for path in paths]
    from PIL import Image
    from skimage import data

    rng = random.Random(seed)
    photos = [Image.fromarray(getattr(data, name)()) for name in PHOTOS]
    for path in paths:
        if path.exists():
            continue
        photo = rng.choice(photos)
        width, height = rng.randint(256, 500), rng.randint(256, 500)
        scale = max(width / photo.width, height / photo.height, 1.0)
        if scale > 1.0:
            photo = photo.resize((math.ceil(photo.width * scale), math.ceil(photo.height * scale)),
                                 Image.Resampling.BILINEAR)
        left = rng.randint(0, photo.width - width)
        top = rng.randint(0, photo.height - height)
        crop = photo.crop((left, top, left + width, top + height))
        partial = path.with_suffix(".part")
        crop.save(partial, format="JPEG", quality=90)
        partial.rename(path)
    return [str(path) for path in paths]


def _crop_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop`` box: 8-100 % of the area, ratio 3/4-4/3 (log-
    uniform), ten tries, then the central crop at the nearest allowed ratio."""
    area = width * height
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return left, top, left + w, top + h
    ratio = width / height
    if ratio < 3 / 4:
        w, h = width, round(width / (3 / 4))
    elif ratio > 4 / 3:
        w, h = round(height * (4 / 3)), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def load_image(path: str, rng: random.Random | None = None) -> np.ndarray:
    """One training image: decoded, random-resized-cropped to 224, maybe flipped, uint8 CHW."""
    from PIL import Image

    rng = rng or random._inst  # type: ignore[attr-defined]  # the process's seeded state
    with Image.open(path) as image:
        image = image.convert("RGB")
        box = _crop_box(image.width, image.height, rng)
        image = image.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1))


def _image_stream(path: str, label: int) -> Iterator[dict[str, Any]]:
    yield {"image": load_image(path), "label": label}


def sampler(folder: str, count: int) -> Any:
    """The feedmux sampler as users write it: a ``Streamer`` per file, an exhaustive
    ``StochasticMux`` over them (an epoch is every file once)."""
    import feedmux

    paths = make_images(Path(folder), count)
    streamers = [feedmux.Streamer(_image_stream, path, index % 1000)
                 for index, path in enumerate(paths)]
    return feedmux.StochasticMux(streamers, n_active=64, rate=None, mode="exhaustive")


class ImageDataset:
    """The map-style dataset of the torch peers: item ``i`` is file ``i``, transformed."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"image": load_image(self.paths[index]), "label": index % 1000}


def _collated(dataset: ImageDataset, indices: list[int]) -> Any:
    from torch.utils.data import default_collate

    return default_collate([dataset[index] for index in indices])


def _stacked(dataset: ImageDataset, indices: list[int]) -> dict[str, np.ndarray]:
    items = [dataset[index] for index in indices]
    return {"image": np.stack([item["image"] for item in items]),
            "label": np.array([item["label"] for item in items], np.int64)}


def _index_batches(count: int, seed: int) -> Iterator[list[int]]:
    """Shuffled batches of 64 indices, epoch after epoch, for ever."""
    rng = random.Random(seed)
    while True:
        order = list(range(count))
        rng.shuffle(order)
        for start in range(0, count - BATCH_SIZE + 1, BATCH_SIZE):
            yield order[start : start + BATCH_SIZE]


def touch(batch: Any) -> int:
    """What the trainer does with a batch: reads one byte of each image."""
    return int(batch["image"][:, 0, 0, 0].sum())


# --------------------------------------------------------------------------
# The contenders (each runs in the leader process: the trainer)


@dataclass
class Run:
    """A contender started in the trainer process: its batches, the pids of its server
    (whose own CPU is counted apart) and of its sampling processes, how it stops."""

    batches: Iterator[Any]
    close: Callable[[], None]
    server: int | None = None
    samplers: Callable[[], list[int]] = list


def _start_feedmux(paths: list[str], folder: str, workers: int, pin: int | None) -> Run:
    import feedmux

    trainer_cpus = os.sched_getaffinity(0)
    if pin is not None:  # the server (and the workers it forks) on core ``pin``
        os.sched_setaffinity(0, {pin})
    server = feedmux.Server("benchmarks.bench_images:sampler", workers=workers,
                            factory_kwargs={"folder": folder, "count": len(paths)},
                            bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0")
    server.start()
    os.sched_setaffinity(0, trainer_cpus)
    loader = feedmux.RemoteLoader(server.data_address, control=server.control_address,
                                  batch_size=BATCH_SIZE, timeout=120)

    def close() -> None:
        loader.close()
        server.stop(timeout=5)

    return Run(iter(loader), close, server=server.pid,
               samplers=lambda: _children(server.pid))


def _start_dataloader(paths: list[str], folder: str, workers: int, pin: int | None) -> Run:
    from torch.utils.data import DataLoader

    loader = DataLoader(ImageDataset(paths), batch_size=BATCH_SIZE, shuffle=True,
                        num_workers=workers, persistent_workers=True, drop_last=True)

    def forever() -> Iterator[Any]:
        while True:
            yield from loader

    def close() -> None:
        iterator = loader._iterator
        if iterator is not None:
            iterator._shutdown_workers()

    return Run(forever(), close, samplers=lambda: _children(os.getpid()))


def _start_torchdata(paths: list[str], folder: str, workers: int, pin: int | None) -> Run:
    from functools import partial

    from torchdata.nodes import IterableWrapper, Loader, ParallelMapper, Prefetcher

    node = IterableWrapper(_index_batches(len(paths), seed=1))
    node = ParallelMapper(node, map_fn=partial(_collated, ImageDataset(paths)),
                          num_workers=workers, method="process", in_order=False)
    loader = Loader(Prefetcher(node, prefetch_factor=2))
    iterator = iter(loader)

    def close() -> None:
        with contextlib.suppress(Exception):
            node._it._shutdown()  # type: ignore[attr-defined]

    return Run(iterator, close, samplers=lambda: _children(os.getpid()))


def _start_spdl(paths: list[str], folder: str, workers: int, pin: int | None) -> Run:
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    from spdl.pipeline import PipelineBuilder

    executor = ProcessPoolExecutor(workers, mp_context=_FORK)
    pipeline = (PipelineBuilder()
                .add_source(_index_batches(len(paths), seed=1))
                .pipe(partial(_stacked, ImageDataset(paths)), concurrency=workers,
                      executor=executor)
                .add_sink(4)
                .build(num_threads=workers + 1))
    pipeline.start()

    def close() -> None:
        with contextlib.suppress(Exception):
            pipeline.stop(timeout=5)
        executor.shutdown(wait=False, cancel_futures=True)

    return Run(pipeline.get_iterator(timeout=120), close,
               samplers=lambda: _children(os.getpid()))


def _start_inline(paths: list[str], folder: str, workers: int, pin: int | None) -> Run:
    dataset = ImageDataset(paths)
    batches = (_stacked(dataset, indices) for indices in _index_batches(len(paths), seed=1))
    return Run(batches, lambda: None)


@dataclass(frozen=True)
class Contender:
    label: str
    start: Callable[[list[str], str, int, int | None], Run]
    #: Core of the trainer (and of what it forks); None: every core.
    trainer_core: int | None = None
    #: Core of a feedmux server (and its workers); None: as the trainer.
    server_core: int | None = None
    #: The trainer's CPU per batch (ms), a model's step on its own core.
    step: bool = False
    peer: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    #: Sampling processes of this contender; None: ``--workers``.
    workers: int | None = None


def contenders(spdl: bool, offload: bool, offload_workers: int = 1) -> list[Contender]:
    out = [Contender("feedmux", _start_feedmux), Contender("torch DataLoader", _start_dataloader),
           Contender("torchdata.nodes", _start_torchdata)]
    if spdl:
        out.append(Contender("SPDL", _start_spdl))
    out.append(Contender("one process", _start_inline))
    if offload:
        # One core for each side's sampling: as many processes as a user would run there
        # (``--offload-workers``, 1 by default: the DataLoader's best on its shared core).
        out += [Contender("offload: DataLoader on core 0", _start_dataloader, trainer_core=0,
                          step=True, workers=offload_workers),
                Contender("offload: feedmux on core 1", _start_feedmux, trainer_core=0,
                          server_core=1, step=True, workers=offload_workers)]
    return out


def spdl_installed() -> bool:
    try:
        import spdl.pipeline  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------
# One measurement


def _children(pid: int | None) -> list[int]:
    import psutil

    if pid is None:
        return []
    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return []


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of the processes ``pids`` so far (those still there)."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def _busy(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU (a model's step on the trainer's core)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@dataclass(frozen=True)
class Budget:
    warmup_batches: int
    warmup_seconds: float
    seconds: float
    max_batches: int | None = None
    timeout: float = 180.0
    step_ms: float = 0.0


def _leader(contender: Contender, paths: list[str], folder: str, workers: int, budget: Budget,
            connection: Any) -> None:
    os.setsid()  # one process group: the watchdog kills it whole
    signal.alarm(int(budget.timeout) + 15)
    run = None
    try:
        if contender.trainer_core is not None:
            os.sched_setaffinity(0, {contender.trainer_core})
        run = contender.start(paths, folder, workers, contender.server_core)
        step = budget.step_ms / 1000 if contender.step else 0.0
        batches = run.batches
        warm_end = time.perf_counter() + budget.warmup_seconds
        for count, batch in enumerate(batches, 1):
            touch(batch)
            if count >= budget.warmup_batches and time.perf_counter() >= warm_end:
                break
        samplers = run.samplers()
        server = [run.server] if run.server else []
        server_start, samplers_start = _cpu(server), _cpu(samplers)
        count, images = 0, 0
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        wall_end = wall_start + budget.seconds
        limit = budget.max_batches or (1 << 62)
        for batch in batches:
            touch(batch)
            if step:
                _busy(step)
            count += 1
            images += len(batch["label"])
            if count >= limit or time.perf_counter() >= wall_end:
                break
        wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
        figures = {"batches": count, "images": images, "seconds": wall, "trainer_cpu": cpu,
                   "server_cpu": _cpu(server) - server_start if server else None,
                   "samplers_cpu": _cpu(samplers) - samplers_start if samplers else None,
                   "samplers": len(samplers)}
        connection.send(("result", figures))
    except BaseException:
        connection.send(("error", traceback.format_exc()))
    finally:
        if run is not None:
            with contextlib.suppress(Exception):
                run.close()
        connection.close()


def measure(contender: Contender, paths: list[str], folder: str, workers: int,
            budget: Budget) -> dict[str, Any]:
    """One measurement in a fresh trainer process; its figures or an error, never a hang."""
    receiver, sender = _FORK.Pipe(duplex=False)
    leader = _FORK.Process(target=_leader, daemon=False,
                           args=(contender, paths, folder, workers, budget, sender))
    leader.start()
    sender.close()
    outcome: dict[str, Any] = {"error": f"timed out after {budget.timeout:.0f} s"}
    try:
        if receiver.poll(budget.timeout):
            try:
                kind, payload = receiver.recv()
                outcome = payload if kind == "result" else {"error": payload}
            except EOFError:
                outcome = {"error": f"the trainer process died (exit code {leader.exitcode})"}
    finally:
        leader.join(15)
        assert leader.pid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.join(5)
        receiver.close()
    outcome["label"] = contender.label
    if "error" not in outcome and outcome["images"]:
        images = outcome["images"]
        outcome["images_per_second"] = images / outcome["seconds"]
        outcome["trainer_cpu_us_per_image"] = 1e6 * outcome["trainer_cpu"] / images
        for key in ("server", "samplers"):
            if outcome[f"{key}_cpu"] is not None:
                outcome[f"{key}_cpu_us_per_image"] = 1e6 * outcome[f"{key}_cpu"] / images
    return outcome


# --------------------------------------------------------------------------
# Rounds, ratios, the table


def run(repeats: int = 5, *, quick: bool = False, workers: int = 2, images: int = 1500,
        seconds: float = 12.0, step_ms: float = 90.0, offload: bool | None = None,
        offload_workers: int = 1,
        folder: str | None = None, progress: Callable[[str], None] | None = print,
        only: list[str] | None = None) -> dict[str, Any]:
    """Every contender once per round, rotated each round; the records and the context."""
    spdl = spdl_installed()
    if offload is None:
        offload = len(os.sched_getaffinity(0)) >= 2
    chosen = [c for c in contenders(spdl, offload, offload_workers)
              if not only or c.label in only]
    scratch = None
    if folder is None:
        if quick:
            scratch = tempfile.mkdtemp(prefix="feedmux-bench-images-")
            folder = scratch
        else:
            folder = str(RESULTS_DIR / f"images-{images}")
    budget = (Budget(warmup_batches=1, warmup_seconds=0.0, seconds=0.5, max_batches=2,
                     timeout=120.0, step_ms=1.0) if quick else
              Budget(warmup_batches=3, warmup_seconds=3.0, seconds=seconds,
                     timeout=60.0 + 4 * seconds, step_ms=step_ms))
    try:
        paths = make_images(Path(folder), images)
        records: dict[str, list[dict[str, Any]]] = {c.label: [] for c in chosen}
        for round_index in range(repeats):
            shift = round_index % len(chosen)
            for contender in chosen[shift:] + chosen[:shift]:
                record = measure(contender, paths, folder, contender.workers or workers,
                                 budget)
                record["round"] = round_index
                records[contender.label].append(record)
                if progress is not None:
                    progress(_progress_line(round_index, record))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return {"records": records, "workers": workers, "images": images, "spdl": spdl,
            "step_ms": budget.step_ms, "offload_workers": offload_workers, "repeats": repeats,
            "load": os.getloadavg(),
            "cpus": len(os.sched_getaffinity(0))}


def _progress_line(round_index: int, record: dict[str, Any]) -> str:
    head = f"round {round_index + 1} {record['label']:<32}"
    if "error" in record:
        return f"{head} FAILED: {record['error'].strip().splitlines()[-1]}"
    return f"{head} {record['images_per_second']:8.0f} images/s"


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.median(values) if values else None


def paired(records: dict[str, list[dict[str, Any]]], label: str, base: str,
           key: str = "images_per_second") -> list[float]:
    """``label``'s ``key`` over ``base``'s in the same round, for every round."""
    under = {r["round"]: r.get(key) for r in records.get(base, [])}
    return [r[key] / under[r["round"]] for r in records.get(label, [])
            if r.get(key) and under.get(r["round"])]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict[str, Any]) -> str:
    records = result["records"]
    spdl = "" if result["spdl"] else " SPDL is not installed: not measured."
    lines = [f"### Images: JPEG decode, random resized crop to 224, flip, uint8 CHW, batches of "
             f"{BATCH_SIZE}, {result['workers']} sampling processes, {result['images']} files "
             f"({result['repeats']} round(s), medians; load average at the end "
             f"{result['load'][0]:.2f}, {result['cpus']} CPUs).{spdl}", "",
             "| contender | images/s | / DataLoader (paired, min-max) | trainer CPU µs/image | "
             "server CPU µs/image | sampling processes' CPU µs/image |",
             "|---|---|---|---|---|---|"]
    for label, rows in records.items():
        ratios = paired(records, label, "offload: DataLoader on core 0"
                        if label.startswith("offload") else "torch DataLoader")
        ratio = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                 if ratios else "-")
        lines.append(
            f"| {label} | {_fmt(_median(rows, 'images_per_second'), ',.0f')} | {ratio} | "
            f"{_fmt(_median(rows, 'trainer_cpu_us_per_image'), '.1f')} | "
            f"{_fmt(_median(rows, 'server_cpu_us_per_image'), '.1f')} | "
            f"{_fmt(_median(rows, 'samplers_cpu_us_per_image'), '.0f')} |")
    lines += ["", "| target | figure | met |", "|---|---|---|"]
    for label, base, target in TARGETS:
        ratios = paired(records, label, base)
        value = statistics.median(ratios) if ratios else None
        lines.append(f"| {label} / {base} >= {target:g}x | {_fmt(value, '.2f')}x | "
                     f"{_verdict(value, target, at_least=True)} |")
    # A worker's CPU per image is the workers' CPU over the images: each image is one
    # worker's work.
    quotients = [r["server_cpu_us_per_image"] / r["samplers_cpu_us_per_image"]
                 for r in records.get("feedmux", [])
                 if r.get("server_cpu_us_per_image") is not None
                 and r.get("samplers_cpu_us_per_image")]
    value = statistics.median(quotients) if quotients else None
    lines.append(f"| feedmux server CPU per image / one worker's CPU per image <= 0.1 | "
                 f"{_fmt(value, '.3f')} | {_verdict(value, 0.1, at_least=False)} |")
    cpu = paired(records, "feedmux", "torch DataLoader", "trainer_cpu_us_per_image")
    value = statistics.median(cpu) if cpu else None
    lines.append(f"| feedmux trainer CPU per image / DataLoader's <= 0.1 | {_fmt(value, '.3f')} | "
                 f"{_verdict(value, 0.1, at_least=False)} |")
    if any(label.startswith("offload") for label in records):
        lines.append(f"\nOffload rows: the trainer spends {result['step_ms']:g} ms of CPU per "
                     f"batch (a model's step) on core 0; "
                     f"{result.get('offload_workers', result['workers'])} sampling process(es) "
                     f"on each side's core.")
    failed = sum("error" in r for rows in records.values() for r in rows)
    if failed:
        lines.append(f"\n{failed} measurement(s) failed (see above).")
    return "\n".join(lines)


def _verdict(value: float | None, target: float, at_least: bool) -> str:
    if value is None:
        return "n/a"
    return "met" if (value >= target if at_least else value <= target) else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_images",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=12.0, help="timed seconds per run")
    parser.add_argument("--workers", type=int, default=2, help="sampling processes (default 2)")
    parser.add_argument("--images", type=int, default=1500, help="JPEG files (default 1500)")
    parser.add_argument("--step-ms", type=float, default=90.0,
                        help="the offloaded trainer's CPU per batch (default 90 ms)")
    parser.add_argument("--offload-workers", type=int, default=1,
                        help="sampling processes on each side's one core in the offload rows "
                             "(default 1)")
    parser.add_argument("--no-offload", action="store_true", help="skip the pinned runs")
    parser.add_argument("--only", action="append", help="only this contender (repeatable)")
    parser.add_argument("--no-json", action="store_true", help="write no results file")
    args = parser.parse_args(argv)
    result = run(1 if args.quick else args.repeats, quick=args.quick, workers=args.workers,
                 images=96 if args.quick else args.images, seconds=args.seconds,
                 step_ms=args.step_ms, offload=False if args.no_offload else None,
                 offload_workers=args.offload_workers,
                 only=args.only)
    table = markdown(result)
    print(table)
    if not args.quick and not args.no_json:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"images-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(result, indent=1, default=str))
        print(f"\nraw figures: {path.relative_to(RESULTS_DIR.parent.parent)}")
    return 0 if all("error" not in r for rows in result["records"].values() for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
