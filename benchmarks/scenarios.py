"""The benchmark scenarios: their sample generators and how each is measured.

This module owns the data side of the suite: the plain generator functions
every contender runs (feedmux, pescador, torch and the in-process baseline all
iterate the very same function), the factories a feedmux server resolves by
``"benchmarks.scenarios:attr"``, and the table of scenarios with the contenders
each one compares. It must stay importable without feedmux, pescador or torch
installed, so that the peers can still be measured while one of them is absent.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Scenario keys, in the order of the issue.
SMALL = "small"
LARGE = "large"
IMAGES = "images"
CPU = "cpu"
TWO_TRAINERS = "two_trainers"

SMALL_FEATURES = 16
LARGE_ELEMENTS = 4 * 1024 * 1024  # float32: 16 MiB per sample
IMAGE_BATCH_SHAPE = (64, 3, 224, 224)
# The size of the signal whose spectrum the CPU-bound sampler computes: about
# 1 ms of single-threaded numpy work per sample on the 2-core reference machine
# (the in-process contender of that scenario reports the exact figure).
CPU_SIGNAL_LENGTH = 49152
CPU_STREAMERS = 8
#: The batch size of the small-sample scenario's batched contenders.
BATCH_SIZE = 256


def small_samples(seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``{'X': float32[16], 'y': int64 scalar}`` forever, as fast as possible.

    The feature vectors come from a pre-built pool, so the figure measures the
    transport, not a random number generator.
    """
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal((1024, SMALL_FEATURES)).astype(np.float32)
    position = 0
    while True:
        for row in pool:
            yield {"X": row, "y": np.int64(position)}
            position += 1


def large_samples(seed: int = 0, empty: Any = None) -> Iterator[dict[str, Any]]:
    """Yield ``{'X': float32[4M]}`` (16 MiB) forever, alternating two pre-built arrays.

    With ``empty`` (``feedmux.shared_empty``), each sample is built into an array
    from ``empty`` instead: one copy of a pre-built array, the least work that
    makes a fresh sample.
    """
    rng = np.random.default_rng(seed)
    pool = [rng.standard_normal(LARGE_ELEMENTS, dtype=np.float32) for _ in range(2)]
    while True:
        for array in pool:
            if empty is None:
                yield {"X": array}
            else:
                built = empty(LARGE_ELEMENTS, np.float32)
                np.copyto(built, array)
                yield {"X": built}


def image_batches(seed: int = 0, empty: Any = None) -> Iterator[dict[str, Any]]:
    """Yield ``{'X': uint8[64, 3, 224, 224]}`` batches assembled in the producer.

    Each batch stacks 64 images drawn from a small pool into fresh memory, which
    is what a sampler that batches on its side does for every batch. With
    ``empty`` (``feedmux.shared_empty``), that memory comes from ``empty``.
    """
    rng = np.random.default_rng(seed)
    batch_size, *image_shape = IMAGE_BATCH_SHAPE
    pool = rng.integers(0, 256, size=(16, *image_shape), dtype=np.uint8)
    while True:
        picks = rng.integers(0, len(pool), size=batch_size)
        if empty is None:
            yield {"X": np.take(pool, picks, axis=0)}
        else:  # mode="clip": with out= and the default mode, numpy takes into a buffer first
            yield {"X": np.take(pool, picks, axis=0, out=empty(IMAGE_BATCH_SHAPE, np.uint8),
                                mode="clip")}


