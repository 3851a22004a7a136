"""The run's seed, the per-epoch reseeding of a sampling process, and worker_info()."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import feedmux
from feedmux.errors import ConfigurationError
from feedmux.sampling import EpochIterator, StochasticMux, Streamer
from feedmux.server._sources.seeding import EpochSeeder, reseed_globals, resolve_seed
from feedmux.server.config import ServerConfig

REPO = Path(__file__).resolve().parents[2]


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_the_seed_option_wins_then_the_mux_seed_then_fresh_entropy() -> None:
    mux = StochasticMux(["ab", "cd"], 1, rate=None, random_state=11)
    assert resolve_seed(3, mux) == (3, "seed option")
    assert resolve_seed(None, mux) == (11, "the mux's random_state")
    assert resolve_seed(None, Streamer(mux)) == (11, "the mux's random_state")
    seeded_by_generator = StochasticMux(["ab"], 1, rate=None,
                                        random_state=np.random.default_rng(1))
    first, origin = resolve_seed(None, seeded_by_generator)
    assert origin == "fresh entropy"
    assert first != resolve_seed(None, Streamer("ab"))[0]  # a new run, new entropy


def test_reseeding_repeats_for_a_worker_and_epoch_and_differs_otherwise() -> None:
    seen = {}
    for key in [(0, 1), (1, 1), (0, 2), (1, 2)]:
        reseed_globals(7, *key)
        seen[key] = draws()
        reseed_globals(7, *key)
        assert draws() == seen[key]
    values = [value for triple in seen.values() for value in triple]
    assert len(set(values)) == len(values), "two RNGs or two (worker, epoch) share a state"
    reseed_globals(8, 0, 1)
    assert draws() != seen[0, 1]


def test_reseeding_never_imports_torch() -> None:
    code = ("import sys\nfrom feedmux.server._sources.seeding import reseed_globals\n"
            "reseed_globals(1, 0, 1)\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_an_epoch_starts_with_its_seed_and_worker_info_before_its_first_item() -> None:
    def noisy():  # type: ignore[no-untyped-def]
        info = feedmux.worker_info()
        assert info is not None
        for _ in range(3):
            yield info.epoch, float(np.random.random())

    seeder = EpochSeeder(seed=5, worker=1, num_workers=2)
    try:
        epochs = EpochIterator(Streamer(noisy), max_epochs=3, on_epoch_start=seeder)
        runs = [epochs.take(10) for _ in range(3)]
        assert [run.items[0][0] for run in runs] == [1, 2, 3]
        assert feedmux.worker_info() == feedmux.WorkerInfo(id=1, num_workers=2, seed=5, epoch=3)
        again = EpochIterator(Streamer(noisy), max_epochs=3, on_epoch_start=seeder)
        assert [again.take(10).items for _ in range(3)] == [run.items for run in runs]
        assert runs[0].items != runs[1].items
    finally:
        EpochSeeder.clear()
    assert feedmux.worker_info() is None


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_a_bad_seed_is_refused(seed: object) -> None:
    with pytest.raises(ConfigurationError, match="expected seed None or an int >= 0, got"):
        ServerConfig(source="a:b", seed=seed)  # type: ignore[arg-type]


def test_numpy_random_is_loaded_before_the_workers_fork() -> None:
    # numpy 2 loads numpy.random at its first use: a forked worker that reseeds first
    # would import it again, about 40 ms of CPU in each of up to 16 workers.
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, feedmux.server.server; "
         "print('numpy.random' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "True", loaded
