"""``python -m benchmarks.chaos [--focus F] [--minutes N] [--seed S ...]``: model-based chaos.

Real ``feedmux serve`` processes feed real trainers — a ranked job that
checkpoints, free trainers, a torch ``DataLoader`` whose workers end after each
pass — while a schedule drawn from the seed applies events to them: trainers
joining, leaving mid-message, SIGKILLed, SIGSTOPped and continued; ranks killed
and restarted with the job from its checkpoint or alone without one (at a
random moment, or at a step of any epoch); the job killed past a checkpoint and
resumed from it; servers SIGTERMed or SIGKILLed and restarted, continuing their
run or beginning a new one; sampling workers SIGKILLed. A supervisor restarts
what died the documented way (docs/resume.md). Every trainer writes an audit
log (``RemoteLoader(audit_log=..., audit_key="id")``) and checks each sample's
array against its id. At the end, a reference run of the same seeded job
without events gives each rank's uninterrupted sequence, and ``feedmux audit``
is the oracle of what each mode promises (``benchmarks._chaos_model``: free,
every sample of every complete epoch once; ranked, each rank's sequence equal
to the uninterrupted one, the same steps per epoch for every rank; the
DataLoader, every epoch whole). It prints the seed, the set-up and the
schedule, each event as it is applied, and the audit's words for any problem;
it exits 1 on any problem. ``--seed S`` replays a run's set-up and schedule
exactly; ``--focus`` picks a scenario (``--list`` shows them). Every wait is
bounded; every process it started is killed by pid on every exit path.

The trainers are this module too (``python -m benchmarks.chaos rank|free|dataloader``),
and so are the sources the servers serve (:func:`source`, :func:`small_source`).
This module owns the command line, the trainers and the sources; the schedule and
the promises are in ``benchmarks._chaos_model``, the supervisor in
``benchmarks._chaos_run``. It must never judge a run itself: the audit does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import feedmux
from benchmarks._chaos_model import FOCUS, FREE_LOADER

__all__ = ["main", "small_source", "source"]

STREAMERS = 8
ITEMS = 40  # per streamer: an epoch is STREAMERS * ITEMS samples
WIDTH = 64
RANKS = 3
#: Steps between two checkpoints of the ranked job.
EVERY = 10
LOADER_TIMEOUT = 60.0
#: Seconds a rank stopped at its --pause-at step waits to be killed before it gives up.
PAUSED_TIMEOUT = 120.0
#: A trainer's exit codes that mean a problem.
WRONG = {3: "a sample held other values than its id", 4: "a rank ran past its last step",
         5: "a rank's stream ended (the server ended it)"}


def _items(streamer: int, items: int = ITEMS) -> Iterator[dict[str, Any]]:
    for item in range(items):
        ident = streamer * items + item
        # "n": a length of 1-5, which a free trainer that asks for buckets groups by
        yield {"id": np.int64(ident), "x": np.full(WIDTH, ident, dtype=np.int32),
               "n": np.int64(1 + ident % 5)}


def source() -> feedmux.StochasticMux:
    """The job's data: a seeded exhaustive mux, each sample's array full of its id."""
    streamers = [feedmux.Streamer(_items, index) for index in range(STREAMERS)]
    return feedmux.StochasticMux(streamers, n_active=4, rate=None, mode="exhaustive",
                                 random_state=0)


def small_source() -> feedmux.StochasticMux:
    """7 streamers x 13 ids, 3 active: epochs of 91 (an odd size: 2 ranks pad a round)."""
    streamers = [feedmux.Streamer(_items, index, 13) for index in range(7)]
    return feedmux.StochasticMux(streamers, n_active=3, rate=None, mode="exhaustive",
                                 random_state=0)


# -- the trainers (child processes: python -m benchmarks.chaos rank|free|dataloader ...) -------
def _exact(sample: dict[str, Any]) -> bool:
    """Whether the sample's array is full of its id (a batch: each row of its own)."""
    ids, values = np.asarray(sample["id"]), np.asarray(sample["x"])
    return bool((values == ids.reshape(ids.shape + (1,) * (values.ndim - ids.ndim))).all())


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old text or the new, whole."""
    scratch = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None (absent, or being replaced)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rank(args: argparse.Namespace) -> int:
    """One rank: hand out, publish its step, checkpoint every EVERY steps (rank 0, once
    every rank got there), stop at the step the supervisor names (or at the stream's end
    with --until-end; at --pause-at it stops reading and waits to be killed)."""
    scratch = Path(args.dir)
    options: dict[str, Any] = {} if args.hwm is None else {"hwm": args.hwm}
    loader = feedmux.RemoteLoader(
        args.data, control=args.control, rank=args.rank, world_size=args.world_size,
        timeout=LOADER_TIMEOUT, audit_log=str(scratch / f"rank{args.rank}.log"), audit_key="id",
        **options)
    step = args.start_step
    saved = None if args.reference or args.fresh else read_json(scratch / "checkpoint.json")
    if saved is not None:
        step = saved["step"]
        loader.load_state_dict(saved["data"])
    if step and step == (read_json(scratch / "stop.json") or {}).get("step"):
        return 0  # the job had reached its last step: restarted only because another rank died
    mark = scratch / f"rank{args.rank}.step"
    with loader:
        for sample in loader:
            if not _exact(sample):
                print(f"rank {args.rank}: sample {int(sample['id'])} holds other values",
                      file=sys.stderr)
                return 3
            step += 1
            write_atomic(mark, json.dumps({"generation": args.generation, "step": step}))
            if step == args.pause_at:
                return _paused(scratch / f"rank{args.rank}.paused", step)
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            if step % EVERY:
                continue
            if args.rank == 0 and not args.reference and _all_reached(scratch, args, step):
                write_atomic(scratch / "checkpoint.json",
                             json.dumps({"step": step, "data": loader.state_dict()}))
            stop = args.stop_at or (read_json(scratch / "stop.json") or {}).get("step")
            if stop is not None and step >= stop:
                return 0 if step == stop else 4
    if args.until_end:
        return 0
    print(f"rank {args.rank}: the stream ended at step {step}", file=sys.stderr)
    return 5


def _paused(marker: Path, step: int) -> int:
    """Stop reading (the loader's queue fills, the server holds the rest) and wait to be
    SIGKILLed by the supervisor (bounded)."""
    write_atomic(marker, json.dumps({"step": step}))
    deadline = time.monotonic() + PAUSED_TIMEOUT
    while time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"paused at step {step} and never killed", file=sys.stderr)
    return 6


def _all_reached(scratch: Path, args: argparse.Namespace, step: int) -> bool:
    """Wait (bounded) until every rank of this generation of the job handed out ``step``
    samples: a checkpoint no rank is behind (a DDP job's ranks are in lockstep)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        marks = [read_json(scratch / f"rank{rank}.step") for rank in range(args.world_size)]
        if all(mark is not None and mark["generation"] == args.generation
               and mark["step"] >= step for mark in marks):
            return True
        time.sleep(0.005)
    return False


class _Stopped(Exception):
    """SIGTERM: the supervisor ends a free trainer."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped


def _free(args: argparse.Namespace) -> int:
    """A free trainer: hand out until SIGTERM (it closes its loader then, mid-message)."""
    scratch = Path(args.dir)
    signal.signal(signal.SIGTERM, _stop)
    try:
        return _hand_out(args, scratch)
    except _Stopped:
        return 0


def _hand_out(args: argparse.Namespace, scratch: Path) -> int:
    with feedmux.RemoteLoader(args.data, control=args.control, hwm=4, timeout=LOADER_TIMEOUT,
                              audit_key="id", audit_log=str(scratch / f"free{args.index}.log"),
                              batch_size=args.batch_size or None,
                              bucket_by=args.bucket_by or None, **FREE_LOADER) as loader:
        for sample in loader:
            if not _exact(sample):
                print(f"free trainer {args.index}: sample {np.asarray(sample['id']).tolist()} "
                      f"holds other values", file=sys.stderr)
                return 3
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
    return 0


def _dataloader(args: argparse.Namespace) -> int:
    """torch's ``DataLoader(RemoteDataset(address), batch_size=None, num_workers=2)`` with
    non-persistent workers: one pass per epoch, each pass's workers end with it."""
    from torch.utils.data import DataLoader

    from feedmux.torch import RemoteDataset

    dataset = RemoteDataset(args.data, control=args.control, timeout=args.timeout,
                            tensors=False, audit_key="id",
                            audit_log=str(Path(args.dir) / "dataloader-{pid}.log"),
                            **FREE_LOADER)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for number in range(1, args.epochs + 1):
        try:
            count = 0
            for sample in loader:
                if not _exact(sample):
                    print(f"pass {number}: sample {int(sample['id'])} holds other values",
                          file=sys.stderr)
                    return 3
                count += 1
                if args.step_ms:
                    time.sleep(args.step_ms / 1000)
        except Exception as error:  # a worker's error comes wrapped: say it and stop
            print(f"pass {number}: {type(error).__name__}: "
                  f"{str(error).strip().splitlines()[0]}", file=sys.stderr)
            return 7
        print(f"pass {number}: {count} samples", file=sys.stderr)
    return 0


# -- the command -------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--focus", choices=[*sorted(FOCUS), "all"], default=["mix"],
                        nargs="+", help="the scenario(s), each run with every seed (default "
                                        "mix: every event; all: every scenario)")
    parser.add_argument("--minutes", type=float, default=2.0,
                        help="how long the schedule of each run lasts, roughly (the focus "
                             "scenarios with a fixed number of events end sooner)")
    parser.add_argument("--seed", type=int, nargs="+",
                        help="the seeds of the runs, one run each (default: one random "
                             "seed, printed)")
    parser.add_argument("--step-ms", type=float, default=1.0,
                        help="a trainer's time per sample (its training step)")
    parser.add_argument("--keep", metavar="DIR",
                        help="write each run's logs into DIR/FOCUS-SEED (new folders) and "
                             "keep them")
    parser.add_argument("--without-dataloader", action="store_true",
                        help="leave the torch DataLoader out of every scenario")
    parser.add_argument("--list", action="store_true", help="list the scenarios and events")
    return parser


def _trainer_parser(kind: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.chaos {kind}")
    parser.add_argument("data")
    parser.add_argument("control")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--step-ms", type=float, default=0.0)
    if kind == "rank":
        parser.add_argument("--rank", type=int, required=True)
        parser.add_argument("--world-size", type=int, default=RANKS)
        parser.add_argument("--generation", type=int, required=True)
        parser.add_argument("--hwm", type=int, default=4,
                            help="the loader's hwm (0: the loader's default)")
        parser.add_argument("--reference", action="store_true")
        parser.add_argument("--stop-at", type=int)
        parser.add_argument("--until-end", action="store_true",
                            help="the job runs to the end of the stream")
        parser.add_argument("--fresh", action="store_true",
                            help="restarted alone: no checkpoint loaded")
        parser.add_argument("--start-step", type=int, default=0,
                            help="the steps the rank's predecessor took")
        parser.add_argument("--pause-at", type=int, default=0,
                            help="stop reading at this step and wait to be killed")
    elif kind == "free":
        parser.add_argument("--index", type=int, required=True)
        parser.add_argument("--batch-size", type=int, default=0,
                            help="the batches the server builds for it (0: single samples)")
        parser.add_argument("--bucket-by", default="",
                            help="with --batch-size: the field its batches are bucketed by")
    else:
        parser.add_argument("--epochs", type=int, required=True)
        parser.add_argument("--timeout", type=float, default=30.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:
        args = _trainer_parser("rank").parse_args(argv[1:])
        args.hwm = args.hwm or None
        return _rank(args)
    if argv[:1] == ["free"]:
        return _free(_trainer_parser("free").parse_args(argv[1:]))
    if argv[:1] == ["dataloader"]:
        return _dataloader(_trainer_parser("dataloader").parse_args(argv[1:]))
    args = _parser().parse_args(argv)
    from benchmarks import _chaos_model, _chaos_run

    if args.list:
        for scenario in FOCUS.values():
            print(f"{scenario.name}: {scenario.summary}")
        print("events:")
        for kind, text in _chaos_model.EVENTS.items():
            print(f"  {kind}: {text}")
        return 0
    seeds = args.seed or [random.SystemRandom().randrange(1 << 20)]
    focus = list(FOCUS) if "all" in args.focus else args.focus
    scenarios = dict(FOCUS)
    if args.without_dataloader:
        focus = [name for name in focus if name != "dataloader"]
        scenarios = {name: dataclasses.replace(scenario, dataloader=False)
                     for name, scenario in FOCUS.items()}
    failed = []
    for name in focus:
        for seed in seeds:
            keep = None if args.keep is None else str(Path(args.keep) / f"{name}-{seed}")
            if _chaos_run.run(scenarios[name], seed, args.minutes, args.step_ms, keep):
                failed.append(f"--focus {name} --seed {seed}")
    runs = len(focus) * len(seeds)
    if runs > 1:
        print(f"{runs} chaos runs: "
              + (f"problems in {len(failed)}: {'; '.join(failed)}" if failed else "all ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
