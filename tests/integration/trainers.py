"""A trainer process for the integration tests: ``python -m tests.integration.trainers``.

It records every sample it is handed (``epoch id`` per line, flushed at once,
so the record survives a crash) and can kill itself with SIGKILL after a given
number of samples, to play a trainer that dies mid-epoch.
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
    args = parser.parse_args(argv)
    with open(args.out, "w", buffering=1) as out, RemoteLoader(
        args.data, control=args.control, timeout=30, reliable=args.reliable, with_meta=True,
        hwm=4,
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
