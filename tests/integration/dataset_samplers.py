"""Map-style datasets without torch that the integration tests serve as they are.

A list, a numpy array, a factory of one, and a class of dict samples: a server
that need not import torch starts in a second rather than ten on a loaded machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Items of the datasets below.
SIZE = 100


class NumberedRows:
    """``{"id": index, "x": float32[width] of the index}`` without torch (a server that need
    not import it starts in a second, not ten, on a loaded machine)."""

    def __init__(self, size: int = SIZE, width: int = 4) -> None:
        self.size = size
        self.width = width

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"id": index, "x": np.full(self.width, index, dtype=np.float32)}


#: A plain list served as it is.
LETTERS = [chr(ord("a") + index % 26) + str(index) for index in range(SIZE)]
#: A numpy array served as it is: row i is [i, i, i].
ROWS = np.repeat(np.arange(SIZE, dtype=np.int64)[:, None], 3, axis=1)


def make_rows(size: int = SIZE) -> np.ndarray:
    """A factory returning a dataset (a numpy array)."""
    return ROWS[:size]
