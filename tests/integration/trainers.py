"""A trainer process for the integration tests: ``python -m tests.integration.trainers``.

It records every sample it is handed (``epoch id`` per line, flushed at once,
so the record survives a crash) and can kill itself with SIGKILL after a given
number of samples, to play a trainer that dies mid-epoch, or leave cleanly after
some. It may belong to a consumer group, and may wait for the test's go (a file)
before it connects.
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
    parser.add_argument("--stop-after", type=int, default=0,
                        help="leave cleanly (close the loader) after this many samples")
    parser.add_argument("--step-ms", type=float, default=0.0, help="a training step per sample")
    parser.add_argument("--group", help="the consumer group (default: the default group)")
    parser.add_argument("--rank", type=int, help="a ranked trainer (lines: epoch id position)")
    parser.add_argument("--world-size", type=int, default=1,
                        help="ranks of its job (or trainers of its group)")
    parser.add_argument("--start-file", help="connect only once this file exists (bounded)")
    parser.add_argument("--abrupt", action="store_true",
                        help="with --die-after: SIGKILL after the step, whatever was acknowledged")
    parser.add_argument("--acks-late-ms", type=float, default=0.0,
                        help="hold the acknowledging thread back this long at its start (a "
                             "thread that a busy machine schedules late)")
    args = parser.parse_args(argv)
    if args.acks_late_ms:
        _hold_acks_back(args.acks_late_ms / 1000)
    if args.start_file:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.start_file):
            if time.monotonic() > deadline:
                return 3
            time.sleep(0.005)  # the poll interval of a bounded wait for the test's go
    with open(args.out, "w", buffering=1) as out, RemoteLoader(
        args.data, control=args.control, timeout=30, reliable=args.reliable, with_meta=True,
        hwm=4, group=args.group, rank=args.rank, world_size=args.world_size,
    ) as loader:
        for count, (meta, sample) in enumerate(loader, start=1):
            position = f" {meta.position}" if args.rank is not None else ""
            if "x" in sample and not (sample["x"] == sample["id"]).all():
                return 4  # a sample's array is not its own (reused memory)
            out.write(f"{meta.epoch} {int(sample['id'])}{position}\n")
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            if count == args.stop_after:
                break
            if count == args.die_after:
                out.flush()
                if loader._acks is not None and not args.abrupt:
                    # A ranked or reliable loader acknowledges from a thread every few ms: die
                    # once it has told the server this sample (a step longer than that).
                    mark = (meta.server_id, meta.epoch, meta.position)
                    deadline = time.monotonic() + 10
                    acks = loader._acks
                    while acks is not None and acks.sent != mark and time.monotonic() < deadline:
                        time.sleep(0.001)
                    # Sent is only queued: stop the thread, whose close flushes it to the
                    # server (under load a SIGKILL right away lost it now and then).
                    acks.stop()
                os.kill(os.getpid(), signal.SIGKILL)
    return 0


def _hold_acks_back(seconds: float) -> None:
    """Start every acknowledging thread ``seconds`` late (before it connects anything)."""
    from feedmux.client import _acks

    run = _acks.HandOutAcks._run

    def late(self: _acks.HandOutAcks) -> None:
        time.sleep(seconds)  # the scheduling delay this option plays
        run(self)

    _acks.HandOutAcks._run = late  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
