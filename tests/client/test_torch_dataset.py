"""feedmux.torch without a server: shares of ranks among DataLoader workers, tensors without
a copy, what RemoteDataset refuses, and that feedmux itself never imports torch."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections import namedtuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

from feedmux.client.remote import RemoteLoader  # noqa: E402
from feedmux.errors import ConfigurationError, StreamValueError  # noqa: E402
from feedmux.torch import RemoteDataset, to_tensors, worker_share  # noqa: E402

NOWHERE = "tcp://127.0.0.1:9"  # never connected to: nothing here iterates


def test_import_feedmux_never_imports_torch() -> None:
    code = ("import sys, feedmux, feedmux.client.remote, feedmux.server.server; "
            "feedmux.RemoteLoader('tcp://127.0.0.1:9'); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("world_size, workers", [(1, 2), (2, 2), (3, 4)])
def test_worker_shares_reproduce_the_ranks_order(world_size: int, workers: int) -> None:
    # The server deals position p to rank p % n; the in-order DataLoader takes one sample
    # from each worker in turn. Together: the positions rank r alone gets, in its order.
    epoch = world_size * workers * 5
    for rank in range(world_size):
        shares = [worker_share(rank, world_size, w, workers) for w in range(workers)]
        assert {share.world_size for share in shares} == {world_size * workers}
        dealt = [[p for p in range(epoch) if p % (world_size * workers) == share.rank]
                 for share in shares]
        round_robin = [dealt[w][k] for k in range(len(dealt[0])) for w in range(workers)]
        assert round_robin == [p for p in range(epoch) if p % world_size == rank]


def test_to_tensors_shares_memory_and_keeps_the_shape_of_the_sample() -> None:
    Pair = namedtuple("Pair", "a b")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    sample = to_tensors({"x": x, "id": np.int64(3), "name": "s", "raw": b"\x00",
                         "pair": Pair(np.ones(2), [np.zeros(1, dtype=np.uint8)]),
                         "words": np.array(["a", "b"])})
    assert isinstance(sample["x"], torch.Tensor) and sample["x"].shape == (2, 3)
    sample["x"][0, 0] = 42.0
    assert x[0, 0] == 42.0  # the same memory: no copy
    assert sample["id"].item() == 3 and sample["name"] == "s" and sample["raw"] == b"\x00"
    assert type(sample["pair"]) is Pair and sample["pair"].b[0].dtype == torch.uint8
    assert isinstance(sample["words"], np.ndarray)  # not numeric: left alone
    frozen = np.ones(2)
    frozen.flags.writeable = False
    assert to_tensors(frozen).tolist() == [1.0, 1.0]  # copied: tensors are writable


def test_remote_dataset_checks_its_options_without_connecting() -> None:
    with pytest.raises(ConfigurationError, match="rank"):
        RemoteDataset(NOWHERE, rank=2, world_size=2)
    with pytest.raises(ConfigurationError, match="with_meta"):
        RemoteDataset(NOWHERE, with_meta=True)
    dataset = RemoteDataset(NOWHERE, rank=0, world_size=2, hwm=4)
    assert isinstance(dataset, IterableDataset)
    dataset.load_state_dict({"last_epoch": None, "last_position": None,
                             "last_server_id": None})
    assert dataset.state_dict()["rank"] == 0  # nothing handed out yet: no position
    assert dataset.state_dict()["resume"] == [None]


def test_reliable_warns_once_where_the_dataset_is_made_and_never_in_its_loaders() -> None:
    # The dataset checks its options with a loader, and builds another in each process that
    # iterates it: reliable= reached both, and warned from inside feedmux.torch, where the
    # default filters hide a DeprecationWarning.
    with pytest.warns(DeprecationWarning, match=r"does nothing.*exactly once by default") as (
            caught):
        dataset = RemoteDataset(NOWHERE, reliable=True, timeout=5)
    assert [warning.filename for warning in caught] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset.loader().close()


def test_a_free_remote_dataset_may_ask_for_buckets() -> None:
    # Before: "expected bucket_by with rank= and world_size= ..." for a free trainer.
    dataset = RemoteDataset(NOWHERE, batch_size=8, bucket_by="tokens", pad=True)
    assert isinstance(dataset, IterableDataset)
    with pytest.raises(ConfigurationError, match=r"expected bucket_by with batch_size="):
        RemoteDataset(NOWHERE, bucket_by="tokens")


def test_a_ranked_loader_iterated_by_several_workers_is_refused_clearly() -> None:
    loader = RemoteLoader(NOWHERE, rank=0, world_size=1, timeout=5)
    with pytest.raises(Exception, match="RemoteDataset"):
        next(iter(DataLoader(loader, batch_size=None, num_workers=2)))


@pytest.mark.slow  # a fresh interpreter imports torch
def test_a_loader_made_before_torch_was_loaded_says_what_to_use() -> None:
    code = ("import feedmux; loader = feedmux.RemoteLoader('tcp://127.0.0.1:9'); "
            "import torch.utils.data as d; print(isinstance(loader, d.IterableDataset)); "
            "loader[0]")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "False"
    assert "use feedmux.torch.RemoteDataset" in done.stderr  # not "not subscriptable"


def test_load_state_dict_after_the_first_iteration_is_refused() -> None:
    dataset = RemoteDataset(NOWHERE, timeout=1)
    dataset.loader()  # built (it connects only when iterated)
    with pytest.raises(StreamValueError, match="before the dataset is first iterated"):
        dataset.load_state_dict({})
