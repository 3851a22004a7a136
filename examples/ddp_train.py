"""One rank of a data-parallel job fed by a feedmux server: run it with torchrun.

    python examples/make_data.py feedmux-data
    feedmux serve examples.sampler:make_mux --arg data_dir=feedmux-data --epochs 3
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --address tcp://127.0.0.1:5555

Every rank gets the same number of samples per epoch (the server deals each
epoch by rank), so the ``all_reduce`` of every step finds all ranks there and
every rank's ``iter_epoch()`` ends on the same step. With ``--results DIR``
each rank writes the ids it trained on, per epoch, to ``DIR/rank<r>.json``.

Checkpointing: with ``--checkpoint DIR --every N`` rank 0 saves the model and
the loader's state (``loader.state_dict()``: the job's position) every N steps
to ``DIR/checkpoint.pt``. Run the same command with ``--resume`` after a crash
(with any number of ranks): every rank loads that checkpoint and the data goes
on exactly where the checkpointed model was, from a restarted server or the
one still running (docs/resume.md). ``--crash-at STEP`` makes every rank exit
at that step, as a crashing job would.
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
    parser.add_argument("--checkpoint", help="a directory for rank 0's checkpoints")
    parser.add_argument("--every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--resume", action="store_true", help="start from the checkpoint")
    parser.add_argument("--crash-at", type=int, default=0, help="exit at this step")
    args = parser.parse_args()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    try:
        epochs = train(args, rank, world_size)
    finally:
        dist.destroy_process_group()
    if args.results:
        Path(args.results, f"rank{rank}.json").write_text(json.dumps(epochs))


def train(args: argparse.Namespace, rank: int, world_size: int) -> list[list[int]]:
    """Train every epoch the server serves (at most ``--epochs``), one ``all_reduce`` per
    step; the ids seen in each epoch (from the resumed one on, after ``--resume``)."""
    model = torch.nn.Linear(1, 1)
    loader = RemoteLoader(args.address, control=args.control, rank=rank,
                          world_size=world_size, timeout=60)
    checkpoint = Path(args.checkpoint, "checkpoint.pt") if args.checkpoint else None
    if args.resume and checkpoint is not None:
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        loader.load_state_dict(saved["data"])  # any rank's: the position is the job's
    seen: list[list[int]] = []
    step = 0
    with loader:
        while len(seen) < args.epochs:
            ids = []
            for sample in loader.iter_epoch():  # the rest of the resumed epoch, then whole ones
                total = torch.ones(1)
                dist.all_reduce(total)  # hangs unless every rank takes this step
                ids.append(int(sample["id"]))
                step += 1
                if checkpoint is not None and rank == 0 and step % args.every == 0:
                    torch.save({"model": model.state_dict(), "data": loader.state_dict()},
                               checkpoint)
                if step == args.crash_at:
                    os._exit(1)  # a crash: no clean-up, no goodbye to the server
            if not ids:  # the stream has ended
                break
            seen.append(ids)
    return seen


if __name__ == "__main__":
    main()
