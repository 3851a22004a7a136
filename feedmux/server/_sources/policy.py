"""How samples are grouped into data messages: the policy, as plain data.

This module owns :class:`BatchPolicy` (a fixed count per message, or sized from
the first sample; whether drawn arrays are copied) and the sizes it reads from a
sample. It is plain data that crosses into worker processes with the server's
configuration: it must never draw, encode or send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from feedmux._plumbing.shm import SHM_THRESHOLD
from feedmux.server.config import ServerConfig

__all__ = ["MAX_SAMPLES_PER_MESSAGE", "TARGET_MESSAGE_BYTES", "BatchPolicy", "payload_bytes"]

#: Most samples one data message carries when the caller does not fix it.
MAX_SAMPLES_PER_MESSAGE = 256
#: Target payload of one data message; bigger samples travel one per message.
TARGET_MESSAGE_BYTES = 4 * 1024 * 1024

@dataclass(frozen=True)
class BatchPolicy:
    """How samples are grouped into data messages.

    Parameters
    ----------
    samples_per_message : int or None
        A fixed count, or None to size each message from its first sample:
        as many samples as fit in ``TARGET_MESSAGE_BYTES``, at most
        ``MAX_SAMPLES_PER_MESSAGE``.
    max_delay : float
        About how long a message may take to fill: a message holds no more
        samples than the sampler makes in this time (from a running mean of its
        time per sample), so a slow sampler does not hold finished samples back.
    """

    samples_per_message: int | None = None
    max_delay: float = 0.005
    #: Whether array frames are copies rather than views of the streamer's arrays.
    #: A streamer may reuse one array for every sample (``buf[:] = ...; yield buf``): a view
    #: would then change under a message still queued, or kept for re-sending (a lost
    #: trainer's rest, a rank's successor's). Each item is made the server's own as it is
    #: drawn (:mod:`feedmux.server._sources.owning`): small flat samples are copied straight
    #: into the message's stacked arrays, which the codec would build anyway, so they cost
    #: about what zero-copy costs; bigger ones cost one memcpy per array (see ``make
    #: bench``). ``zero_copy=True`` on the server skips the copy for streamers that never
    #: reuse an array.
    copy_arrays: bool = True

    @classmethod
    def of(cls, config: ServerConfig) -> BatchPolicy:
        """The policy a server's options ask for."""
        return cls(config.samples_per_message, config.max_delay, not config.zero_copy)

    def limit_for(self, first_sample: Any) -> int:
        """How many samples the message starting with ``first_sample`` may hold."""
        if self.samples_per_message is not None:
            return self.samples_per_message
        if largest_array(first_sample) >= SHM_THRESHOLD:
            # An array that large goes through the shared pool, where its owned copy
            # already is: stacking it with others would copy it again, and the
            # message would take twice its size in the pool until it is sent.
            return 1
        size = max(1, payload_bytes(first_sample))
        return max(1, min(MAX_SAMPLES_PER_MESSAGE, TARGET_MESSAGE_BYTES // size))


def payload_bytes(sample: Any) -> int:
    """Bytes of array data in a sample (containers walked; other leaves count 8)."""
    if isinstance(sample, np.ndarray):
        return int(sample.nbytes)
    if isinstance(sample, dict):
        return sum(payload_bytes(value) for value in sample.values())
    if isinstance(sample, (list, tuple)):
        return sum(payload_bytes(value) for value in sample)
    if isinstance(sample, (str, bytes)):
        return len(sample)
    return 8


def largest_array(sample: Any) -> int:
    """Bytes of the largest array in a sample (containers walked)."""
    if isinstance(sample, np.ndarray):
        return int(sample.nbytes)
    values = sample.values() if isinstance(sample, dict) else (
        sample if isinstance(sample, (list, tuple)) else ())
    return max((largest_array(value) for value in values), default=0)
