"""A RemoteLoader's record of where it is: last_epoch at an epoch boundary, and what a free
trainer's saved state says about resuming (epoch granularity, loudly)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import feedmux
from feedmux.client.remote import RemoteLoader

pytestmark = pytest.mark.timeout(60)


def ids(count: int) -> feedmux.Streamer[dict[str, Any]]:
    def generate() -> Iterator[dict[str, Any]]:
        for i in range(count):
            yield {"id": np.int64(i)}

    return feedmux.Streamer(generate)


def test_last_epoch_after_iter_epoch_ends_at_a_message_boundary() -> None:
    # 8 samples an epoch, 4 a message: the epoch ends where a message does, and the next
    # message (of epoch 2) is current when iter_epoch() returns. Before, last_epoch was None.
    with feedmux.Server(ids(8), bind="tcp://127.0.0.1:0", epochs=2,
                        samples_per_message=4) as running, \
            RemoteLoader(running.data_address, control=running.control_address,
                         timeout=20) as loader:
        assert [int(s["id"]) for s in loader.iter_epoch()] == list(range(8))
        assert loader.last_epoch == 1 and loader.last_position == 7
        state = loader.state_dict()
        assert (state["last_epoch"], state["last_position"]) == (1, 7)
        assert state["between_epochs"] is True
        assert [int(s["id"]) for s in loader.iter_epoch()] == list(range(8))
        assert loader.last_epoch == 2
        assert list(loader) == []
        assert loader.state_dict()["between_epochs"] is True  # the end of the stream
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a state saved between epochs restores quietly
        RemoteLoader(running.data_address, timeout=1).load_state_dict(state)


def test_a_free_mid_epoch_state_warns_on_restore() -> None:
    with feedmux.Server(ids(8), bind="tcp://127.0.0.1:0", epochs=1,
                        samples_per_message=4) as running, \
            RemoteLoader(running.data_address, control=running.control_address,
                         timeout=20) as loader:
        next(loader)
        state = loader.state_dict()
    assert state["between_epochs"] is False
    with pytest.warns(feedmux.ResumeWarning, match="middle of epoch 1 .*epoch granularity"):
        RemoteLoader(running.data_address, timeout=1).load_state_dict(state)
    # a state from before this record (no "between_epochs") saved mid-epoch warns too
    del state["between_epochs"]
    with pytest.warns(feedmux.ResumeWarning):
        RemoteLoader(running.data_address, timeout=1).load_state_dict(state)
