"""A Lightning model trained on the samples of a feedmux server, through a LightningDataModule.

    python examples/make_data.py /tmp/feedmux-data
    feedmux serve examples.sampler:make_mux --arg data_dir=/tmp/feedmux-data --epochs 2
    python examples/lightning_train.py --address tcp://127.0.0.1:5555 --epochs 2

Each Lightning epoch is one server epoch: ``RemoteDataset`` ends a pass over
the DataLoader where the server's epoch ends. The DataLoader's workers
(``--workers``) are persistent, so each is one trainer for the whole run; under
DDP (``--devices N`` with a strategy that starts N processes) each rank passes
its ``global_rank`` and ``world_size`` to the dataset, and each of its workers
takes a share of the rank (docs/torch.md). With ``--results FILE`` the ids
trained on are written per epoch, as JSON. Samples are dicts with an array
(``--key``, default ``"X"``, any width) and an ``"id"``; the model regresses
the array's mean.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import lightning
import torch
from torch.utils.data import DataLoader

from feedmux.torch import RemoteDataset


class FeedmuxData(lightning.LightningDataModule):
    """The training data: a feedmux server's stream, one server epoch per Lightning epoch."""

    def __init__(self, address: str, control: str | None = None, workers: int = 2) -> None:
        super().__init__()
        self.address, self.control, self.workers = address, control, workers
        self.dataset: RemoteDataset | None = None

    def setup(self, stage: str) -> None:
        # The rank is known only now (Lightning starts the processes): the loaders connect
        # later still, in the processes that iterate the dataset.
        ranked = self.trainer is not None and self.trainer.world_size > 1
        self.dataset = RemoteDataset(
            self.address, control=self.control, timeout=60,
            rank=self.trainer.global_rank if ranked else None,
            world_size=self.trainer.world_size if ranked else 1)

    def train_dataloader(self) -> Any:
        assert self.dataset is not None
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.workers,
                            persistent_workers=self.workers > 0)
        # track(): the data module's state is where the training loop stands (checkpoints).
        return self.dataset.track(loader)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.dataset is None else self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and self.dataset is not None:
            self.dataset.load_state_dict(state)


class MeanRegression(lightning.LightningModule):
    """A linear model of the mean of ``x``; remembers the ids it trained on, per epoch."""

    def __init__(self, key: str = "X") -> None:
        super().__init__()
        self.key = key
        self.layer = torch.nn.LazyLinear(1)
        self.seen: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, sample: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        x = sample[self.key].float().reshape(1, -1)
        self.seen[-1].append(int(sample["id"]))
        return torch.nn.functional.mse_loss(self.layer(x), x.mean(dim=1, keepdim=True))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the server's data endpoint")
    parser.add_argument("--control", help="its control endpoint (default: data port + 1)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--key", default="X", help="the array of each sample to learn from")
    parser.add_argument("--results", help="a JSON file for the ids seen per epoch")
    args = parser.parse_args()
    model = MeanRegression(args.key)
    trainer = lightning.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1,
                                logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=FeedmuxData(args.address, args.control, args.workers))
    if args.results:
        Path(args.results).write_text(json.dumps(model.seen))


if __name__ == "__main__":
    main()
