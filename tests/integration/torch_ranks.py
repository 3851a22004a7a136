"""One rank of a DDP-style job for the torch tests: ``python -m tests.integration.torch_ranks``.

It joins a gloo process group (a rendezvous file in the test's folder: no port),
reads two epochs through ``DataLoader(RemoteDataset(rank=...), num_workers=N)``,
all-reduces once per step (unequal steps would hang DDP: here the gloo timeout
fails the rank instead) and writes what it got, by epoch, as JSON. It can stop
after some steps and save the dataset's state, or resume from a saved one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from feedmux.torch import RemoteDataset


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    for name in ("data", "control", "rank", "world_size", "workers", "out", "rendezvous"):
        parser.add_argument(name)
    parser.add_argument("--stop-after", type=int, default=0, help="steps, then save and stop")
    parser.add_argument("--save", help="where to save the dataset's state (rank 0)")
    parser.add_argument("--load", help="a saved state to resume from")
    args = parser.parse_args(argv)
    rank, world_size, workers = int(args.rank), int(args.world_size), int(args.workers)
    dist.init_process_group("gloo", init_method=f"file://{args.rendezvous}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    dataset = RemoteDataset(args.data, control=args.control, rank=rank, world_size=world_size,
                            timeout=60)
    if args.load:
        with open(args.load) as saved:
            dataset.load_state_dict(json.load(saved))
    loader = DataLoader(dataset, batch_size=None, num_workers=workers,
                        persistent_workers=workers > 0)
    epochs: list[list[int]] = []
    steps: list[int] = []
    for _ in range(2):
        ids: list[int] = []
        for sample in dataset.track(loader):
            ids.append(int(sample["id"]))
            dist.all_reduce(torch.ones(1))  # one collective per step, as DDP's backward
            if args.stop_after and len(ids) == args.stop_after:
                break
        epochs.append(ids)
        count = torch.tensor([len(ids)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        steps.append(int(count))
        if args.stop_after:
            if args.save and rank == 0:
                with open(args.save, "w") as out:
                    json.dump(dataset.state_dict(), out)
            break
    with open(args.out, "w") as out:
        json.dump({"epochs": epochs, "steps": steps}, out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
