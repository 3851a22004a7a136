"""A batch shape is a trainer's own: loaders with different ``batch_size`` (and none) on
one server, consumer groups with batches, a ranked job's ranks agreeing, and a batch that
cannot be built being one trainer's error (real servers and loaders, port 0).

"Exactly once" with several free loaders on one stream is what docs/server.md says of
free trainers: each loader gets a share of the stream (whoever has credit takes the next
message), and every sample of an epoch is handed out once across them; a loader that
asked for batches gets its share as batches of its size, each epoch's last one short.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedmux import RemoteLoader, Server
from feedmux.errors import RemoteError
from tests.integration.conftest import (
    ROOT,
    CheckedThread,
    Endpoints,
    Spawned,
    assert_each_epoch_once,
    first_error,
    kill_remaining,
    records,
    wait_until,
)


def threaded(target: Callable[..., Any], *args: Any, **options: Any) -> CheckedThread:
    """``target(*args, **options)`` started in a checked thread."""
    return CheckedThread(functools.partial(target, *args, **options))

pytestmark = pytest.mark.timeout(180)

NUMBERED = "tests.integration.samplers:numbered"
EPOCH = 400  # 4 streams x 100 samples
EPOCHS = 2


def started(workers: int = 1, min_trainers: int = 2, **options: Any) -> Server:
    options = {"factory_kwargs": {"streams": 4, "per_stream": EPOCH // 4}, "epochs": EPOCHS,
               "epoch_size": EPOCH, "bind": "tcp://127.0.0.1:0", "workers": workers,
               "control": "tcp://127.0.0.1:0", "min_trainers": min_trainers,
               "samples_per_message": 10, **options}
    return Server(NUMBERED, **options).start()


def read(server: Server, **options: Any) -> list[tuple[int, list[int]]]:
    """Every step the loader hands out until the stream ends: ``(epoch, sample ids)``
    (one id for a loader without batches), its shape checked on the way."""
    steps: list[tuple[int, list[int]]] = []
    batch_size = options.get("batch_size")
    with RemoteLoader(server.data_address, control=server.control_address, timeout=60,
                      with_meta=True, **options) as loader:
        for meta, item in loader:
            if batch_size is None:
                assert isinstance(item["id"], (int, np.integer)), item
                steps.append((meta.epoch, [item["id"]]))
                continue
            ids = item["id"]
            assert isinstance(ids, np.ndarray) and ids.dtype == np.int64, ids
            assert 1 <= len(ids) <= batch_size and (meta.positions.shape == ids.shape)
            assert len(set(meta.positions.tolist())) == len(ids)
            steps.append((meta.epoch, ids.tolist()))
    return steps


def per_epoch(steps: list[tuple[int, list[int]]]) -> dict[int, list[list[int]]]:
    epochs: dict[int, list[list[int]]] = {}
    for epoch, ids in steps:
        epochs.setdefault(epoch, []).append(ids)
    return epochs


def check_batches(steps: list[tuple[int, list[int]]], batch_size: int) -> None:
    """Whole batches but for each epoch's last one (short, or whole)."""
    for epoch, batches in per_epoch(steps).items():
        sizes = [len(batch) for batch in batches]
        assert all(size == batch_size for size in sizes[:-1]), (epoch, sizes)


@pytest.mark.parametrize("workers", [1, 2])
def test_two_free_loaders_with_batch_size_32_and_none_share_one_stream_exactly_once(
        servers: list[Server], workers: int) -> None:
    # Before: the first trainer's hello fixed the server's batches, and the second loader
    # was refused ("expected the same from trainer ..., got batch_size=0").
    servers.append(server := started(workers))
    threads = [threaded(read, server, batch_size=32), threaded(read, server)]
    batched, single = (started.join(120) for started in threads)
    check_batches(batched, 32)
    assert batched and single, "each loader gets a share of the stream"
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(i for steps in (batched, single) for e, step in steps if e == epoch
                      for i in step)
        assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, epoch
    assert server.join(30) == 0


