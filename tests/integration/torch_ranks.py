"""One rank of a DDP-style job for the torch tests: ``python -m tests.integration.torch_ranks``.

It joins a gloo process group (a rendezvous file in the test's folder: no port)
and reads two epochs through ``DataLoader(RemoteDataset(rank=...), num_workers=N)``,
all-reducing once per step (unequal steps would hang DDP: here the gloo timeout
fails the rank instead). With ``--stop-after S --resume-on DATA CONTROL`` it
stops after S steps of the first epoch, checkpoints the dataset's state (rank
0 saves it, every rank loads it, as a restarted job would), and goes on with
fresh DataLoader workers against the server at DATA (a fresh server with the
same seed). It writes the ids it got per pass, and the steps of each pass
(the largest over the ranks), as JSON. With ``--first-alone DATA CONTROL OUT``
it first reads two epochs of the server at DATA with no DataLoader worker and
writes those to OUT (one process, and one torch import, for both runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from feedmux.torch import RemoteDataset


def passes(dataset: RemoteDataset, workers: int, count: int, stop_after: int = 0) -> list[Any]:
    """``count`` passes over ``dataset``: (ids, steps of the slowest rank) of each."""
    loader = DataLoader(dataset, batch_size=None, num_workers=workers,
                        persistent_workers=workers > 0)
    done = []
    for _ in range(count):
        ids: list[int] = []
        for sample in dataset.track(loader):
            ids.append(int(sample["id"]))
            dist.all_reduce(torch.ones(1))  # one collective per step, as DDP's backward
            if len(ids) == stop_after:
                break
        steps = torch.tensor([len(ids)])
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        done.append((ids, int(steps)))
    return done


def write(path: str, done: list[Any]) -> None:
    """The ids of each pass and its steps, as JSON."""
    with open(path, "w") as out:
        json.dump({"epochs": [ids for ids, _ in done], "steps": [n for _, n in done]}, out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    for name in ("data", "control", "rank", "world_size", "workers", "out", "rendezvous"):
        parser.add_argument(name)
    parser.add_argument("--stop-after", type=int, default=0, help="steps, then checkpoint")
    parser.add_argument("--resume-on", nargs=2, metavar=("DATA", "CONTROL"),
                        help="the server to resume on from the checkpoint")
    parser.add_argument("--first-alone", nargs=3, metavar=("DATA", "CONTROL", "OUT"),
                        help="first two epochs of this server with no worker, written to "
                        "OUT ({rank}: the rank)")
    args = parser.parse_args(argv)
    rank, world_size, workers = int(args.rank), int(args.world_size), int(args.workers)
    dist.init_process_group("gloo", init_method=f"file://{args.rendezvous}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    options = {"rank": rank, "world_size": world_size, "timeout": 60}
    if args.first_alone:
        data, control, out = args.first_alone
        write(out.format(rank=rank), passes(RemoteDataset(data, control=control, **options),
                                            0, 2))
    dataset = RemoteDataset(args.data, control=args.control, **options)
    if not args.stop_after:
        done = passes(dataset, workers, 2)
    else:
        done = passes(dataset, workers, 1, stop_after=args.stop_after)
        checkpoint = [dataset.state_dict() if rank == 0 else None]
        dist.broadcast_object_list(checkpoint, src=0)  # rank 0's state, as from its file
        data, control = args.resume_on
        resumed = RemoteDataset(data, control=control, **options)
        resumed.load_state_dict(json.loads(json.dumps(checkpoint[0])))
        done += passes(resumed, workers, 2)
    write(args.out, done)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
