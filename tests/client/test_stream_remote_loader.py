"""Stream over a RemoteLoader, without a server: the contract between the two classes.

Only what Stream relies on is pinned here (no sockets are opened): ``len()``
raises TypeError until the epoch size is known, and the loader's own state is
nested in the stream's state and handed back on restore. The loader's behaviour
itself is tested with the loader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from feedmux.client import Stream
from feedmux.client.remote import RemoteLoader
from feedmux.errors import StreamValueError


@pytest.fixture
def loader() -> Iterator[RemoteLoader]:
    remote = RemoteLoader("tcp://127.0.0.1:9")
    try:
        yield remote
    finally:
        remote.close()


@pytest.mark.timeout(10)
def test_stream_accepts_a_loader_without_length_yet(loader: RemoteLoader) -> None:
    with pytest.raises(TypeError):
        len(loader)
    stream = Stream(loader)
    with pytest.raises(StreamValueError, match=r"loader \(RemoteLoader\) has no length yet"):
        stream.data()
    with pytest.raises(StreamValueError, match="epoch_size"):
        next(stream.epochs(1))


@pytest.mark.timeout(10)
def test_loader_state_is_nested_and_handed_back(loader: RemoteLoader) -> None:
    stream = Stream(loader)
    state = stream.state_dict()
    assert state["loader"] == loader.state_dict()
    saved = json.loads(json.dumps(state))
    Stream(loader).load_state_dict(saved)
    assert loader.state_dict() == state["loader"]
    without_loader_state = {key: value for key, value in saved.items() if key != "loader"}
    with pytest.raises(StreamValueError, match="missing key 'loader'"):
        Stream(loader).load_state_dict(without_loader_state)
