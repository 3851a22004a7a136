"""Coordinated steps through real server processes and three ranked trainers.

Every server here is a real process (``Server(...).start()``, bound to port 0 on
127.0.0.1) and every trainer a real ``RemoteLoader`` with ``bucket_by=`` over its
sockets; the ranks of one job run side by side in threads, each joined with a
bound.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import numpy as np
import pytest

from feedmux import RemoteLoader, Server, Stream
from feedmux.protocol import Padded
from tests.integration.bucket_samplers import length_of
from tests.integration.conftest import CheckedThread, first_error

pytestmark = pytest.mark.timeout(120)

RAGGED = "tests.integration.bucket_samplers:ragged"
EPOCH = 302  # 2 streams x 151 samples: no whole number of steps, nor of rounds of 3
EPOCHS = 3
WORLD = 3
BATCH = 4


def started(**options: Any) -> Server:
    options = {"factory_kwargs": {"streams": 2, "per_stream": EPOCH // 2}, "epochs": EPOCHS,
               "epoch_size": EPOCH, "seed": 5, "bind": "tcp://127.0.0.1:0",
               "control": "tcp://127.0.0.1:0", **options}
    return Server(RAGGED, **options).start()


def loader_of(server: Server, rank: int, **options: Any) -> RemoteLoader:
    return RemoteLoader(server.data_address, control=server.control_address, rank=rank,
                        world_size=WORLD, batch_size=BATCH, **{"timeout": 30, **options})


def ids_of(batch: dict[str, Any]) -> list[int]:
    """The ids of a batch, each checked against its tokens (a list of the samples' arrays)."""
    ids = batch["id"].tolist()
    tokens = batch["tokens"]
    assert isinstance(tokens, list) and len(tokens) == len(ids)
    for sample_id, array in zip(ids, tokens, strict=True):
        assert array.dtype == np.int32 and array.shape == (length_of(sample_id),)
        assert (array == sample_id).all()
    return list(ids)


def ranked_job(server: Server, epochs: int = EPOCHS, **options: Any) -> list[Any]:
    """Every rank's (len, epochs of batches as ids), the ranks run side by side."""
    def rank(index: int) -> tuple[int, list[list[list[int]]]]:
        loader = loader_of(server, index, bucket_by="tokens", **options)
        try:
            return len(loader), [[ids_of(batch) for batch in loader.iter_epoch()]
                                 for _ in range(epochs)]
        finally:
            loader.close()

    threads = [CheckedThread(rank, index) for index in range(WORLD)]
    return [thread.join(90) for thread in threads]


def waste(batches: list[list[int]]) -> float:
    """Padding to each batch's longest, as a share of the padded tokens."""
    lengths = [[length_of(i) for i in batch] for batch in batches if batch]
    return 1 - sum(map(sum, lengths)) / sum(len(b) * max(b) for b in lengths)


@pytest.mark.parametrize(("uneven", "drop_last", "workers"), [
    ("pad", False, 1), ("drop", True, 1), ("pad", True, 2),
])
def test_three_ranks_get_every_sample_once_in_equal_coordinated_steps_over_three_epochs(
    servers: list[Server], uneven: str, drop_last: bool, workers: int
) -> None:
    servers.append(server := started(uneven=uneven, workers=workers))
    results = ranked_job(server, drop_last=drop_last)
    share = math.ceil(EPOCH / WORLD) if uneven == "pad" else EPOCH // WORLD
    steps = share // BATCH if drop_last else math.ceil(share / BATCH)
    assert [length for length, _ in results] == [steps] * WORLD
    for epoch in range(EPOCHS):
        batches = [result[1][epoch] for result in results]
        assert [len(rank) for rank in batches] == [steps] * WORLD
        for step in zip(*batches, strict=True):  # step k: the same size on every rank
            assert len({len(batch) for batch in step}) == 1
        counts = Counter(i for rank in batches for batch in rank for i in batch)
        if uneven == "pad" and not drop_last:
            assert set(counts) == set(range(EPOCH))  # every sample; the pad repeats one
            assert sum(counts.values()) == WORLD * share
        else:
            assert max(counts.values()) == 1 and set(counts) <= set(range(EPOCH))
            assert len(counts) >= EPOCH - WORLD * BATCH
        # Coordinated: every rank's batch of a step holds samples of similar length, the
        # step's batches padded far less than the same epoch dealt in order of its ids.
        in_order = [list(range(start + rank, start + WORLD * BATCH, WORLD))
                    for start in range(0, EPOCH - WORLD * BATCH, WORLD * BATCH)
                    for rank in range(WORLD)]
        dealt = [batch for rank in batches for batch in rank]
        assert waste(dealt) < 0.2 < 0.35 < waste(in_order)
    # Deterministic: the same seed deals the same steps (a new server, the same job).
    servers.append(again := started(uneven=uneven, workers=workers))
    assert ranked_job(again, drop_last=drop_last) == results


def test_padded_batches_come_with_a_mask(servers: list[Server]) -> None:
    servers.append(server := started(epochs=1))

    def rank(index: int) -> list[int]:
        loader = loader_of(server, index, bucket_by="tokens", pad=True)
        ids: list[int] = []
        try:
            for batch in loader.iter_epoch():
                tokens = batch["tokens"]
                assert isinstance(tokens, Padded)
                lengths = np.array([length_of(i) for i in batch["id"].tolist()])
                assert tokens.values.shape == (len(lengths), lengths.max())
                assert (tokens.lengths == lengths).all()
                assert (tokens.mask == (np.arange(lengths.max()) < lengths[:, None])).all()
                expected = np.where(tokens.mask, batch["id"][:, None], 0)
                assert (tokens.values == expected).all()
                ids += batch["id"].tolist()
        finally:
            loader.close()
        return ids

    got = [thread.join(90) for thread in [CheckedThread(rank, index) for index in range(WORLD)]]
    assert set().union(*got) == set(range(EPOCH))


def test_a_job_resumes_mid_epoch_with_the_window_full_at_the_next_step(
        servers: list[Server]) -> None:
    # Each rank checkpoints after 14 steps of epoch 2 (168 samples dealt of it): nothing is
    # dealt before the window (16 steps, 192 samples) is full, so the job stops with a full
    # window's worth drawn and part of it still held.
    taken = math.ceil(EPOCH / WORLD / BATCH) + 14
    servers.append(server := started())
    whole = ranked_job(server)

    servers.append(server := started())

    def first_part(index: int) -> tuple[list[list[int]], dict[str, Any]]:
        loader = loader_of(server, index, bucket_by="tokens")
        stream = Stream(loader)
        try:
            batches = [ids_of(batch) for batch in stream.data(taken)]
            return batches, stream.state_dict()
        finally:
            loader.close()

    parts = [thread.join(90) for thread in
             [CheckedThread(first_part, index) for index in range(WORLD)]]
    server.stop()
    servers.append(server := started())  # the job and its server restart

    def rest(index: int) -> list[list[int]]:
        loader = loader_of(server, index, bucket_by="tokens")
        stream = Stream(loader)
        stream.load_state_dict(parts[index][1])
        try:
            return [ids_of(batch) for epoch in range(EPOCHS - 1)
                    for batch in loader.iter_epoch()]
        finally:
            loader.close()

    resumed = [thread.join(90) for thread in
               [CheckedThread(rest, index) for index in range(WORLD)]]
    for index in range(WORLD):
        uninterrupted = [batch for epoch in whole[index][1] for batch in epoch]
        assert parts[index][0] + resumed[index] == uninterrupted


def test_ranks_asking_for_different_bucket_settings_are_refused_clearly(
        servers: list[Server]) -> None:
    servers.append(server := started(rank_timeout=5))

    def rank(index: int, bucket_by: str | None) -> str:
        return first_error(RemoteLoader(
            server.data_address, control=server.control_address, rank=index, world_size=2,
            batch_size=BATCH, bucket_by=bucket_by, timeout=30))

    # Whichever rank's hello comes first fixes the job's batches; the other rank is refused.
    said = [thread.join(60) for thread in
            [CheckedThread(rank, 0, "tokens"), CheckedThread(rank, 1, None)]]
    refused = [text for text in said if re.search(
        r"the ranks of this job are dealt batches of batch_size=4, drop_last=False(, "
        r"bucket_by='tokens')? \(its first rank asked for them\): expected the same from rank "
        r"[01] \(trainer \S+\), got batch_size=4, drop_last=False(, bucket_by='tokens')?", text)]
    # The refused rank hears why; the other rank's error says which rank was refused, and why.
    assert len(refused) == 2, said
    assert sum("was refused" in text for text in said) == 1, said


def test_samples_without_the_length_field_fail_the_run_with_a_clear_error(
        servers: list[Server]) -> None:
    servers.append(server := started())

    def rank(index: int) -> str:
        return first_error(loader_of(server, index, bucket_by="length"))

    said = [thread.join(60) for thread in [CheckedThread(rank, index) for index in range(WORLD)]]
    assert all("bucket_by='length': expected each sample a dict whose 'length' is its length "
               "(an int >= 0, or an array: its first dimension), got a dict with keys "
               "['id', 'tokens']" in text for text in said), said
