"""Side-by-side benchmarks of feedmux against its peers.

``python -m benchmarks`` runs every scenario with feedmux, raw pyzmq, pescador's
``ZMQStreamer``, a torch ``DataLoader`` and the generator in the trainer itself,
interleaved and repeated, then prints a markdown table of medians and writes
the raw figures as JSON under ``benchmarks/results/``. ``run()`` does the same
from Python and returns the figures.
"""

from benchmarks._suite import run, run_others

__all__ = ["run", "run_others"]
