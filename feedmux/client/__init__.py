"""Trainer side of feedmux: Stream / ManualStream (pure) and RemoteLoader (sockets)."""
