"""Ray Train fed by a feedmux fleet: 2 TorchTrainer workers (CPU, gloo), 2 sampler servers.

    pip install 'feedmux[ray]' torch
    python examples/ray_train.py                      # a local Ray instance
    python examples/ray_train.py --address HOST:PORT  # an existing Ray cluster

The fleet runs two feedmux servers as Ray actors, spread over the cluster's
nodes, each serving half of the source's streamers; each training worker gets
a ranked loader over both servers (picklable: it connects inside the worker),
so every rank takes the same number of steps and DDP's gradient all-reduce never
waits for a rank that ran dry. The samples go from the servers to the workers
over ZeroMQ, not through Ray's object store.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import ray
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

from feedmux import StochasticMux, Streamer
from feedmux.ray import SamplerFleet

FEATURES = 8


def examples(first: int, count: int) -> Iterator[dict[str, Any]]:
    """``count`` samples of a linear problem, ids ``first ..``, the same in every epoch."""
    rng = np.random.default_rng(first)
    weights = np.arange(1, FEATURES + 1, dtype=np.float32) / FEATURES
    for offset in range(count):
        x = rng.standard_normal(FEATURES).astype(np.float32)
        yield {"id": first + offset, "x": x, "y": np.float32(x @ weights)}


def make_source(files: int = 4, per_file: int = 64) -> StochasticMux:
    """Every sample of ``files`` "files" once per epoch, in a seeded, per-epoch order."""
    return StochasticMux(
        [Streamer(examples, index * per_file, per_file) for index in range(files)],
        n_active=2, rate=None, mode="exhaustive", random_state=0,
    )


def train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: its rank's loader, DDP over gloo, one optimiser step a sample batch."""
    context = ray.train.get_context()
    loader = config["loaders"][context.get_world_rank()]
    model = prepare_model(torch.nn.Linear(FEATURES, 1))  # DistributedDataParallel (gloo)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    steps, ids, loss = 0, [], torch.zeros(())
    with loader:
        batch: list[dict[str, Any]] = []
        for sample in loader:  # to the end of the fleet's epochs: every rank the same steps
            batch.append(sample)
            ids.append(int(sample["id"]))
            if len(batch) < config["batch_size"]:
                continue
            x = torch.as_tensor(np.stack([s["x"] for s in batch]))
            y = torch.as_tensor(np.stack([s["y"] for s in batch]))
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            optimiser.zero_grad()
            loss.backward()  # the gradient all-reduce: every rank must get here
            optimiser.step()
            steps, batch = steps + 1, []
    metrics = {"steps": steps, "samples": len(ids), "loss": float(loss.detach())}
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if context.get_world_rank() == 0:  # the result's metrics are those of a checkpoint
            torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
            checkpoint = Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="a Ray cluster to join (default: start one here)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--storage", help="Ray Train's storage folder (default: a temporary one)")
    args = parser.parse_args(argv)
    ray.init(address=args.address, include_dashboard=False)
    with tempfile.TemporaryDirectory(prefix="feedmux-ray-train-") as scratch, \
            SamplerFleet(make_source(), num_servers=2, epochs=args.epochs, num_cpus=0.25) as fleet:
        print(f"fleet servers: {fleet.addresses}", flush=True)
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"batch_size": 8,
                               "loaders": [fleet.loader(rank=rank, world_size=2, timeout=120)
                                           for rank in range(2)]},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                         resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name="feedmux-ray-train", storage_path=args.storage or scratch),
        )
        result = trainer.fit()
    metrics = dict(result.metrics)
    print(f"ray_train: 2 workers, {metrics['steps']} steps each, {metrics['samples']} samples "
          f"each, loss {metrics['loss']:.4f}", flush=True)
    return metrics


if __name__ == "__main__":
    main()
