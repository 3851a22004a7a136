"""The one error tree of feedmux.

Every error feedmux raises derives from :class:`FeedmuxError`, and where a
built-in type says the same thing (a bad value, a wrong type, a timeout) the
error subclasses it too, so ``except ValueError`` keeps working for code that
does not know feedmux. Lower layers (zmq, msgpack, numpy) are translated into
this tree at the boundary where they are called, with context added.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "DataError",
    "FactoryError",
    "FeedmuxError",
    "ProtocolError",
    "RemoteError",
    "ResumeWarning",
    "SamplingError",
    "SkipLimitError",
    "StreamError",
    "StreamStateError",
    "StreamTypeError",
    "StreamValueError",
    "TransportClosedError",
    "TransportError",
    "TransportTimeoutError",
    "VersionMismatchError",
]


class FeedmuxError(Exception):
    """The root of every error feedmux raises."""


class ProtocolError(FeedmuxError, ValueError):
    """A message could not be encoded or decoded (malformed, too large, unsupported)."""


class VersionMismatchError(ProtocolError):
    """The peer speaks another protocol version."""


class TransportError(FeedmuxError, ConnectionError):
    """A socket-level failure: the peer is unreachable, the socket is closed, ..."""


class TransportTimeoutError(TransportError, TimeoutError):
    """No message arrived within the configured timeout."""


class TransportClosedError(TransportError):
    """The loader or server was used after it was closed."""


class RemoteError(FeedmuxError, RuntimeError):
    """An exception raised on the server (for example by a streamer), re-raised here.

    Attributes
    ----------
    remote_type : str
        Qualified name of the exception type on the server.
    remote_message : str
        ``str()`` of the remote exception.
    remote_traceback : str
        The formatted traceback from the server.
    """

    def __init__(
        self, remote_type: str, remote_message: str, remote_traceback: str = "", server: str = ""
    ) -> None:
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.server = server
        where = f" on server {server}" if server else ""
        text = f"{remote_type}: {remote_message}{where}"
        if remote_traceback:
            text += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        super().__init__(text)


class ConfigurationError(FeedmuxError, ValueError):
    """A server or loader was given an invalid setting (the message names it)."""


class FactoryError(FeedmuxError, ValueError):
    """``MODULE:ATTR`` could not be resolved into a streamer (import failed, no such
    attribute, the factory raised, or it returned something that is not a streamer)."""


class SamplingError(FeedmuxError, ValueError):
    """A streamer or mux was built with invalid arguments or cannot go on."""


class SkipLimitError(SamplingError):
    """``on_error="skip"`` skipped every sample of an epoch, or too many errors in a row:
    the run stops instead of serving empty epochs (the message names the first error)."""


class DataError(SamplingError):
    """Items could not be combined (e.g. arrays of mismatched shapes in a batch)."""


class StreamError(FeedmuxError):
    """Misuse of :class:`~feedmux.Stream` / :class:`~feedmux.ManualStream`."""


class StreamValueError(StreamError, ValueError):
    """An argument of a Stream method has an invalid value."""


class StreamTypeError(StreamError, TypeError):
    """An argument of a Stream method has an invalid type."""


class StreamStateError(StreamError, AssertionError):
    """A Stream is used in a way its state forbids (zero 0.0.2 asserted these)."""


class ResumeWarning(FeedmuxError, UserWarning):
    """A restored state cannot resume exactly where it was saved (docs/resume.md).

    A free trainer's saved state taken in the middle of an epoch is one: free
    trainers resume at epoch granularity. Turn it into an error with
    ``warnings.simplefilter("error", feedmux.errors.ResumeWarning)``.
    """
