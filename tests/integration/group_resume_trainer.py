"""A rank of a ranked consumer group that checkpoints and resumes: ``python -m
tests.integration.group_resume_trainer``.

A language-model job's rank: batches of 16 by length (``bucket_by="tokens"``,
``pad=True``) from a :class:`feedmux.Stream` over a ranked ``RemoteLoader`` in
a consumer group. It records every batch it is handed (``epoch id id ...`` per
line, flushed at once). With ``--steps N`` it writes ``stream.state_dict()``
(JSON) to ``--state`` after its N-th batch and leaves (the loader closed, the
process exits 0); without, it reads to the end of the stream. With ``--resume
FILE`` it calls ``stream.load_state_dict()`` on a saved state first; with
``--hold-after K`` it waits after its K-th batch until ``--go-file`` exists
(60 s at most). A ``RemoteError`` is written to the record (``error: ...``) and
exits 6.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from feedmux import RemoteError, Stream
from feedmux.client.remote import RemoteLoader
from tests.integration.trainers import wait_for_file

#: The job's batch shape.
BATCH_SIZE = 16


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("control")
    parser.add_argument("out")
    parser.add_argument("--group", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=0, help="leave after this many batches")
    parser.add_argument("--state", help="where --steps writes the state")
    parser.add_argument("--resume", help="a state saved by --steps")
    parser.add_argument("--hold-after", type=int, default=0)
    parser.add_argument("--go-file", help="the file --hold-after waits for")
    args = parser.parse_args(argv)
    loader = RemoteLoader(args.data, control=args.control, group=args.group, rank=args.rank,
                          world_size=args.world_size, batch_size=BATCH_SIZE,
                          bucket_by="tokens", pad=True, with_meta=True, timeout=60, hwm=4)
    stream = Stream(loader)
    if args.resume:
        with open(args.resume) as file:
            stream.load_state_dict(json.load(file))
    with open(args.out, "w", buffering=1) as out, loader:
        try:
            for count, (meta, batch) in enumerate(stream.data(args.steps or math.inf), 1):
                out.write(f"{meta.epoch} {' '.join(str(int(i)) for i in batch['id'])}\n")
                if count == args.hold_after and not wait_for_file(args.go_file):
                    return 3
        except RemoteError as error:
            out.write(f"error: {error}\n")
            return 6
        if args.steps:
            with open(args.state + ".tmp", "w") as file:
                json.dump(stream.state_dict(), file)
            os.replace(args.state + ".tmp", args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
