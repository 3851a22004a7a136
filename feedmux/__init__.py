"""feedmux: a ZeroMQ data server for machine-learning training.

A sampler server runs pescador-style streamers and muxes (with true epochs)
and pushes their samples over ZeroMQ; trainers iterate a
:class:`RemoteLoader`, alone or through zero-style :class:`Stream` /
:class:`ManualStream` loops. The names below are the public API.
"""

from typing import TYPE_CHECKING, Any

from feedmux._version import __version__
from feedmux.errors import (
    ConfigurationError,
    DataError,
    FactoryError,
    FeedmuxError,
    ProtocolError,
    RemoteError,
    ResumeWarning,
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

if TYPE_CHECKING:
    from feedmux._plumbing.shm import shared_empty
    from feedmux._worker_info import WorkerInfo, worker_info
    from feedmux.client.remote import BatchMeta, RemoteLoader, SampleMeta, fetch_stats
    from feedmux.client.stream import ManualStream, Stream
    from feedmux.sampling.datasets import from_dataset
    from feedmux.sampling.maps import buffer_stream, keras_tuples, tuples
    from feedmux.sampling.mux import ChainMux, RoundRobinMux, ShuffledMux, StochasticMux
    from feedmux.sampling.streamer import Streamer, streamable
    from feedmux.server.server import Server, serve

# The layers load on first use (PEP 562): ``import feedmux.protocol`` loads no
# sampling, server or client code, and ``import feedmux.sampling`` never loads zmq.
_LAZY = {
    "ChainMux": "feedmux.sampling.mux",
    "RoundRobinMux": "feedmux.sampling.mux",
    "ShuffledMux": "feedmux.sampling.mux",
    "StochasticMux": "feedmux.sampling.mux",
    "Streamer": "feedmux.sampling.streamer",
    "buffer_stream": "feedmux.sampling.maps",
    "from_dataset": "feedmux.sampling.datasets",
    "keras_tuples": "feedmux.sampling.maps",
    "streamable": "feedmux.sampling.streamer",
    "tuples": "feedmux.sampling.maps",
    "ManualStream": "feedmux.client.stream",
    "RemoteLoader": "feedmux.client.remote",
    "BatchMeta": "feedmux.client.remote",
    "SampleMeta": "feedmux.client.remote",
    "Server": "feedmux.server.server",
    "Stream": "feedmux.client.stream",
    "fetch_stats": "feedmux.client.remote",
    "serve": "feedmux.server.server",
    "WorkerInfo": "feedmux._worker_info",
    "worker_info": "feedmux._worker_info",
    "shared_empty": "feedmux._plumbing.shm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'feedmux' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BatchMeta",
    "ChainMux",
    "ConfigurationError",
    "DataError",
    "FactoryError",
    "FeedmuxError",
    "ManualStream",
    "ProtocolError",
    "RemoteError",
    "RemoteLoader",
    "ResumeWarning",
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
    "WorkerInfo",
    "__version__",
    "buffer_stream",
    "fetch_stats",
    "from_dataset",
    "keras_tuples",
    "serve",
    "shared_empty",
    "streamable",
    "tuples",
    "worker_info",
]
