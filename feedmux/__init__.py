"""feedmux: a ZeroMQ data server for machine-learning training.

A sampler server runs pescador-style streamers and muxes (with true epochs)
and pushes their samples over ZeroMQ; trainers iterate a
:class:`RemoteLoader`, alone or through zero-style :class:`Stream` /
:class:`ManualStream` loops. The names below are the public API.
"""

from feedmux._version import __version__
from feedmux.client.remote import RemoteLoader, SampleMeta, fetch_stats
from feedmux.client.stream import ManualStream, Stream
from feedmux.errors import (
    ConfigurationError,
    DataError,
    FactoryError,
    FeedmuxError,
    ProtocolError,
    RemoteError,
    SamplingError,
    StreamError,
    StreamStateError,
    StreamTypeError,
    StreamValueError,
    TransportClosedError,
    TransportError,
    TransportTimeoutError,
    VersionMismatchError,
)
from feedmux.sampling.maps import buffer_stream, keras_tuples, tuples
from feedmux.sampling.mux import ChainMux, RoundRobinMux, ShuffledMux, StochasticMux
from feedmux.sampling.streamer import Streamer, streamable
from feedmux.server.server import Server, serve

__all__ = [
    "ChainMux",
    "ConfigurationError",
    "DataError",
    "FactoryError",
    "FeedmuxError",
    "ManualStream",
    "ProtocolError",
    "RemoteError",
    "RemoteLoader",
    "RoundRobinMux",
    "SampleMeta",
    "SamplingError",
    "Server",
    "ShuffledMux",
    "StochasticMux",
    "Stream",
    "StreamError",
    "StreamStateError",
    "StreamTypeError",
    "StreamValueError",
    "Streamer",
    "TransportClosedError",
    "TransportError",
    "TransportTimeoutError",
    "VersionMismatchError",
    "__version__",
    "buffer_stream",
    "fetch_stats",
    "keras_tuples",
    "serve",
    "streamable",
    "tuples",
]
