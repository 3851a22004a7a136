"""Servers that move: the resolver's answers, the link state's move, a loader following a server.

The loader is given endpoints nobody listens on and a resolver that names the
real server's: it must follow there and take the whole stream. Servers bind
port 0 on 127.0.0.1; the dead endpoints are ipc paths in the test's folder.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from feedmux.client._link import Grant, Send, ServerLinks
from feedmux.client._moves import AddressBook
from feedmux.client.remote import RemoteLoader
from feedmux.protocol import INFLATES, Hello
from tests.client.test_remote import ids_stream, server

pytestmark = pytest.mark.timeout(60)

OLD = [("tcp://h:1", "tcp://h:2"), ("tcp://h:3", "tcp://h:4")]


def test_the_book_asks_on_time_and_names_only_what_moved() -> None:
    answers = [[OLD[0], ("tcp://g:5", "tcp://g:6")]]
    book = AddressBook(lambda: answers[-1], interval=2.0)
    assert not book.due(1.9) and book.due(2.0)
    assert book.moved(2.0, OLD) == [(1, "tcp://g:5", "tcp://g:6")]
    assert book.next_at == 4.0
    answers.append(OLD)
    assert book.moved(4.0, OLD) == []


def test_a_failing_or_odd_resolver_keeps_the_endpoints(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> list[tuple[str, str]]:
        raise ConnectionError("registry away")

    with caplog.at_level(logging.WARNING, "feedmux.client"):
        assert AddressBook(broken).moved(0.0, OLD) == []
        assert AddressBook(lambda: None).moved(0.0, OLD) == []
        assert AddressBook(lambda: OLD[:1]).moved(0.0, OLD) == []
    assert "registry away" in caplog.text and "expected 2 server endpoint pairs" in caplog.text


def test_the_link_state_moves_a_link_and_says_hello_there() -> None:
    links = ServerLinks([d for d, _ in OLD], [c for _, c in OLD], client_id="t", world_size=2,
                        timeout=None, heartbeat_interval=1.0, rank=1)
    actions = links.move(1, "tcp://g:5", "tcp://g:6")
    # The credit again (the first grant went to the old endpoints, and died with them).
    assert actions == [Grant(1), Send(1, Hello(client_id="t", world_size=2, rank=1,
                                               codecs=INFLATES))]
    assert links.data_addresses == ["tcp://h:1", "tcp://g:5"]
    assert links.links[1].control_address == "tcp://g:6"


def test_a_loader_follows_a_server_to_the_endpoints_the_resolver_names(tmp_path: Path) -> None:
    dead = (f"ipc://{tmp_path}/data", f"ipc://{tmp_path}/control")
    with server(ids_stream(0, 30), epochs=2) as running:
        live = (running.data_address, running.control_address)
        with RemoteLoader(dead[0], control=dead[1], timeout=30,
                          resolve=lambda: [live]) as loader:
            ids = sorted(int(sample["id"]) for sample in loader)
            assert loader.addresses == [live[0]]
        assert running.join(timeout=10) == 0
    assert ids == sorted(list(range(30)) * 2)


def test_a_pickled_loader_is_a_fresh_one_with_the_same_arguments(tmp_path: Path) -> None:
    loader = RemoteLoader(f"ipc://{tmp_path}/data", rank=1, world_size=2, timeout=5,
                          with_meta=True)
    copy = pickle.loads(pickle.dumps(loader))
    assert (copy.addresses, copy.rank, copy.world_size, copy.timeout, copy.with_meta) == (
        loader.addresses, 1, 2, 5, True)
    assert copy.client_id != loader.client_id
    named = pickle.loads(pickle.dumps(RemoteLoader(f"ipc://{tmp_path}/d", client_id="me")))
    assert named.client_id == "me"
