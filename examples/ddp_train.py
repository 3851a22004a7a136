"""One rank of a data-parallel job fed by a feedmux server: run it with torchrun.

    feedmux serve tests.integration.samplers:numbered --epochs 3 --bind tcp://127.0.0.1:5555
    torchrun --nproc_per_node 2 examples/ddp_train.py --address tcp://127.0.0.1:5555

Every rank gets the same number of samples per epoch (the server deals each
epoch by rank), so the ``all_reduce`` of every step finds all ranks there and
every rank's ``iter_epoch()`` ends on the same step. With ``--results DIR``
each rank writes the ids it trained on, per epoch, to ``DIR/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from feedmux import RemoteLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the server's data endpoint")
    parser.add_argument("--control", help="its control endpoint (default: data port + 1)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--results", help="a directory for each rank's ids")
    args = parser.parse_args()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    try:
        epochs = train(args.address, args.control, rank, world_size, args.epochs)
    finally:
        dist.destroy_process_group()
    if args.results:
        Path(args.results, f"rank{rank}.json").write_text(json.dumps(epochs))


def train(address: str, control: str | None, rank: int, world_size: int,
          epochs: int) -> list[list[int]]:
    """Iterate ``epochs`` epochs, one ``all_reduce`` per step; the ids seen in each."""
    seen: list[list[int]] = []
    with RemoteLoader(address, control=control, rank=rank, world_size=world_size,
                      timeout=60) as loader:
        for _ in range(epochs):
            ids = []
            for sample in loader.iter_epoch():
                step = torch.ones(1)
                dist.all_reduce(step)  # hangs unless every rank takes this step
                ids.append(int(sample["id"]))
            seen.append(ids)
    return seen


if __name__ == "__main__":
    main()