def test_two_batched_loaders_of_different_sizes_and_drop_last(servers: list[Server]) -> None:
    servers.append(server := started(min_trainers=2))
    threads = [threaded(read, server, batch_size=16),
               threaded(read, server, batch_size=7, drop_last=True)]
    sixteen, seven = (started.join(120) for started in threads)
    check_batches(sixteen, 16)
    assert all(len(batch) == 7 for _, batch in seven)  # drop_last: never a short one
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(i for steps in (sixteen, seven) for e, step in steps if e == epoch
                      for i in step)
        assert set(ids.values()) == {1}, epoch  # once at most: drop_last drops
        assert EPOCH - 6 <= len(ids) <= EPOCH  # at most one partial batch of 7 dropped
    assert server.join(30) == 0


@pytest.mark.parametrize("ranked", [True, False])
def test_a_training_group_with_batches_and_an_evaluation_group_without_on_one_server(
        servers: list[Server], ranked: bool) -> None:
    # Before: refused ("a group's messages are shared as sampled: ... cannot cut them into
    # one trainer's batches").
    servers.append(server := started(min_trainers=3))
    train = ({"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}) if ranked else (
        {"world_size": 2}, {"world_size": 2})
    threads = [*(threaded(read, server, group="train", batch_size=16, **options)
                 for options in train),
               threaded(read, server, group="eval")]
    *trainers, evaluator = (started.join(150) for started in threads)
    for steps in trainers:
        check_batches(steps, 16)
    for epoch in range(1, EPOCHS + 1):
        trained = Counter(i for steps in trainers for e, step in steps if e == epoch
                          for i in step)
        evaluated = Counter(i for e, step in evaluator if e == epoch for i in step)
        assert sorted(evaluated) == list(range(EPOCH)) and set(evaluated.values()) == {1}
        assert sorted(trained) == list(range(EPOCH)) and set(trained.values()) == {1}
    if ranked:  # a job's ranks take the same steps: 200 samples each, 13 batches
        assert [len(steps) for steps in trainers] == [EPOCHS * 13] * 2
    assert server.join(30) == 0


def test_ranks_of_a_group_asking_for_different_batch_sizes_are_refused_naming_both(
        servers: list[Server]) -> None:
    servers.append(server := started(min_trainers=0, rank_timeout=5))

    def rank(index: int, batch_size: int) -> str:
        return first_error(RemoteLoader(
            server.data_address, control=server.control_address, rank=index, world_size=2,
            group="train", batch_size=batch_size, timeout=30))

    threads = [threaded(rank, 0, 16), threaded(rank, 1, 8)]
    said = [started_rank.join(60) for started_rank in threads]
    refused = [text for text in said if re.search(
        r"the ranks of this job are dealt batches of batch_size=(16|8), drop_last=False \(its "
        r"first rank asked for them\): expected the same from rank [01] \(trainer \S+\), got "
        r"batch_size=(8|16), drop_last=False", text)]
    # The rank whose hello came second is refused, naming both values (a ranked group's
    # first rank is dealt its share meanwhile, up to the rank timeout).
    assert len(refused) == 1, said


def test_an_unbuildable_batch_is_that_trainers_error_and_the_other_gets_every_sample(
        serve: Callable[..., Spawned]) -> None:
    # Variable-length arrays from two sampling workers: a loader asking for batches gets an
    # error naming pad= and bucket_by=; a loader without batches on the same server gets
    # every sample of the epoch once, and the server ends normally.
    server = serve("tests.integration.error_samplers:lengths", "--epochs", "1",
                   "--workers", "2", "--min-trainers", "2")
    outcomes: dict[str, Any] = {}

    def trainer(name: str, **options: Any) -> None:
        try:
            with RemoteLoader(server.data, control=server.control, timeout=60,
                              **options) as loader:
                outcomes[name] = [int(sample["id"]) for sample in loader]
        except RemoteError as error:
            outcomes[name] = error

    threads = [threaded(trainer, "batched", batch_size=16), threaded(trainer, "single")]
    for started_trainer in threads:
        started_trainer.join(120)
    error = outcomes["batched"]
    assert isinstance(error, RemoteError), outcomes
    said = str(error)
    assert "DataError: cannot build a batch of batch_size=16" in said
    assert "bucket_by=" in said and "pad=True" in said
    assert sorted(outcomes["single"]) == list(range(64)), outcomes["single"]
    assert server.wait(timeout=60) == 0, server.stderr


@pytest.mark.parametrize(("workers", "survivor_batch"), [("1", 0), ("2", 5), ("1", 8)])
def test_a_killed_batched_trainers_rest_goes_to_the_others_exactly_once(
        serve: Callable[..., Spawned], tmp_path: Path, workers: str, survivor_batch: int) -> None:
    # The batches a trainer of batch_size=8 was sent and had not handed out go back to the
    # others (its ledger keeps the batches' bytes, cut after its last mark), whatever their
    # own batch size; what its shape held and had not sent yet goes on to the others.
    server = serve("tests.integration.samplers:numbered", "--arg", "per_stream=500",
                   "--epochs", "2", "--samples-per-message", "10", "--min-trainers", "2",
                   "--workers", workers)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data, server.control]
    doomed = subprocess.Popen([*common, str(tmp_path / "doomed"), "--batch-size", "8",
                               "--die-after", "30", "--step-ms", "2"], env=env, cwd=ROOT)
    survivor = subprocess.Popen([*common, str(tmp_path / "survivor"), "--batch-size",
                                 str(survivor_batch)], env=env, cwd=ROOT)
    try:
        assert doomed.wait(timeout=90) == -9
        assert survivor.wait(timeout=90) == 0
    finally:
        kill_remaining([doomed, survivor])
    dead, alive = records(tmp_path / "doomed"), records(tmp_path / "survivor")
    assert len(dead) == 30 * 8
    assert server.wait(timeout=30) == 0
    assert_each_epoch_once(dead + alive, 2000, server.stderr)


