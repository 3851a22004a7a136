"""Golden bytes: fixed messages must encode to exactly these frames, and decode back.

A failure here means the wire format changed. That is only allowed together with
a new PROTOCOL_VERSION and an update of docs/protocol.md.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from feedmux.protocol import (
    ENVELOPE_BYTES,
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
    SampleBatch,
    Scale,
    ShmAttach,
    ShmOffer,
    Stats,
    StatsRequest,
    Welcome,
    decode,
    encode,
    pack_envelope,
    unpack_envelope,
)
from feedmux.protocol import _ext as ext_codes
from tests.protocol.test_compress import GOLDEN as COMPRESSED_GOLDEN
from tests.protocol.trees import assert_same


def frames_of(*hex_frames: str) -> list[bytes]:
    return [bytes.fromhex(frame) for frame in hex_frames]


GOLDEN: list[tuple[str, Any, dict[str, Any], list[bytes]]] = [
    (
        "shm-offer",
        ShmOffer(path="/dev/shm/x", server_id="s1"),
        {},
        frames_of(
            # {"v": 1, "k": 13, "path": "/dev/shm/x", "server_id": "s1"}
            "84 a1 76 01 a1 6b 0d a4 70 61 74 68 aa 2f 64 65 76 2f 73 68 6d 2f 78 a9 73 65 72"
            " 76 65 72 5f 69 64 a2 73 31",
        ),
    ),
    (
        "shm-attach",
        ShmAttach(token="ab", client_id="c"),
        {},
        frames_of(
            # {"v": 1, "k": 14, "token": "ab", "client_id": "c"}
            "84 a1 76 01 a1 6b 0e a5 74 6f 6b 65 6e a2 61 62 a9 63 6c 69 65 6e 74 5f 69 64 a1 63",
        ),
    ),
    (
        "scale",
        Scale(workers=3, client_id="c"),
        {},
        frames_of(
            # {"v": 1, "k": 16, "workers": 3, "client_id": "c"}
            "84 a1 76 01 a1 6b 10 a7 77 6f 72 6b 65 72 73 03 a9 63 6c 69 65 6e 74 5f 69 64 a1 63",
        ),
    ),
    (
        "hello",
        Hello(client_id="trainer-0", role="trainer", world_size=2),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "trainer-0", "role": "trainer", "world_size": 2}
            "85 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a9 74 72 61 69 6e 65 72 2d 30"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 02",
        ),
    ),
    (
        "welcome",
        Welcome(
            server_id="s1",
            epoch_size=1000,
            epoch=2,
            samples_per_message=64,
            finished=False,
            workers=2,
            reliable=True,
        ),
        {},
        frames_of(
            # {"v": 1, "k": 3, "server_id": "s1", "epoch_size": 1000, "epoch": 2,
            #  "samples_per_message": 64, "finished": false, "workers": 2, "reliable": true}
            "89 a1 76 01 a1 6b 03 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 aa 65 70 6f 63 68"
            " 5f 73 69 7a 65 cd 03 e8 a5 65 70 6f 63 68 02 b3 73 61 6d 70 6c 65 73 5f 70 65"
            " 72 5f 6d 65 73 73 61 67 65 40 a8 66 69 6e 69 73 68 65 64 c2 a7 77 6f 72 6b 65"
            " 72 73 02 a8 72 65 6c 69 61 62 6c 65 c3",
        ),
    ),
    (
        "welcome-defaults",
        Welcome(server_id="s1"),
        {},
        frames_of(
            # every field is written, defaults too: "epoch_size": nil (c0), "epoch": 0, ...
            "89 a1 76 01 a1 6b 03 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 aa 65 70 6f 63 68"
            " 5f 73 69 7a 65 c0 a5 65 70 6f 63 68 00 b3 73 61 6d 70 6c 65 73 5f 70 65 72 5f"
            " 6d 65 73 73 61 67 65 01 a8 66 69 6e 69 73 68 65 64 c2 a7 77 6f 72 6b 65 72 73"
            " 01 a8 72 65 6c 69 61 62 6c 65 c2",
        ),
    ),
    (
        "hello-ranked",
        Hello(client_id="trainer-1", world_size=2, rank=1),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "trainer-1", "role": "trainer", "world_size": 2,
            #  "rank": 1}: rank is written only when it is not -1 (a free trainer)
            "86 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a9 74 72 61 69 6e 65 72 2d 31"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 02"
            " a4 72 61 6e 6b 01",
        ),
    ),
    (
        "hello-grouped",
        Hello(client_id="t1", group="eval"),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t1", "role": "trainer", "world_size": 1,
            #  "group": "eval"}: group is written only when it is not "" (the default group)
            "86 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 31"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 01"
            " a5 67 72 6f 75 70 a4 65 76 61 6c",
        ),
    ),
    (
        "hello-resumed",
        Hello(client_id="t2", world_size=2, rank=1, resume=(2, 40, 2, 1)),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t2", "role": "trainer", "world_size": 2, "rank": 1,
            #  "resume": (2, 40, 2, 1)}: resume is written only when it is not empty (a tuple:
            #  an array whose first element is the tuple marker, ext 4 of length 0)
            "87 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 32"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 02"
            " a4 72 61 6e 6b 01 a6 72 65 73 75 6d 65 95 c7 00 04 02 28 02 01",
        ),
    ),
    (
        "hello-handed",
        Hello(client_id="t3", handed=(2, 8, 12)),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t3", "role": "trainer", "world_size": 1,
            #  "handed": (2, 8, 12)}: handed is written only when it is not empty
            "86 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 33"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 01"
            " a6 68 61 6e 64 65 64 94 c7 00 04 02 08 0c",
        ),
    ),
    (
        "hello-handed-below",
        Hello(client_id="t5", handed=(2, 40, 48), handed_below=(2, 40, 2, 8, 16)),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t5", "role": "trainer", "world_size": 1,
            #  "handed": (2, 40, 48), "handed_below": (2, 40, 2, 8, 16)}: handed_below is
            #  written only when it is not empty, so older hellos keep their bytes
            "87 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 35"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 01"
            " a6 68 61 6e 64 65 64 94 c7 00 04 02 28 30"
            " ac 68 61 6e 64 65 64 5f 62 65 6c 6f 77 96 c7 00 04 02 28 02 08 10",
        ),
    ),
    (
        "heartbeat-handed-below",
        Heartbeat(sender_id="s1", handed_below=(2, 40, 2, 8, 16)),
        {},
        frames_of(
            # {"v": 1, "k": 4, "sender_id": "s1", "received_messages": 0,
            #  "handed_below": (2, 40, 2, 8, 16)}: before epoch 2, position 40 everything
            #  was handed out but positions 8 .. 15 of epoch 2 (written only when not empty)
            "85 a1 76 01 a1 6b 04 a9 73 65 6e 64 65 72 5f 69 64 a2 73 31 b1 72 65 63 65 69"
            " 76 65 64 5f 6d 65 73 73 61 67 65 73 00"
            " ac 68 61 6e 64 65 64 5f 62 65 6c 6f 77 96 c7 00 04 02 28 02 08 10",
        ),
    ),
    (
        "hello-batches",
        Hello(client_id="t4", batch_size=256, drop_last=True),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t4", "role": "trainer", "world_size": 1,
            #  "batch_size": 256, "drop_last": True}: both written only when they are not
            #  their defaults (0: single samples; False), so older hellos keep their bytes
            "87 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 34"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 01"
            " aa 62 61 74 63 68 5f 73 69 7a 65 cd 01 00 a9 64 72 6f 70 5f 6c 61 73 74 c3",
        ),
    ),
    (
        "hello-buckets",
        Hello(client_id="t6", world_size=2, rank=0, batch_size=8, bucket_by="tokens"),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t6", "role": "trainer", "world_size": 2,
            #  "rank": 0, "batch_size": 8, "bucket_by": "tokens"}: bucket_by is written only
            #  when it is not "" (no buckets), so older hellos keep their bytes
            "88 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 36"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 02"
            " a4 72 61 6e 6b 00 aa 62 61 74 63 68 5f 73 69 7a 65 08"
            " a9 62 75 63 6b 65 74 5f 62 79 a6 74 6f 6b 65 6e 73",
        ),
    ),
    (
        "hello-codecs",
        Hello(client_id="t7", codecs=(1, 2, 3)),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t7", "role": "trainer", "world_size": 1,
            #  "codecs": (1, 2, 3)}: the codecs of compressed frames the trainer inflates,
            #  written only when it names some (a tuple: our tuple marker, ext 4, first)
            "86 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 37"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 01"
            " a6 63 6f 64 65 63 73 94 c7 00 04 01 02 03",
        ),
    ),
    (
        "hello-predecessor",
        Hello(client_id="t8", world_size=2, rank=1, predecessor=(3, 45),
              predecessor_server="9f2c41d07a3e"),
        {},
        frames_of(
            # {"v": 1, "k": 2, "client_id": "t8", "role": "trainer", "world_size": 2,
            #  "rank": 1, "predecessor": (3, 45), "predecessor_server": "9f2c41d07a3e"}: what
            #  a dead predecessor of the rank handed out last (its mark file), written only
            #  when there is one
            "88 a1 76 01 a1 6b 02 a9 63 6c 69 65 6e 74 5f 69 64 a2 74 38"
            " a4 72 6f 6c 65 a7 74 72 61 69 6e 65 72 aa 77 6f 72 6c 64 5f 73 69 7a 65 02"
            " a4 72 61 6e 6b 01"
            " ab 70 72 65 64 65 63 65 73 73 6f 72 93 c7 00 04 03 2d"
            " b2 70 72 65 64 65 63 65 73 73 6f 72 5f 73 65 72 76 65 72"
            " ac 39 66 32 63 34 31 64 30 37 61 33 65",
        ),
    ),
    (
        "heartbeat-grouped",
        Heartbeat(sender_id="t1", received_messages=5, group="eval"),
        {},
        frames_of(
            # {"v": 1, "k": 4, "sender_id": "t1", "received_messages": 5, "group": "eval"}
            "85 a1 76 01 a1 6b 04 a9 73 65 6e 64 65 72 5f 69 64 a2 74 31 b1 72 65 63 65 69"
            " 76 65 64 5f 6d 65 73 73 61 67 65 73 05 a5 67 72 6f 75 70 a4 65 76 61 6c",
        ),
    ),
    (
        "heartbeat-wait",
        Heartbeat(sender_id="t1", received_messages=5, wait_fraction=0.25),
        {},
        frames_of(
            # {"v": 1, "k": 4, "sender_id": "t1", "received_messages": 5,
            #  "wait_fraction": 0.25 (float 64)}: the trainer waited for data a quarter of
            #  the time since its last report (written only when measured, so heartbeats
            #  without it keep their bytes)
            "85 a1 76 01 a1 6b 04 a9 73 65 6e 64 65 72 5f 69 64 a2 74 31 b1 72 65 63 65 69"
            " 76 65 64 5f 6d 65 73 73 61 67 65 73 05"
            " ad 77 61 69 74 5f 66 72 61 63 74 69 6f 6e cb 3f d0 00 00 00 00 00 00",
        ),
    ),
    (
        "welcome-ranked",
        Welcome(server_id="s1", epoch_size=10, world_size=2, uneven="pad"),
        {},
        frames_of(
            # the defaults, then "world_size": 2, "uneven": "pad" (written only when set)
            "8b a1 76 01 a1 6b 03 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 aa 65 70 6f 63 68"
            " 5f 73 69 7a 65 0a a5 65 70 6f 63 68 00 b3 73 61 6d 70 6c 65 73 5f 70 65 72 5f"
            " 6d 65 73 73 61 67 65 01 a8 66 69 6e 69 73 68 65 64 c2 a7 77 6f 72 6b 65 72 73"
            " 01 a8 72 65 6c 69 61 62 6c 65 c2 aa 77 6f 72 6c 64 5f 73 69 7a 65 02 a6 75 6e"
            " 65 76 65 6e a3 70 61 64",
        ),
    ),
    (
        "heartbeat",
        Heartbeat(sender_id="s1", received_messages=300),
        {},
        frames_of(
            # {"v": 1, "k": 4, "sender_id": "s1", "received_messages": 300 (uint 16)}
            "84 a1 76 01 a1 6b 04 a9 73 65 6e 64 65 72 5f 69 64 a2 73 31 b1 72 65 63 65 69"
            " 76 65 64 5f 6d 65 73 73 61 67 65 73 cd 01 2c",
        ),
    ),
    (
        "error",
        Error(type="ValueError", message="bad", traceback="tb", server_id="s1"),
        {},
        frames_of(
            # {"v": 1, "k": 5, "type": "ValueError", "message": "bad", "traceback": "tb",
            #  "server_id": "s1"}
            "86 a1 76 01 a1 6b 05 a4 74 79 70 65 aa 56 61 6c 75 65 45 72 72 6f 72 a7 6d 65"
            " 73 73 61 67 65 a3 62 61 64 a9 74 72 61 63 65 62 61 63 6b a2 74 62 a9 73 65 72"
            " 76 65 72 5f 69 64 a2 73 31",
        ),
    ),
    (
        "stats-request",
        StatsRequest(client_id="c"),
        {},
        frames_of(
            # {"v": 1, "k": 6, "client_id": "c"}
            "83 a1 76 01 a1 6b 06 a9 63 6c 69 65 6e 74 5f 69 64 a1 63",
        ),
    ),
    (
        "stats",
        Stats(values={"sent": 10, "rate": 1.5, "name": "s1", "size": None, "ok": True}),
        {},
        frames_of(
            # {"v": 1, "k": 7, "values": {"sent": 10, "rate": 1.5 (float 64), "name": "s1",
            #  "size": nil, "ok": true}}
            "83 a1 76 01 a1 6b 07 a6 76 61 6c 75 65 73 85 a4 73 65 6e 74 0a a4 72 61 74 65"
            " cb 3f f8 00 00 00 00 00 00 a4 6e 61 6d 65 a2 73 31 a4 73 69 7a 65 c0 a2 6f 6b"
            " c3",
        ),
    ),
    (
        "end-of-epoch",
        EndOfEpoch(epoch=3, count=1000, worker=1),
        {},
        frames_of(
            "85 a1 76 01 a1 6b 08 a5 65 70 6f 63 68 03 a5 63 6f 75 6e 74 cd 03 e8"
            " a6 77 6f 72 6b 65 72 01",
        ),
    ),
    (
        "drain",
        Drain(sent_messages=99, server_id="s1"),
        {},
        frames_of(
            # {"v": 1, "k": 9, "sent_messages": 99, "server_id": "s1"}
            "84 a1 76 01 a1 6b 09 ad 73 65 6e 74 5f 6d 65 73 73 61 67 65 73 63 a9 73 65 72"
            " 76 65 72 5f 69 64 a2 73 31",
        ),
    ),
    (
        "end-of-stream",
        EndOfStream(server_id="s1", epochs=5, sent_messages=1000),
        {},
        frames_of(
            # {"v": 1, "k": 10, "server_id": "s1", "epochs": 5, "sent_messages": 1000}
            "85 a1 76 01 a1 6b 0a a9 73 65 72 76 65 72 5f 69 64 a2 73 31 a6 65 70 6f 63 68"
            " 73 05 ad 73 65 6e 74 5f 6d 65 73 73 61 67 65 73 cd 03 e8",
        ),
    ),
    (
        "credit",
        Credit(credits=16, client_id="c"),
        {},
        frames_of(
            # {"v": 1, "k": 11, "credits": 16, "client_id": "c"}
            "84 a1 76 01 a1 6b 0b a7 63 72 65 64 69 74 73 10 a9 63 6c 69 65 6e 74 5f 69 64"
            " a1 63",
        ),
    ),
    (
        "ack",
        Ack(seqs=(1, 2, 70000), client_id="c"),
        {},
        frames_of(
            # {"v": 1, "k": 12, "seqs": (1, 2, 70000), "client_id": "c"}: seqs is a tuple,
            # so it travels as an array led by ext 4 (c7 00 04), 70000 as uint 32
            "84 a1 76 01 a1 6b 0c a4 73 65 71 73 94 c7 00 04 01 02 ce 00 01 11 70 a9 63 6c"
            " 69 65 6e 74 5f 69 64 a1 63",
        ),
    ),
    (
        "ack-ranked",
        Ack(client_id="c", server_id="s1", rank=1, epoch=2, position=5),
        {},
        frames_of(
            # {"v": 1, "k": 12, "seqs": (), "client_id": "c", "server_id": "s1", "rank": 1,
            #  "epoch": 2, "position": 5}: the ranked fields are written only when set
            "88 a1 76 01 a1 6b 0c a4 73 65 71 73 91 c7 00 04 a9 63 6c 69 65 6e 74 5f 69 64"
            " a1 63 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 a4 72 61 6e 6b 01 a5 65 70 6f 63"
            " 68 02 a8 70 6f 73 69 74 69 6f 6e 05",
        ),
    ),
    (
        "data-inline-array",
        Data(
            np.array([[1, 0]]),
            [{"x": np.array([1.5, -2.0], dtype="<f4"), "label": 3, "name": "cat"}],
            server_id="s1",
            seq=7,
        ),
        {},
        frames_of(
            # header: ... "samples": [{"x": ext 1 (fixext16), "label": 3, "name": "cat"}]
            # ext 1 payload: 07 = descriptor length, 92 a3 "<f4" 91 02 = ["<f4", [2]], 8 raw bytes
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 a3 73 65 71 07"
            " a1 6e 01 a7 73 61 6d 70 6c 65 73 91 83 a1 78 d8 01 07 92 a3 3c 66 34 91 02"
            " 00 00 c0 3f 00 00 00 c0 a5 6c 61 62 65 6c 03 a4 6e 61 6d 65 a3 63 61 74",
            # tags: one row (epoch 1, position 0) of little-endian int64
            "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
        ),
    ),
    (
        "data-frame-array",
        Data(np.array([[2, 5]]), [np.arange(3, dtype=">i2")], server_id="s1", seq=8),
        {"inline_threshold": 0},
        frames_of(
            # "samples": [ext 2 (fixext4): [">i2", [3], 2]] -- the array is in frame 2
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a2 73 31 a3 73 65 71 08"
            " a1 6e 01 a7 73 61 6d 70 6c 65 73 91 d7 02 93 a3 3e 69 32 91 03 02",
            "02 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00",
            "00 00 00 01 00 02",
        ),
    ),
    (
        "data-stacked-batch",
        Data(
            np.array([[1, 0], [1, 1]]),
            [
                {"x": np.array([1, 2], dtype="<u1"), "y": np.float32(0.5), "s": "a"},
                {"x": np.array([3, 4], dtype="<u1"), "y": np.float32(1.5), "s": "b"},
            ],
        ),
        {},
        frames_of(
            # "batch": {"x": ext 5 [inline (2, 2) u1], "y": ext 6 [inline (2,) <f4],
            #           "s": ext 7 ["a", "b"]}
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a0 a3 73 65 71 00 a1 6e 02"
            " a5 62 61 74 63 68 83 a1 78 d8 05 c7 0d 01 08 92 a3 7c 75 31 92 02 02 01 02 03"
            " 04 a1 79 c7 12 06 d8 01 07 92 a3 3c 66 34 91 02 00 00 00 3f 00 00 c0 3f a1 73"
            " c7 05 07 92 a1 61 a1 62",
            "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
            " 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00",
        ),
    ),
    (
        "data-tuple-and-scalars",
        Data(np.array([[1, 0]]), [(np.int64(-1), np.datetime64("2024-01-01", "D"))]),
        {},
        frames_of(
            # a tuple is an array whose first item is ext 4 (empty); then two ext 3 scalars
            "86 a1 76 01 a1 6b 01 a9 73 65 72 76 65 72 5f 69 64 a0 a3 73 65 71 00 a1 6e 01"
            " a7 73 61 6d 70 6c 65 73 91 93 c7 00 04 c7 0d 03 04 a3 3c 69 38 ff ff ff ff ff"
            " ff ff ff d8 03 07 a6 3c 4d 38 5b 44 5d 0b 4d 00 00 00 00 00 00",
            "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
        ),
    ),
]


@pytest.mark.parametrize(
    ("name", "message", "options", "golden"), GOLDEN, ids=[g[0] for g in GOLDEN]
)
def test_encode_matches_golden_bytes(
    name: str, message: Any, options: dict[str, Any], golden: list[bytes]
) -> None:
    assert [bytes(frame) for frame in encode(message, **options)] == golden


@pytest.mark.parametrize(
    ("name", "message", "options", "golden"), GOLDEN, ids=[g[0] for g in GOLDEN]
)
def test_golden_bytes_decode_to_the_message(
    name: str, message: Any, options: dict[str, Any], golden: list[bytes]
) -> None:
    decoded = decode(golden)
    assert type(decoded) is type(message)
    if not isinstance(message, Data):
        assert decoded == message
        return
    assert isinstance(decoded, Data)
    assert decoded.tags.tolist() == np.asarray(message.tags).tolist()
    assert (decoded.server_id, decoded.seq) == (message.server_id, message.seq)
    assert len(decoded.samples) == len(message.samples)
    if name == "data-stacked-batch":
        assert isinstance(decoded.samples, SampleBatch)
    for expected, actual in zip(message.samples, decoded.samples, strict=True):
        assert_same(expected, actual)


def test_every_kind_has_golden_bytes() -> None:
    kinds = {msgpack.unpackb(golden[0])["k"] for _, _, _, golden in GOLDEN}
    # A compressed message wraps an encoded one: its golden bytes are in test_compress.
    kinds.add(msgpack.unpackb(COMPRESSED_GOLDEN[0])["k"])
    assert kinds == {int(kind) for kind in Kind}


def test_kind_numbers_are_fixed() -> None:
    # A kind number is never reused or renumbered: this table only ever grows.
    assert {kind.name: int(kind) for kind in Kind} == {
        "DATA": 1,
        "HELLO": 2,
        "WELCOME": 3,
        "HEARTBEAT": 4,
        "ERROR": 5,
        "STATS_REQUEST": 6,
        "STATS": 7,
        "END_OF_EPOCH": 8,
        "DRAIN": 9,
        "END_OF_STREAM": 10,
        "CREDIT": 11,
        "ACK": 12,
        "SHM_OFFER": 13,
        "SHM_ATTACH": 14,
        "COMPRESSED": 15,
        "SCALE": 16,
    }
    assert PROTOCOL_VERSION == 1


def test_ext_codes_are_fixed() -> None:
    # An ext code is never reused or renumbered either.
    codes = {name: getattr(ext_codes, name) for name in dir(ext_codes) if name.startswith("EXT_")}
    assert codes == {
        "EXT_ARRAY_INLINE": 1,
        "EXT_ARRAY_FRAME": 2,
        "EXT_SCALAR": 3,
        "EXT_TUPLE": 4,
        "EXT_STACKED_ARRAY": 5,
        "EXT_STACKED_SCALAR": 6,
        "EXT_COLUMN": 7,
    }


# A heartbeat on the reliable data socket: envelope (seq 0, no acknowledgement wanted),
# then the encoded message. A data message there carries its own seq in the envelope.
RELIABLE_HEARTBEAT = frames_of(
    "00 00 00 00 00 00 00 00",
    # {"v": 1, "k": 4, "sender_id": "s1", "received_messages": 0}
    "84 a1 76 01 a1 6b 04 a9 73 65 6e 64 65 72 5f 69 64 a2 73 31 b1 72 65 63 65 69"
    " 76 65 64 5f 6d 65 73 73 61 67 65 73 00",
)


def test_envelope_golden_bytes() -> None:
    assert ENVELOPE_BYTES == 8
    # seq 0x0102030405060708 as a little-endian u64
    assert pack_envelope(0x0102030405060708) == bytes.fromhex("08 07 06 05 04 03 02 01")
    assert pack_envelope(7) == bytes.fromhex("07 00 00 00 00 00 00 00")
    heartbeat = Heartbeat(sender_id="s1")
    assert [pack_envelope(0), *encode(heartbeat)] == RELIABLE_HEARTBEAT
    seq, rest = unpack_envelope(RELIABLE_HEARTBEAT)
    assert (seq, decode(rest)) == (0, heartbeat)
