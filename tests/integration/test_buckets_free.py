"""A free trainer's buckets (``bucket_by=`` without a rank) through real servers and loaders.

Every server here is a real process (``Server(...).start()`` or ``feedmux serve``,
bound to port 0 on 127.0.0.1) and every trainer a real ``RemoteLoader``: in a
checked thread, or a process of ``tests.integration.trainers`` to be SIGKILLed.
"Exactly once" is what docs/server.md says of free trainers: every sample of an
epoch is handed out once across the loaders that share the stream.
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
from feedmux.protocol import Padded
from tests.integration.bucket_samplers import length_of
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

pytestmark = pytest.mark.timeout(180)

RAGGED = "tests.integration.bucket_samplers:ragged"
NUMBERED = "tests.integration.samplers:numbered"
EPOCH = 302  # 2 streams x 151 samples: no whole number of batches
EPOCHS = 2
BATCH = 4
EDGES = (8, 16, 32)


def bucket_of(length: int, edges: tuple[int, ...] = EDGES) -> int:
    return sum(length >= edge for edge in edges)


def threaded(target: Callable[..., Any], *args: Any, **options: Any) -> CheckedThread:
    return CheckedThread(functools.partial(target, *args, **options))


def ragged_server(**options: Any) -> Server:
    options = {"factory_kwargs": {"streams": 2, "per_stream": EPOCH // 2}, "epochs": EPOCHS,
               "epoch_size": EPOCH, "seed": 3, "bind": "tcp://127.0.0.1:0",
               "control": "tcp://127.0.0.1:0", "samples_per_message": 8, **options}
    return Server(RAGGED, **options).start()


def bucketed_steps(server: Server, pad: bool, **options: Any) -> list[tuple[int, list[int]]]:
    """Every batch a free bucketing loader hands out until the stream ends, ``(epoch, ids)``,
    each checked: its tokens each sample's own (a list, or padded with a mask)."""
    steps = []
    with RemoteLoader(server.data_address, control=server.control_address, timeout=60,
                      with_meta=True, batch_size=BATCH, bucket_by="tokens", pad=pad,
                      **options) as loader:
        for meta, batch in loader:
            ids = batch["id"].tolist()
            lengths = np.array([length_of(i) for i in ids])
            assert 1 <= len(ids) <= BATCH and meta.positions.tolist() == sorted(
                meta.positions.tolist())
            tokens = batch["tokens"]
            if pad:
                assert isinstance(tokens, Padded)
                assert tokens.values.shape == (len(ids), lengths.max())
                assert (tokens.mask == (np.arange(lengths.max()) < lengths[:, None])).all()
                assert (tokens.values == np.where(tokens.mask, batch["id"][:, None], 0)).all()
            else:
                assert isinstance(tokens, list)
                for sample_id, array in zip(ids, tokens, strict=True):
                    assert array.shape == (length_of(sample_id),) and (array == sample_id).all()
            steps.append((meta.epoch, ids))
    return steps


@pytest.mark.parametrize(("pad", "drop_last", "edges"), [
    (True, False, EDGES), (False, True, EDGES), (False, False, ()),
])
def test_a_free_trainer_with_bucket_by_gets_each_epoch_once_in_batches_of_one_bucket(
        servers: list[Server], pad: bool, drop_last: bool, edges: tuple[int, ...]) -> None:
    # Before: refused ("expected bucket_by with rank= and world_size= ...").
    servers.append(server := ragged_server(bucket_edges=edges))
    steps = bucketed_steps(server, pad, drop_last=drop_last)
    for epoch in range(1, EPOCHS + 1):
        batches = [ids for e, ids in steps if e == epoch]
        ids = Counter(i for batch in batches for i in batch)
        assert max(ids.values()) == 1, epoch
        short = [batch for batch in batches if len(batch) < BATCH]
        if drop_last:  # each bucket's last, short batch of the epoch dropped
            assert not short and EPOCH - (len(EDGES) + 1) * (BATCH - 1) <= len(ids), epoch
        else:
            assert sorted(ids) == list(range(EPOCH)), epoch
            assert len(short) <= max(1, len(edges) + 1), (epoch, short)
        lengths = [[length_of(i) for i in batch] for batch in batches]
        if edges:  # every batch of one bucket
            assert all(len({bucket_of(n) for n in batch}) == 1 for batch in lengths)
        # Of similar length: far less padding than the same samples batched by id.
        by_id = [[length_of(i) for i in range(start, min(start + BATCH, EPOCH))]
                 for start in range(0, EPOCH, BATCH)]
        assert waste(lengths) < 0.6 * waste(by_id), (waste(lengths), waste(by_id))
    assert server.join(30) == 0


