"""Wire protocol v1 of feedmux (sans-IO: objects to frames and back; never imports zmq).

:func:`encode` turns a message into a list of frames for one ZeroMQ multipart
message and :func:`decode` turns such a list back into a message. Frame 0 is
a msgpack header (a map holding the protocol version under ``"v"`` and the
message kind under ``"k"``), frame 1 of a data message holds its tags as raw
little-endian int64, and large arrays follow as raw frames. On the data socket
a message from the server is preceded by an envelope frame (:func:`pack_envelope`,
:func:`unpack_envelope`). Nothing is ever pickled. The format is described in
``docs/protocol.md``.

The modules, one job each: ``_messages`` (the message classes and kinds),
``_ext`` (msgpack ext codes), ``_fields`` (control-message field checks),
``_frames`` (the frame layout and version check), ``_tags`` (the tag frame),
``_encode``, ``_decode``, ``_batch`` (stacked samples), ``_stacking`` (a
trainer's batches: every number stacked), ``_dtypes`` (dtype
descriptions), ``_envelope``, ``_compress`` (compressed messages, kind 15) and
``_delta`` (the delta filter of compressed frames).

Examples
--------
>>> import numpy as np
>>> message = Data(tags=np.array([[1, 0], [1, 1]]), samples=[{"y": 0}, {"y": 1}])
>>> decoded = decode(encode(message))
>>> [sample["y"] for sample in decoded.samples], read_tags(encode(message)).shape
([0, 1], (2, 2))
"""

from feedmux.protocol._batch import (
    SampleBatch,
    StackedLeaf,
    stack_scalars,
    stacking_into,
    take_samples,
)
from feedmux.protocol._compress import (
    INFLATES,
    Codec,
    compress_frames,
    inflate_frames,
    packed,
    parse_compress,
)
from feedmux.protocol._decode import CONTROL_LIMITS, DEFAULT_LIMITS, Limits, Resolver, decode
from feedmux.protocol._encode import INLINE_THRESHOLD, encode
from feedmux.protocol._envelope import ENVELOPE_BYTES, pack_envelope, unpack_envelope
from feedmux.protocol._frames import FrameLike
from feedmux.protocol._messages import (
    PROTOCOL_VERSION,
    RESUME_CHECKPOINT,
    RESUME_LIVE,
    STATS_NEXT_PAGE,
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
    Scale,
    ShmAttach,
    ShmOffer,
    Stats,
    StatsRequest,
    StatValue,
    Welcome,
    stats_order,
)
from feedmux.protocol._ragged import (
    Padded,
    gathered,
    padded_batch,
    ragged_tree,
    stacked_batch,
    without_padding,
)
from feedmux.protocol._stacking import stacked_tree, take_rows, training_batch
from feedmux.protocol._tags import TAG_DTYPE, position_runs, read_tags, replace_tags
from feedmux.protocol._tensors import TensorError, is_tensor, tensor_array

__all__ = [
    "CONTROL_LIMITS",
    "DEFAULT_LIMITS",
    "ENVELOPE_BYTES",
    "INFLATES",
    "INLINE_THRESHOLD",
    "PROTOCOL_VERSION",
    "RESUME_CHECKPOINT",
    "RESUME_LIVE",
    "STATS_NEXT_PAGE",
    "TAG_DTYPE",
    "Ack",
    "Codec",
    "Resolver",
    "Scale",
    "ShmAttach",
    "ShmOffer",
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
    "Padded",
    "SampleBatch",
    "StackedLeaf",
    "StatValue",
    "Stats",
    "StatsRequest",
    "TensorError",
    "Welcome",
    "compress_frames",
    "decode",
    "encode",
    "gathered",
    "inflate_frames",
    "is_tensor",
    "pack_envelope",
    "packed",
    "padded_batch",
    "parse_compress",
    "position_runs",
    "ragged_tree",
    "read_tags",
    "replace_tags",
    "stack_scalars",
    "stacked_batch",
    "stacked_tree",
    "stacking_into",
    "stats_order",
    "take_rows",
    "take_samples",
    "tensor_array",
    "training_batch",
    "unpack_envelope",
    "without_padding",
]
