"""The pescador-compatible sampling library: streamers, muxes, maps and epochs (pure).

The names here are pescador 3.0's (``Streamer``, ``streamable``, the four
muxes and the three maps) plus ``from_dataset`` (a map-style dataset as a
streamer) and what the server needs to run them (``EpochIterator``,
``shard``, ``is_streamer``). Importing this package never
imports zmq, :mod:`feedmux.server` or :mod:`feedmux.client`.
"""

from feedmux.sampling.datasets import DatasetStreamer, from_dataset
from feedmux.sampling.epochs import EpochIterator, is_streamer, shard
from feedmux.sampling.maps import buffer_stream, keras_tuples, tuples
from feedmux.sampling.mux import BaseMux, ChainMux, RoundRobinMux, ShuffledMux, StochasticMux
from feedmux.sampling.streamer import Streamer, streamable

__all__ = [
    "BaseMux",
    "ChainMux",
    "DatasetStreamer",
    "EpochIterator",
    "RoundRobinMux",
    "ShuffledMux",
    "StochasticMux",
    "Streamer",
    "buffer_stream",
    "from_dataset",
    "is_streamer",
    "keras_tuples",
    "shard",
    "streamable",
    "tuples",
]
