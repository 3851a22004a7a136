"""``--compress zstd:1+delta``: image batches filtered, compressed and restored end to end.

Real server (and sampling worker) processes and a trainer on 127.0.0.1 that does not map
the shared-memory pool (``shm=False``: a socket link, as a trainer on another host). The
images arrive equal to the ones sampled, in exact epochs, and every message the trainer
inflates (its decoder watched) has its image frame filtered (codec 3); with
``--workers 2`` the workers make the filtered form and the server sends it on as it is.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from feedmux import RemoteLoader, Server, fetch_stats
from feedmux.client._link import ServerLinks
from feedmux.protocol import _decode
from tests.integration.samplers import photo

pytestmark = pytest.mark.timeout(120)

SAMPLER = "tests.integration.samplers:photos"
EPOCH, EPOCHS, PER_MESSAGE = 64, 2, 8  # a message: 8 images of 64x96x3, one 144 KiB frame


def run(compress: str, monkeypatch: pytest.MonkeyPatch,
        workers: int = 1) -> tuple[dict[str, Any], Counter[int]]:
    """Serve two epochs to one socket trainer; every image checked; the server's stats and
    the codecs of the frames the trainer inflated."""
    codecs: Counter[int] = Counter()
    inflate = _decode.inflate

    def watched(header: dict[Any, Any], *args: Any) -> list[Any]:
        codecs.update(header.get("c", ()))
        return inflate(header, *args)

    monkeypatch.setattr(_decode, "inflate", watched)
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", epochs=EPOCHS, seed=3, workers=workers,
                    samples_per_message=PER_MESSAGE, compress=compress, shm_size=64 << 20,
                    factory_kwargs={"streams": 4, "per_stream": EPOCH // 4}).start()
    try:
        seen: list[tuple[int, int]] = []
        with RemoteLoader(server.data_address, control=server.control_address, timeout=30,
                          shm=False) as loader:
            for sample in loader:
                index = int(sample["id"])
                image = sample["image"]
                assert image.dtype == np.uint8 and np.array_equal(image, photo(index)), index
                seen.append((int(loader.last_epoch or 0), index))
            stats = fetch_stats(server.control_address)
        assert len(seen) == EPOCH * EPOCHS
        for epoch in range(1, EPOCHS + 1):
            ids = Counter(i for e, i in seen if e == epoch)
            assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, epoch
        assert server.join(30) == 0
        return stats, codecs
    finally:
        server.stop()


MESSAGES = EPOCH * EPOCHS // PER_MESSAGE


def test_filtered_images_arrive_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    stats, codecs = run("zstd:1+delta", monkeypatch)
    assert stats["compress"] == "zstd:1+delta"
    assert stats["compressed_by_server"] == MESSAGES, stats
    assert codecs[3] == MESSAGES, codecs  # every message's image frame, filtered
    # zstd alone: the same images, no frame filtered (an older trainer reads it).
    _, codecs = run("zstd:1", monkeypatch)
    assert sum(codecs.values()) == 3 * MESSAGES and codecs[3] == 0, codecs


def test_the_workers_make_the_filtered_form_and_the_server_sends_it_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stats, codecs = run("zstd:1+delta", monkeypatch, workers=2)
    assert stats["compressed_by_workers"] == MESSAGES, stats
    assert stats["compressed_by_server"] == 0 and stats["inflated_by_server"] == 0, stats
    assert codecs[3] == MESSAGES, codecs


@pytest.mark.parametrize("workers", [1, 2])
def test_a_trainer_gets_only_the_codecs_it_inflates(monkeypatch: pytest.MonkeyPatch,
                                                    workers: int) -> None:
    # A trainer that cannot undo the filter (it says so in its hello) gets zstd alone; one
    # older than compression (it names no codec) gets raw messages. With 2 workers the
    # filtered form they made is inflated and compressed again for it, or sent raw.
    monkeypatch.setattr(ServerLinks, "codecs", (1, 2))
    stats, codecs = run("zstd:1+delta", monkeypatch, workers=workers)
    assert codecs[3] == 0 and sum(codecs.values()) == 3 * MESSAGES, codecs
    name = next(key for key in stats if key.endswith(".compress_reason")).rsplit(".", 1)[0]
    assert stats[f"{name}.compress"] == "zstd:1", stats
    assert stats[f"{name}.compress_reason"] == (
        "the trainer inflates codecs [1, 2], not zstd:1+delta")
    monkeypatch.setattr(ServerLinks, "codecs", ())
    stats, codecs = run("zstd:1+delta", monkeypatch, workers=workers)
    assert not codecs, codecs  # nothing to inflate: every message came raw
    assert any(value == "off" for key, value in stats.items() if key.endswith(".compress"))