def test_a_restarted_server_deals_again_what_a_batch_shape_held_when_the_old_one_died(
        serve: Callable[..., Spawned], tmp_path: Path) -> None:
    # A trainer of batch_size=9 hands out 2 batches and stops reading: once its credit is
    # spent, its shape keeps the batches built for it and the rows of the next one, none
    # of them sent to anyone. The other trainer reads on (past a few summaries of the
    # hand-outs) and stops at 128 samples; the server is SIGKILLed and restarted on the
    # same endpoints, and both trainers go on with it. The rows the shape held lie below
    # the newest message dealt and nobody reports them: the old server's summary must list
    # them as not handed out, or the restarted server takes them for handed out (lost).
    command = ("tests.integration.samplers:numbered", "--arg", "per_stream=100",
               "--epochs", "2", "--samples-per-message", "8")
    endpoints = Endpoints.ipc(tmp_path)  # the restarted server binds the same endpoints
    server = serve(*command, "--min-trainers", "2", endpoints=endpoints)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data, server.control]
    go = ["--go-file", str(tmp_path / "go")]
    trainers = [subprocess.Popen([*common, str(tmp_path / "batched"), "--batch-size", "9",
                                  "--hold-after", "2", *go], env=env, cwd=ROOT),
                subprocess.Popen([*common, str(tmp_path / "single"), "--step-ms", "5",
                                  "--hold-after", "128", *go], env=env, cwd=ROOT)]
    try:
        wait_until(lambda: all((tmp_path / name).exists() for name in ("batched", "single"))
                   and len(records(tmp_path / "batched")) == 18
                   and len(records(tmp_path / "single")) >= 128, 60,
                   "the batched trainer at 2 batches, the other at 128 samples")
        server.kill()
        server.wait(timeout=10)
        server = serve(*command, "--min-trainers", "2", endpoints=endpoints)
        (tmp_path / "go").touch()
        assert [trainer.wait(timeout=90) for trainer in trainers] == [0, 0]
        assert server.wait(timeout=30) == 0, server.stderr
    finally:
        kill_remaining(trainers)
    rows = records(tmp_path / "batched") + records(tmp_path / "single")
    assert_each_epoch_once(rows, 400, server.stderr)
