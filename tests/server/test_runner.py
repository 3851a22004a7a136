"""A shard's runner: how it cuts its messages (``feedmux.server._sources.runner``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from feedmux._plumbing.shm import ShmPool
from feedmux.protocol import Data, decode
from feedmux.sampling import Streamer
from feedmux.server._sources.meters import SamplerMeter
from feedmux.server._sources.producer import Draw
from feedmux.server._sources.runner import ShardRunner
from feedmux.server.config import ServerConfig


def _slow(count: int) -> Iterator[dict[str, int]]:
    for index in range(count):
        time.sleep(0.002)  # a slow sampler: max_delay holds about one sample
        yield {"id": index}


def _message_sizes(batch_size: int, messages: int = 4) -> list[int]:
    config = ServerConfig("x:y", seed=1, max_delay=0.001)
    runner = ShardRunner(Streamer(_slow, 64), 0, 1, config, 1, (1, 0), 8, Draw(None, None))
    sizes: list[int] = []

    def send(frames: list[object]) -> bool:
        message = decode(frames)
        if isinstance(message, Data):
            sizes.append(len(message.samples))
        return True

    while len(sizes) < messages:
        runner.step(send, SamplerMeter(), batch_size)
    runner.close()
    return sizes


def test_a_slow_shard_ships_small_messages_to_a_server_that_sends_them_on() -> None:
    assert max(_message_sizes(batch_size=0)[1:]) <= 2


def test_a_shard_fills_its_merge_block_while_the_server_cuts_batches() -> None:
    # The server waits for whole batches anyway, and every message it forwards costs it
    # the same: a worker's image every 2 ms made messages of 1-2 images (server CPU per
    # image 250 us, 90 us with whole blocks).
    # (Batches as large as the block: at least one whole batch a message, however slow the
    # machine makes the sampler look.)
    assert _message_sizes(batch_size=8) == [8, 8, 8, 8]


def _images(count: int) -> Iterator[dict[str, object]]:
    for index in range(count):
        yield {"image": np.full((3, 224, 224), index, np.uint8), "label": index}


def test_a_shard_stacks_its_message_in_its_region_of_the_pool_when_a_trainer_maps_it(
        tmp_path: Path) -> None:
    pool = ShmPool.create(16 << 20, directory=str(tmp_path))
    assert pool is not None
    try:
        config = ServerConfig("x:y", seed=1)
        runner = ShardRunner(Streamer(_images, 8), 0, 1, config, 1, (1, 0), 4,
                             Draw(None, None, pool))
        sent: list[list[object]] = []

        def send(frames: list[object]) -> bool:
            placed = pool.forward(frames)  # as the worker does before it sends
            assert placed is not None
            placed.delivered()
            sent.append(placed.frames)
            return True

        pool.want(True)
        for _ in range(2):
            runner.step(send, SamplerMeter(), batch_size=4)
        # Stacked straight into the pool, forwarded as references: no copy into it (before:
        # the images stacked in numpy's memory, then copied in, 602,112 bytes a message).
        assert pool.copied == 0
        message = decode(sent[-1], resolve=pool.forwarded.view)
        assert isinstance(message, Data)
        assert [int(sample["image"][0, 0, 0]) for sample in message.samples] == [4, 5, 6, 7]
        runner.close()
    finally:
        pool.close()


def test_a_workers_message_that_skipped_a_refused_sample_is_numbered_without_a_hole() -> None:
    # A sampling worker counts what it sent, and the server expects its next message to
    # start there. Before, a refused first sample left the message starting a position
    # later: "expected shard 0's samples from epoch 2 position 5, got epoch 2 position 6"
    # (--workers 2 --on-error skip, 1 run in 4).
    import numpy as np

    from feedmux.protocol import Data, decode
    from feedmux.server._sources.producer import encode_batch

    tags = np.array([[2, 5], [2, 6], [2, 7]], dtype=np.int64)
    samples = [{"x": object()}, {"x": np.int64(6)}, {"x": np.int64(7)}]
    frames, count = encode_batch(tags, samples, "s", 1, True, close_ranks=True)
    message = decode(frames)
    assert isinstance(message, Data) and count == 2
    assert message.tags.tolist() == [[2, 5], [2, 6]]
    frames, _ = encode_batch(tags, samples, "s", 1, True)  # a server's own: epoch positions
    held = decode(frames)
    assert isinstance(held, Data) and held.tags.tolist() == [[2, 6], [2, 7]]