def waste(batches: list[list[int]]) -> float:
    """Padding to each batch's longest, as a share of the padded tokens."""
    return 1 - sum(map(sum, batches)) / sum(len(batch) * max(batch) for batch in batches)


def read(server: Server, **options: Any) -> list[tuple[int, list[int]]]:
    """Every step a loader hands out until the stream ends, ``(epoch, ids)``."""
    steps = []
    with RemoteLoader(server.data_address, control=server.control_address, timeout=60,
                      with_meta=True, **options) as loader:
        for meta, item in loader:
            ids = item["id"]
            steps.append((meta.epoch, [int(ids)] if np.ndim(ids) == 0 else ids.tolist()))
    return steps


def test_a_bucketing_a_plain_batched_and_a_single_sample_trainer_share_one_stream(
        servers: list[Server]) -> None:
    # The ids are the lengths here (bucket_by="id": an int field), so every batch stacks.
    servers.append(server := Server(
        NUMBERED, factory_kwargs={"streams": 4, "per_stream": 100}, epochs=EPOCHS,
        epoch_size=400, bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0",
        min_trainers=3, samples_per_message=10, bucket_edges=(100, 200, 300)).start())
    threads = [threaded(read, server, batch_size=8, bucket_by="id"),
               threaded(read, server, batch_size=5),
               threaded(read, server)]
    bucketed, plain, single = (thread.join(150) for thread in threads)
    assert bucketed and plain and single, "each loader gets a share of the stream"
    assert all(len({i // 100 for i in ids}) == 1 for _, ids in bucketed)
    assert all(len(ids) <= 5 for _, ids in plain) and all(len(ids) == 1 for _, ids in single)
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(i for steps in (bucketed, plain, single) for e, step in steps
                      if e == epoch for i in step)
        assert sorted(ids) == list(range(400)) and set(ids.values()) == {1}, epoch
    assert server.join(30) == 0


def test_a_consumer_groups_members_may_bucket_and_each_group_gets_every_sample_once(
        servers: list[Server]) -> None:
    servers.append(server := ragged_server(min_trainers=3, bucket_edges=EDGES))
    threads = [threaded(bucketed_steps, server, False, group="train", world_size=2),
               threaded(read, server, group="train", world_size=2),
               threaded(read, server, group="eval")]
    bucketed, single, evaluator = (thread.join(150) for thread in threads)
    assert bucketed and single, "each member gets a share of its group's stream"
    assert all(len({bucket_of(length_of(i)) for i in ids}) == 1 for _, ids in bucketed)
    for epoch in range(1, EPOCHS + 1):
        trained = Counter(i for steps in (bucketed, single) for e, step in steps
                          if e == epoch for i in step)
        evaluated = Counter(i for e, step in evaluator if e == epoch for i in step)
        assert sorted(trained) == list(range(EPOCH)) and set(trained.values()) == {1}, epoch
        assert sorted(evaluated) == list(range(EPOCH)) and set(evaluated.values()) == {1}
    assert server.join(30) == 0


def test_samples_without_the_field_are_that_loaders_error_and_the_other_gets_them_all(
        servers: list[Server]) -> None:
    servers.append(server := ragged_server(min_trainers=2, epochs=1))
    said = threaded(lambda: first_error(RemoteLoader(
        server.data_address, control=server.control_address, timeout=60, batch_size=BATCH,
        bucket_by="length")))
    single = threaded(read, server)
    assert re.search(r"DataError: cannot build a batch of batch_size=4, bucket_by='length' in "
                     r"epoch 1: bucket_by='length': expected each sample a dict whose 'length' "
                     r"is its length .*got a dict with keys \['id', 'tokens'\]; .*This loader "
                     r"is dealt nothing more", said.join(90)), said
    assert sorted(i for _, ids in single.join(90) for i in ids) == list(range(EPOCH))
    assert server.join(30) == 0


@pytest.mark.parametrize("survivor", [["--batch-size", "3", "--bucket-by", "tokens"], []])
def test_a_killed_bucketing_trainer_loses_nothing_the_others_get_its_rest(
        serve: Callable[..., Spawned], tmp_path: Path, survivor: list[str]) -> None:
    # The bucketing trainer dies mid-epoch holding batches it was sent (padded: dealt again
    # as their samples) and rows in its shape's window (given back to the others).
    server = serve(RAGGED, "--arg", "per_stream=300", "--epochs", "2", "--samples-per-message",
                   "8", "--min-trainers", "2", "--bucket-edges", "8,16,32")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data, server.control]
    doomed = subprocess.Popen([*common, str(tmp_path / "doomed"), "--batch-size", "4",
                               "--bucket-by", "tokens", "--die-after", "40", "--step-ms", "2"],
                              env=env, cwd=ROOT)
    alive = subprocess.Popen([*common, str(tmp_path / "survivor"), "--step-ms", "0.2",
                              *survivor], env=env, cwd=ROOT)
    try:
        assert doomed.wait(timeout=120) == -9
        assert alive.wait(timeout=120) == 0
    finally:
        kill_remaining([doomed, alive])
    dead, rest = records(tmp_path / "doomed"), records(tmp_path / "survivor")
    assert 40 * 3 <= len(dead) <= 40 * 4
    assert server.wait(timeout=30) == 0, server.stderr
    assert_each_epoch_once(dead + rest, 1200, server.stderr)


def test_a_restarted_server_deals_again_what_a_bucketing_trainers_window_held(
        serve: Callable[..., Spawned], tmp_path: Path) -> None:
    # A bucketing trainer hands out 2 batches and stops reading: its shape's window keeps
    # rows of positions scattered below the newest message dealt, and the batches built
    # for it, none of them sent to anyone. The other trainer reads on past a few summaries
    # of the hand-outs; the server is SIGKILLed and restarted on the same endpoints, and
    # both trainers go on with it. Unless the old server's summary listed the window's
    # rows as not handed out, the restarted one takes them for handed out (lost).
    command = (RAGGED, "--arg", "per_stream=100", "--epochs", "2",
               "--samples-per-message", "8", "--min-trainers", "2")
    endpoints = Endpoints.ipc(tmp_path)  # the restarted server binds the same endpoints
    server = serve(*command, endpoints=endpoints)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data, server.control]
    go = ["--go-file", str(tmp_path / "go")]
    trainers = [subprocess.Popen([*common, str(tmp_path / "bucketed"), "--batch-size", "4",
                                  "--bucket-by", "tokens", "--hold-after", "2", *go],
                                 env=env, cwd=ROOT),
                subprocess.Popen([*common, str(tmp_path / "single"), "--step-ms", "5",
                                  "--hold-after", "128", *go], env=env, cwd=ROOT)]
    try:
        wait_until(lambda: all((tmp_path / name).exists() for name in ("bucketed", "single"))
                   and len(records(tmp_path / "bucketed")) == 8
                   and len(records(tmp_path / "single")) >= 128, 60,
                   "the bucketing trainer at 2 batches, the other at 128 samples")
        server.kill()
        server.wait(timeout=10)
        server = serve(*command, endpoints=endpoints)
        (tmp_path / "go").touch()
        assert [trainer.wait(timeout=90) for trainer in trainers] == [0, 0]
        assert server.wait(timeout=30) == 0, server.stderr
    finally:
        kill_remaining(trainers)
    rows = records(tmp_path / "bucketed") + records(tmp_path / "single")
    assert_each_epoch_once(rows, 400, server.stderr)


def test_a_server_killed_while_a_bucketing_trainer_reads_loses_nothing_on_restart(
        serve: Callable[..., Spawned], tmp_path: Path) -> None:
    # Both trainers read on while the server is SIGKILLed mid-epoch and restarted on the
    # same endpoints. The bucketing trainer's latest batch lies above rows its shape's
    # window still held and no summary listed (they came after the last one): taking its
    # latest hand-out for a frontier below which all was handed out lost them (19 and 25
    # of epoch 1 in two runs). What was dealt after the last summary and nobody reports
    # may come twice; none is lost.
    command = (RAGGED, "--arg", "per_stream=500", "--epochs", "2",
               "--samples-per-message", "8", "--min-trainers", "2")
    endpoints = Endpoints.ipc(tmp_path)
    server = serve(*command, endpoints=endpoints)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data, server.control]
    trainers = [subprocess.Popen([*common, str(tmp_path / "bucketed"), "--batch-size", "4",
                                  "--bucket-by", "tokens"], env=env, cwd=ROOT),
                subprocess.Popen([*common, str(tmp_path / "single"), "--step-ms", "1"],
                                 env=env, cwd=ROOT)]
    try:
        wait_until(lambda: (tmp_path / "single").exists()
                   and len(records(tmp_path / "single")) >= 300, 60,
                   "the single-sample trainer at 300 samples")
        server.kill()
        server.wait(timeout=10)
        server = serve(*command, endpoints=endpoints)
        assert [trainer.wait(timeout=120) for trainer in trainers] == [0, 0]
        assert server.wait(timeout=30) == 0, server.stderr
    finally:
        kill_remaining(trainers)
    rows = records(tmp_path / "bucketed") + records(tmp_path / "single")
    for epoch in (1, 2):
        got = Counter(i for e, i in rows if e == epoch)
        assert set(got) == set(range(2000)), (
            f"epoch {epoch}: lost {sorted(set(range(2000)) - set(got))[:30]}; the server "
            f"said:\n{server.stderr[-3000:]}")
