"""A trainer process for the integration tests: ``python -m tests.integration.trainers``.

It records every sample it is handed (``epoch id`` per line, flushed at once,
so the record survives a crash) and can kill itself with SIGKILL after a given
number of samples, to play a trainer that dies mid-epoch. It may belong to a
consumer group, and may wait for the test's go (a file) before it connects.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from feedmux.client.remote import RemoteLoader


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("control")
    parser.add_argument("out")
    parser.add_argument("--reliable", action="store_true")
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=0.0, help="a training step per sample")
    parser.add_argument("--group", help="the consumer group (default: the default group)")
    parser.add_argument("--world-size", type=int, default=1, help="trainers in its group")
    parser.add_argument("--start-file", help="connect only once this file exists (bounded)")
    args = parser.parse_args(argv)
    if args.start_file:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.start_file):
            if time.monotonic() > deadline:
                return 3
            time.sleep(0.005)  # the poll interval of a bounded wait for the test's go
    with open(args.out, "w", buffering=1) as out, RemoteLoader(
        args.data, control=args.control, timeout=30, reliable=args.reliable, with_meta=True,
        hwm=4, group=args.group, world_size=args.world_size,
    ) as loader:
        for count, (meta, sample) in enumerate(loader, start=1):
            out.write(f"{meta.epoch} {int(sample['id'])}\n")
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            if count == args.die_after:
                out.flush()
                os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
