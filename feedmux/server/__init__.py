"""Sampler side of feedmux: streamers, muxes and maps (pure) and the server (sockets).

The names here are pescador 3.0's (``Streamer``, ``streamable``, the four
muxes and the three maps) plus what the server needs to run them
(``EpochIterator``, ``shard``, ``is_streamer``). Importing this package never
imports zmq: the socket code lives in its own modules.
"""

from feedmux.server.epochs import EpochIterator, is_streamer, shard
from feedmux.server.maps import buffer_stream, keras_tuples, tuples
from feedmux.server.mux import BaseMux, ChainMux, RoundRobinMux, ShuffledMux, StochasticMux
from feedmux.server.streamer import Streamer, streamable

__all__ = [
    "BaseMux",
    "ChainMux",
    "EpochIterator",
    "RoundRobinMux",
    "ShuffledMux",
    "StochasticMux",
    "Streamer",
    "buffer_stream",
    "is_streamer",
    "keras_tuples",
    "shard",
    "streamable",
    "tuples",
]
