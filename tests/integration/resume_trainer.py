"""A ranked trainer that checkpoints and resumes: ``python -m tests.integration.resume_trainer``.

It iterates a :class:`feedmux.Stream` over a ranked ``RemoteLoader`` and
records every sample it is handed (``epoch id position`` per line, flushed at
once). With ``--save-at EPOCH:STEP`` it writes ``stream.state_dict()`` (JSON)
to ``--state`` right after the STEP-th sample of EPOCH, and with
``--die-after-save K`` kills itself (SIGKILL) K samples later, as a crashing
job would. With ``--resume FILE`` it calls ``stream.load_state_dict()`` on a
saved state first: that is all a resuming trainer does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time

from feedmux import Stream
from feedmux.client.remote import RemoteLoader


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("control")
    parser.add_argument("out")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--save-at", help="EPOCH:STEP")
    parser.add_argument("--state", help="where --save-at writes the state")
    parser.add_argument("--die-after-save", type=int, default=-1)
    parser.add_argument("--resume", help="a state saved by --save-at ({rank}: this rank's)")
    parser.add_argument("--step-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    save_at = tuple(int(part) for part in args.save_at.split(":")) if args.save_at else None
    loader = RemoteLoader(args.data, control=args.control, rank=args.rank,
                          world_size=args.world_size, timeout=60, with_meta=True, hwm=4)
    stream = Stream(loader)
    if args.resume:
        with open(args.resume.format(rank=args.rank)) as file:
            stream.load_state_dict(json.load(file))
    epoch = steps = 0
    after_save = -1
    with open(args.out, "w", buffering=1) as out, loader:
        for meta, sample in stream.data(math.inf):
            out.write(f"{meta.epoch} {int(sample['id'])} {meta.position}\n")
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            epoch, steps = (epoch, steps + 1) if meta.epoch == epoch else (meta.epoch, 1)
            if (epoch, steps) == save_at:
                with open(args.state + ".tmp", "w") as file:
                    json.dump(stream.state_dict(), file)
                os.replace(args.state + ".tmp", args.state)
                after_save = 0
            elif after_save >= 0:
                after_save += 1
            if after_save >= 0 and after_save == args.die_after_save:
                out.flush()
                os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