def cpu_samples(seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``{'X': float32[16], 'y': int64 scalar}`` costing about 1 ms of numpy each.

    The work is a spectrum of a fresh random signal reduced to 16 band
    energies: single-threaded (no BLAS), so worker processes scale with cores.
    """
    rng = np.random.default_rng(seed)
    bands = SMALL_FEATURES
    position = 0
    while True:
        signal = rng.standard_normal(CPU_SIGNAL_LENGTH, dtype=np.float32)
        spectrum = np.abs(np.fft.rfft(signal))
        usable = (spectrum.size // bands) * bands
        features = spectrum[:usable].reshape(bands, -1).mean(axis=1).astype(np.float32)
        yield {"X": features, "y": np.int64(position)}
        position += 1


GENERATORS = {
    SMALL: small_samples,
    LARGE: large_samples,
    IMAGES: image_batches,
    CPU: cpu_samples,
}


@functools.cache
def sample_nbytes(kind: str) -> int:
    """The payload bytes of one sample of a generator (the array data, no framing)."""
    sample = next(GENERATORS[kind]())
    return sum(np.asarray(value).nbytes for value in sample.values())


def feedmux_source(kind: str, seed: int = 0, shared: bool = False) -> Any:
    """The feedmux server's source for a scenario (resolved as ``module:attr``).

    The CPU-bound scenario serves a mux of several streamers so that a server
    with several workers has streamers to shard between them; the others serve
    one streamer over the generator. ``shared`` builds each sample in the
    server's shared-memory pool (``feedmux.shared_empty``).
    """
    import feedmux

    generator = GENERATORS[kind]
    if shared:
        return feedmux.Streamer(generator, seed, feedmux.shared_empty)
    if kind == CPU:
        streamers = [feedmux.Streamer(generator, seed + index) for index in range(CPU_STREAMERS)]
        return feedmux.StochasticMux(
            streamers, n_active=CPU_STREAMERS, rate=None, mode="with_replacement"
        )
    return feedmux.Streamer(generator, seed)


def small_mux(streamers: int = 8) -> Any:
    """Small samples from ``streamers`` streamers under one ``StochasticMux``: a source
    that a seeded server splits into shards (a plain streamer is one shard, so its seeded
    run never switches random states)."""
    import feedmux

    return feedmux.StochasticMux([feedmux.Streamer(small_samples, index)
                                  for index in range(streamers)],
                                 n_active=streamers, rate=None, mode="with_replacement")


# --------------------------------------------------------------------------
# What each scenario compares.


@dataclass(frozen=True)
class Contender:
    """One way of feeding the trainer, measured in one scenario."""

    peer: str  # "feedmux", "pyzmq", "pescador", "torch", "inline"
    transport: str = "tcp"  # "tcp", "ipc", "queue" (torch), "none" (inline)
    workers: int = 1  # producer processes (feedmux --workers, DataLoader num_workers)
    trainers: int = 1  # consuming processes sharing the producer
    show_workers: bool = False  # name the worker count in the label
    seed: int | None = None  # feedmux --seed: a repeatable run (workers merged in a fixed order)
    zero_copy: bool = False  # feedmux: arrays sent as views (the streamer promises no reuse)
    ranked: bool = False  # feedmux: the trainers are the ranks of one job (rank=, world_size=)
    #: feedmux: each trainer is a consumer group of its own (group=): each gets every sample.
    groups: bool = False
    mode: str = ""  # feedmux only: one of MODES ("" is the default server and loader)
    #: Samples per step the trainer takes as one batch (feedmux: ``RemoteLoader(batch_size=)``,
    #: stacked by the server; torch: ``DataLoader(batch_size=)``, collated by its workers);
    #: 0: one sample per step. Rates and CPU are still counted per sample.
    batch_size: int = 0

    @property
    def label(self) -> str:
        names = {
            "feedmux": "feedmux",
            "pyzmq": "raw pyzmq",
            "pescador": "pescador ZMQStreamer",
            "torch": "torch DataLoader",
            "inline": "in-process generator",
        }
        parts = [names[self.peer]]
        if self.show_workers or self.peer == "torch":
            parts.append(f"{self.workers} worker{'s' if self.workers != 1 else ''}")
        if self.trainers != 1:
            kind = "ranked trainers" if self.ranked else "groups" if self.groups else "trainers"
            parts.append(f"{self.trainers} {kind}")
        if self.seed is not None:
            parts.append("seeded")
        if self.zero_copy:
            parts.append("zero-copy")
        if self.batch_size:
            parts.append(f"batch_size={self.batch_size}")
        if self.mode:
            parts.append(MODES[self.mode])
        return ", ".join(parts)

    @property
    def key(self) -> str:
        key = f"{self.peer}/{self.transport}/w{self.workers}/t{self.trainers}"
        key += "/ranked" if self.ranked else ""
        key += "/groups" if self.groups else ""
        key += "" if self.seed is None else "/seeded"
        key += "/zc" if self.zero_copy else ""
        key += f"/b{self.batch_size}" if self.batch_size else ""
        return f"{key}/{self.mode}" if self.mode else key


#: The feedmux variants a scenario can measure besides the default, and their labels.
MODES = {
    "curve": "CURVE",
    "noshm": "--no-shm",
    "shared": "shared_empty",
}


@dataclass(frozen=True)
class Scenario:
    """A workload, the contenders it compares and how long each one runs."""

    key: str
    number: int
    title: str
    kind: str  # the generator (a key of GENERATORS)
    contenders: tuple[Contender, ...]
    check_every: int = 1  # samples between two clock reads in the timed loop
    warmup_seconds: float = 1.0
    seconds: float = 3.0
    large: bool = False  # report GB/s
    reference: Contender = field(default_factory=lambda: Contender("feedmux"))


def _transport_pair(peer: str) -> tuple[Contender, ...]:
    return (Contender(peer, "tcp"), Contender(peer, "ipc"))


_ONE_TRAINER_PEERS = (
    *_transport_pair("feedmux"),
    # What the default copy of every array (a streamer may reuse one) costs.
    Contender("feedmux", "tcp", zero_copy=True),
    *_transport_pair("pyzmq"),
    Contender("pescador", "tcp"),
    Contender("torch", "queue", workers=2),
    Contender("inline", "none"),
)


def _modes(*modes: str) -> tuple[Contender, ...]:
    return tuple(Contender("feedmux", "tcp", mode=mode) for mode in modes)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        SMALL,
        1,
        "Small samples: {'X': float32[16], 'y': int64}",
        SMALL,
        (*_ONE_TRAINER_PEERS, *_modes("curve"),
         # Batches of a training step: stacked by the server, collated by torch's workers.
         Contender("feedmux", "tcp", batch_size=BATCH_SIZE),
         Contender("torch", "queue", workers=2, batch_size=BATCH_SIZE)),
        check_every=256,
    ),
    Scenario(
        LARGE,
        2,
        "Large samples: {'X': float32[4M]} (16 MiB)",
        LARGE,
        (*_ONE_TRAINER_PEERS, *_modes("noshm", "shared", "curve")),
        large=True,
    ),
    Scenario(
        IMAGES,
        3,
        "Image-like batches: uint8[64,3,224,224] (9.6 MB) per message",
        IMAGES,
        (*_ONE_TRAINER_PEERS, *_modes("noshm", "shared")),
        large=True,
    ),
    Scenario(
        CPU,
        4,
        "CPU-bound sampler (about 1 ms of numpy per sample)",
        CPU,
        (
            Contender("feedmux", "tcp", workers=1, show_workers=True),
            Contender("feedmux", "tcp", workers=2, show_workers=True),
            Contender("feedmux", "tcp", workers=2, show_workers=True, seed=0),
            Contender("torch", "queue", workers=1),
            Contender("torch", "queue", workers=2),
            Contender("inline", "none"),
        ),
        check_every=16,
        seconds=4.0,
    ),
    Scenario(
        TWO_TRAINERS,
        5,
        "Two trainers on one server (small samples)",
        SMALL,
        (
            Contender("feedmux", "tcp", trainers=1),
            Contender("feedmux", "tcp", trainers=2),
            Contender("feedmux", "tcp", trainers=2, ranked=True),
            Contender("feedmux", "tcp", workers=2, trainers=2, show_workers=True),
            Contender("feedmux", "tcp", workers=2, trainers=2, show_workers=True, ranked=True),
            Contender("pyzmq", "tcp", trainers=1),
            Contender("pyzmq", "tcp", trainers=2),
        ),
        check_every=256,
    ),
)

SCENARIO_KEYS = tuple(scenario.key for scenario in SCENARIOS)


def select(names: list[str] | None) -> list[Scenario]:
    """The scenarios named by key or number (all of them for None or an empty list)."""
    if not names:
        return list(SCENARIOS)
    chosen = []
    for name in names:
        matches = [s for s in SCENARIOS if name in (s.key, str(s.number))]
        if not matches:
            known = ", ".join(f"{s.number}={s.key}" for s in SCENARIOS)
            raise ValueError(f"unknown scenario {name!r}; expected one of {known}")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return chosen
