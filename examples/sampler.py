"""A sampler to serve: pescador's epoch example, unchanged but for the import.

Make some data and serve it (from the repository root)::

    python examples/make_data.py feedmux-data
    feedmux serve examples.sampler:make_mux --arg data_dir=feedmux-data --epochs 3

Each activation of the exhaustive mux is one pass over every example of every
file, so the server's epochs are true epochs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import feedmux


def data_gen(filename: str) -> Iterator[dict[str, Any]]:
    """Yield the examples of one npz file."""
    with np.load(filename) as data:
        features, labels, ids = data["X"], data["y"], data["id"]
    for i in range(len(ids)):
        yield {"X": features[i], "y": labels[i], "id": ids[i]}


def make_mux(data_dir: str, n_active: int = 100, seed: int | None = None) -> feedmux.StochasticMux:
    """One streamer per file; k larger than the number of files is fine in feedmux."""
    filenames = sorted(str(path) for path in Path(data_dir).glob("*.npz"))
    streams = [feedmux.Streamer(data_gen, filename) for filename in filenames]
    return feedmux.StochasticMux(streams, n_active, rate=None, mode="exhaustive",
                                 random_state=seed)
