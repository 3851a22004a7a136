"""A loader's batches without a server: its arguments, its hello and its length."""

from __future__ import annotations

from typing import Any

import pytest

from feedmux import RemoteLoader
from feedmux.client._link import ServerLinks
from feedmux.errors import ConfigurationError
from feedmux.protocol import INFLATES, Hello, Welcome

ADDRESS = "tcp://127.0.0.1:1"


@pytest.mark.parametrize(("options", "message"), [
    ({"batch_size": 0}, "expected batch_size None or an int >= 1, got 0"),
    ({"batch_size": -3}, "expected batch_size None or an int >= 1, got -3"),
    ({"batch_size": 2.0}, "expected batch_size None or an int >= 1, got 2.0"),
    ({"batch_size": True}, "expected batch_size None or an int >= 1, got True"),
    ({"batch_size": "8"}, "expected batch_size None or an int >= 1, got '8'"),
    ({"batch_size": 8, "drop_last": 1}, "expected drop_last a bool, got 1"),
    ({"drop_last": True}, "expected drop_last=False without batch_size"),
    ({"bucket_by": "tokens"}, "expected bucket_by with batch_size= .*got bucket_by='tokens', "
                              "batch_size=None"),
    ({"bucket_by": "", "batch_size": 8}, "expected bucket_by None or a field name, got ''"),
    ({"pad": True}, "expected pad=False without batch_size"),
])
def test_bad_batch_arguments_are_refused_saying_what_was_expected(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RemoteLoader(ADDRESS, **options)


def links(**options: Any) -> ServerLinks:
    options = {"world_size": 1, **options}
    return ServerLinks([ADDRESS, "tcp://127.0.0.1:3"], ["tcp://127.0.0.1:2", "tcp://127.0.0.1:4"],
                       client_id="t", timeout=None, heartbeat_interval=1.0,
                       **options)


def test_the_hello_asks_for_the_batches() -> None:
    hellos = [action.message for action in links(batch_size=32, drop_last=True).hello()]
    assert hellos == [Hello("t", batch_size=32, drop_last=True, codecs=INFLATES)] * 2
    assert [action.message for action in links().hello()] == [Hello("t", codecs=INFLATES)] * 2


def test_a_free_loader_may_ask_for_buckets() -> None:
    # Before: "expected bucket_by with rank= and world_size= (it deals the steps of a
    # data-parallel job)".
    hellos = [action.message for action in
              links(batch_size=8, bucket_by="tokens", pad=True).hello()]
    assert hellos == [Hello("t", batch_size=8, bucket_by="tokens", codecs=INFLATES)] * 2
    loader = RemoteLoader(ADDRESS, batch_size=8, bucket_by="tokens", pad=True)
    loader.close()


@pytest.mark.parametrize(("options", "steps"), [
    ({"world_size": 1}, 10 + 14),  # samples of both servers
    ({"world_size": 1, "batch_size": 4}, 3 + 4),  # each server's epoch cut on its own
    ({"world_size": 1, "batch_size": 4, "drop_last": True}, 2 + 3),
    ({"world_size": 2, "batch_size": 4}, (3 + 4) // 2),  # free trainers share the batches
    ({"world_size": 3, "rank": 1, "batch_size": 2}, 2 + 3),  # ranks: 4 and 5 samples each
    ({"world_size": 3, "rank": 1, "batch_size": 2, "drop_last": True}, 2 + 2),
])
def test_len_counts_this_trainers_batches(options: dict[str, Any], steps: int) -> None:
    state = links(**options)
    ranked = options.get("rank") is not None
    for index, size in enumerate((10, 14)):
        welcome = Welcome(f"s{index}", epoch_size=size, reliable=True,
                          world_size=3 if ranked else 0, uneven="pad" if ranked else "")
        state.control(index, welcome)
    assert state.length() == steps
