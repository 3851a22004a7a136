"""feedmux: a ZeroMQ data server for machine-learning training."""

from feedmux._version import __version__
from feedmux.errors import (
    DataError,
    FeedmuxError,
    ProtocolError,
    RemoteError,
    SamplingError,
    StreamError,
    TransportError,
    TransportTimeoutError,
    VersionMismatchError,
)

__all__ = [
    "DataError",
    "FeedmuxError",
    "ProtocolError",
    "RemoteError",
    "SamplingError",
    "StreamError",
    "TransportError",
    "TransportTimeoutError",
    "VersionMismatchError",
    "__version__",
]
