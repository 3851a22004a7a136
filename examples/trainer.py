"""A trainer: a zero-style Stream over a RemoteLoader.

Start a server (see examples/sampler.py), then::

    python examples/trainer.py tcp://127.0.0.1:5555

It trains (here: counts) until the server's last epoch, and prints what each
server epoch held. Run two of them with ``--world-size 2`` to split the stream.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import feedmux


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address", nargs="?", default="tcp://127.0.0.1:5555")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()

    per_epoch: Counter[int] = Counter()
    with feedmux.RemoteLoader(args.address, timeout=args.timeout,
                              world_size=args.world_size) as loader:
        stream = feedmux.Stream(loader)
        for batch in stream.data(math.inf):  # ends when the server's last epoch is done
            per_epoch[loader.last_epoch or 0] += 1
            _ = batch["X"].sum()  # a training step would go here
        print(f"{stream.iteration} samples in {len(per_epoch)} epochs: {dict(per_epoch)}")


if __name__ == "__main__":
    main()
