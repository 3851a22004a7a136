"""Wire protocol v1 of feedmux (sans-IO: objects to frames and back; never imports zmq).

:func:`encode` turns a message into a list of frames for one ZeroMQ multipart
message and :func:`decode` turns such a list back into a message. Frame 0 is
a msgpack header (a map holding the protocol version under ``"v"`` and the
message kind under ``"k"``), frame 1 of a data message holds its tags as raw
little-endian int64, and large arrays follow as raw frames. Nothing is ever
pickled. The format is described in ``docs/protocol.md``.

Examples
--------
>>> import numpy as np
>>> message = Data(tags=np.array([[1, 0], [1, 1]]), samples=[{"y": 0}, {"y": 1}])
>>> decoded = decode(encode(message))
>>> [sample["y"] for sample in decoded.samples], read_tags(encode(message)).shape
([0, 1], (2, 2))
"""

from feedmux.protocol._batch import SampleBatch
from feedmux.protocol._codec import (
    DEFAULT_LIMITS,
    INLINE_THRESHOLD,
    TAG_DTYPE,
    FrameLike,
    Limits,
    decode,
    encode,
    read_tags,
    replace_tags,
)
from feedmux.protocol._messages import (
    PROTOCOL_VERSION,
    Ack,
    Credit,
    Data,
    Drain,
    EndOfEpoch,
    EndOfStream,
    Error,
    Heartbeat,
    Hello,
    Kind,
    Message,
    Stats,
    StatsRequest,
    Welcome,
)

__all__ = [
    "DEFAULT_LIMITS",
    "INLINE_THRESHOLD",
    "PROTOCOL_VERSION",
    "TAG_DTYPE",
    "Ack",
    "Credit",
    "Data",
    "Drain",
    "EndOfEpoch",
    "EndOfStream",
    "Error",
    "FrameLike",
    "Heartbeat",
    "Hello",
    "Kind",
    "Limits",
    "Message",
    "SampleBatch",
    "Stats",
    "StatsRequest",
    "Welcome",
    "decode",
    "encode",
    "read_tags",
    "replace_tags",
]
