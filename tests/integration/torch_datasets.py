"""Real torch ``Dataset`` classes the integration tests serve as they are.

``TensorDataset`` gives ``(tensor, label)``; it appends ``pid shard epoch index``
to the file named by ``log=`` at every ``__getitem__`` (the shard and epoch from
:func:`feedmux.worker_info`), so a test can tell which process loaded which
index, for which shard and epoch. Importing this module imports torch (the
server then has it, as a user's would).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import Dataset

import feedmux
from tests.integration.dataset_samplers import SIZE


class TensorDataset(Dataset[tuple[torch.Tensor, int]]):
    """``(tensor of 8 floats equal to the index, index)`` for indices 0 .. size-1."""

    def __init__(self, size: int = SIZE, log: str = "") -> None:
        self.size = size
        self.log = log

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not isinstance(index, int):
            raise TypeError(f"expected an int index, got {type(index).__name__}")
        if self.log:
            info = feedmux.worker_info()
            assert info is not None, "worker_info() is None in a sampling process"
            line = f"{os.getpid()} {info.id} {info.epoch} {index}\n"
            # One short O_APPEND write per call: lines from several processes never mix.
            descriptor = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(descriptor, line.encode())
            finally:
                os.close(descriptor)
        return torch.full((8,), float(index)), index


class DictDataset(Dataset[dict[str, Any]]):
    """``{"id": index, "x": tensor, "name": str}``: dict samples, as the resume trainer reads."""

    def __init__(self, size: int = SIZE, width: int = 4) -> None:
        self.size = size
        self.width = width

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"id": index, "x": torch.full((self.width,), float(index)), "name": f"item{index}"}
