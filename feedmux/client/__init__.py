"""Trainer side of feedmux: Stream / ManualStream (pure) and RemoteLoader (sockets)."""

from feedmux.client.stream import ManualStream, Stream

__all__ = [
    "ManualStream",
    "Stream",
]
