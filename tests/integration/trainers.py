"""A trainer process for the integration tests: ``python -m tests.integration.trainers``.

It records every sample it is handed (``epoch id`` per line, and the server's
id with ``--record-server``, flushed at once, so the record survives a crash)
and can kill itself with SIGKILL after a given number of samples, to play a
trainer that dies mid-epoch, or leave cleanly after some. It may belong to a
consumer group, may wait for the test's go (a file) before it connects or after
some samples, and may count the samples whose array is a view of a server's
shared-memory pool (read from ``/proc/self/maps``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from feedmux import SampleMeta
from feedmux.client.remote import RemoteLoader
from tests.integration.bucket_samplers import length_of

#: Seconds without data before the loader raises. A group or a job held back by a rank
#: that restarts gets nothing meanwhile: a loaded machine took over 30 s to restart one.
LOADER_TIMEOUT = 60


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("control")
    parser.add_argument("out")
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--stop-after", type=int, default=0,
                        help="leave cleanly (close the loader) after this many samples")
    parser.add_argument("--step-ms", type=float, default=0.0, help="a training step per sample")
    parser.add_argument("--group", help="the consumer group (default: the default group)")
    parser.add_argument("--rank", type=int, help="a ranked trainer (lines: epoch id position)")
    parser.add_argument("--world-size", type=int, default=1,
                        help="ranks of its job (or trainers of its group)")
    parser.add_argument("--start-file", help="connect only once this file exists (bounded)")
    parser.add_argument("--hold-after", type=int, default=0,
                        help="after this many samples, wait for --go-file (bounded) and go on")
    parser.add_argument("--go-file", help="the file --hold-after waits for")
    parser.add_argument("--record-server", action="store_true",
                        help="end each line with the id of the server process that sent it")
    parser.add_argument("--views-out",
                        help="at the end, write here how many samples came as shared-memory views")
    parser.add_argument("--hwm", type=int, default=4,
                        help="the loader's hwm (0: the loader's default)")
    parser.add_argument("--abrupt", action="store_true",
                        help="with --die-after: SIGKILL after the step, whatever was acknowledged")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="a free trainer that asks for batches (a line per sample; "
                             "--die-after and --hold-after count batches)")
    parser.add_argument("--bucket-by",
                        help="with --batch-size: batches of samples of similar length by this "
                             "field (each batch's sample ids, lengths checked: exit 6 if not)")
    parser.add_argument("--acks-late-ms", type=float, default=0.0,
                        help="hold the acknowledging thread back this long at its start (a "
                             "thread that a busy machine schedules late)")
    args = parser.parse_args(argv)
    if args.acks_late_ms:
        _hold_acks_back(args.acks_late_ms / 1000)
    if args.start_file and not wait_for_file(args.start_file):
        return 3
    views = SharedViews()
    hwm = {"hwm": args.hwm} if args.hwm else {}
    batches = {"batch_size": args.batch_size} if args.batch_size else {}
    if args.bucket_by:
        batches["bucket_by"] = args.bucket_by
    with open(args.out, "w", buffering=1) as out, RemoteLoader(
        args.data, control=args.control, timeout=LOADER_TIMEOUT,
        with_meta=True, group=args.group, rank=args.rank, world_size=args.world_size, **hwm,
        **batches,
    ) as loader:
        for count, (meta, sample) in enumerate(loader, start=1):
            if args.batch_size:  # a batch: a line per sample, the mark its last position
                if args.bucket_by and not _own_arrays(sample, args.bucket_by):
                    return 6
                out.write("".join(f"{meta.epoch} {int(i)}\n" for i in sample["id"]))
                meta = SampleMeta(meta.epoch, int(meta.positions[-1]), meta.server_id)
                if count == args.die_after:
                    return _die(out, loader, meta, args.abrupt)
                if count == args.hold_after and not wait_for_file(args.go_file):
                    return 3
                continue
            position = f" {meta.position}" if args.rank is not None else ""
            if args.record_server:
                position += f" {meta.server_id}"
            if "x" in sample and not (sample["x"] == sample["id"]).all():
                return 4  # a sample's array is not its own (reused memory)
            if "tokens" in sample and not _own_tokens(sample):
                return 4  # a variable-length sample is not as it was sampled
            out.write(f"{meta.epoch} {int(sample['id'])}{position}\n")
            if args.views_out and "x" in sample:
                views.count(sample["x"])
            if count == args.hold_after and not wait_for_file(args.go_file):
                return 3
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            if count == args.stop_after:
                break
            if count == args.die_after:
                return _die(out, loader, meta, args.abrupt)
    if args.views_out:
        with open(args.views_out, "w") as out:
            out.write(f"{views.seen}\n")
    return 0


def _own_arrays(batch: dict[str, Any], key: str) -> bool:
    """Whether each array of a bucketed batch's variable-length leaf ``key`` (a list) is
    its sample's own: every value the sample's id."""
    arrays = batch[key]
    return isinstance(arrays, list) and len(arrays) == len(batch["id"]) and all(
        (array == sample_id).all() for array, sample_id in zip(arrays, batch["id"], strict=True))


def _own_tokens(sample: dict[str, Any]) -> bool:
    """Whether a sample of ``bucket_samplers.ragged`` is as it was sampled."""
    tokens = sample["tokens"]
    return (isinstance(tokens, np.ndarray) and tokens.shape == (length_of(int(sample["id"])),)
            and bool((tokens == sample["id"]).all()))


def _die(out: Any, loader: RemoteLoader, meta: SampleMeta, abrupt: bool) -> int:
    """SIGKILL this process once its last hand-out (``meta``) is told the server; 5 (an
    exit code) if the mark was not sent within 10 s."""
    out.flush()
    acks = loader._acks
    if acks is not None and not abrupt:
        # A loader acknowledges from a thread every few ms: die
        # once it has told the server this sample (a step longer than that).
        mark = (meta.server_id, meta.epoch, meta.position)
        deadline = time.monotonic() + 10
        while not acks.told(mark):
            if time.monotonic() > deadline:
                # Not a kill after a 10 s step: the others may have been told the end
                # meanwhile, and what this one held would be lost.
                print(f"the mark {mark} was not sent within 10 s", file=sys.stderr)
                return 5
            time.sleep(0.001)  # the poll interval of a bounded wait
        # Sent is only queued: stop the thread, whose close flushes it to the
        # server (under load a SIGKILL right away lost it now and then).
        acks.stop()
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


#: Seconds a trainer waits for the test's go at most (:func:`wait_for_file`).
GO_TIMEOUT = 60.0


def wait_for_file(path: str) -> bool:
    """Wait (:data:`GO_TIMEOUT` s at most) until ``path`` exists: the test's go."""
    deadline = time.monotonic() + GO_TIMEOUT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)  # the poll interval of a bounded wait for the test's go
    return True


class SharedViews:
    """Counts the arrays that lie in a mapped shared-memory pool of a feedmux server.

    It asks the kernel (``/proc/self/maps``), not the loader: an array counts when
    its memory is inside a mapping of a ``/dev/shm/feedmux-*`` file.
    """

    def __init__(self) -> None:
        self.seen = 0
        self._ranges: list[tuple[int, int]] = []

    def count(self, array: np.ndarray) -> None:
        address = array.__array_interface__["data"][0]
        if not self._inside(address):
            self._ranges = _pool_mappings()  # a pool mapped since the last look
            if not self._inside(address):
                return
        self.seen += 1

    def _inside(self, address: int) -> bool:
        return any(start <= address < end for start, end in self._ranges)


def _pool_mappings() -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and os.path.basename(fields[5]).startswith("feedmux-"):
                start, end = fields[0].split("-")
                ranges.append((int(start, 16), int(end, 16)))
    return ranges


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
