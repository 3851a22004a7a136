"""Servers bind port 0 and report the endpoints they got (here and in a background process)."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import pytest
import zmq

import feedmux
from feedmux._plumbing.sockets import bound_address
from feedmux.client.remote import RemoteLoader, fetch_stats
from feedmux.errors import TransportError

pytestmark = pytest.mark.timeout(60)

TCP = re.compile(r"^tcp://127\.0\.0\.1:(\d+)$")


def numbers(count: int) -> feedmux.Streamer[dict[str, int]]:
    return feedmux.Streamer(lambda: ({"id": i} for i in range(count)))


def port_of(address: str) -> int:
    match = TCP.match(address)
    assert match, address
    return int(match[1])


def test_start_reports_the_ports_it_got_for_port_0() -> None:
    with feedmux.Server(numbers(5), bind="tcp://127.0.0.1:0", epochs=1) as server:
        data, control = server.data_address, server.control_address
        assert port_of(data) != 0 and port_of(control) != 0 and data != control
        with RemoteLoader(data, control=control, timeout=20) as loader:
            assert sorted(sample["id"] for sample in loader) == list(range(5))
        assert server.join(timeout=20) == 0


def test_ipc_endpoints_are_reported_as_given(tmp_path: Path) -> None:
    data, control = f"ipc://{tmp_path}/data", f"ipc://{tmp_path}/control"
    with feedmux.Server(numbers(3), bind=data, control=control) as server:
        assert (server.data_address, server.control_address) == (data, control)
        assert fetch_stats(control, timeout=10)["server_id"] == server.config.server_id


def test_start_raises_when_the_port_is_taken() -> None:
    # The first server binds port 0 and holds the port it got; the second asks for that port.
    with feedmux.Server(numbers(3), bind="tcp://127.0.0.1:0") as holder:
        server = feedmux.Server(numbers(3), bind=holder.data_address,
                                control="tcp://127.0.0.1:0")
        with pytest.raises(TransportError, match="cannot bind the data endpoint"):
            server.start(timeout=20)
        assert server.join(timeout=10) is not None


def test_start_raises_when_the_source_cannot_be_resolved() -> None:
    server = feedmux.Server("no_such_module_anywhere:make", bind="tcp://127.0.0.1:0")
    with pytest.raises(TransportError, match="no_such_module_anywhere"):
        server.start(timeout=20)


def test_addresses_before_binding_are_an_error() -> None:
    with pytest.raises(RuntimeError, match="not bound"):
        feedmux.Server(numbers(1)).data_address  # noqa: B018


def wait_for_addresses(server: feedmux.Server, timeout: float) -> tuple[str, str]:
    """Poll the condition "bound" with a bound on the wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return server.data_address, server.control_address
        except RuntimeError:
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not bind within {timeout} s") from None
            threading.Event().wait(0.02)


def test_run_in_this_process_sets_the_addresses(caplog: pytest.LogCaptureFixture) -> None:
    server = feedmux.Server(numbers(4), bind="tcp://127.0.0.1:0", epochs=1, drain_idle=0.5,
                            drain_timeout=5)
    outcome: list[int | BaseException] = []

    def run() -> None:
        try:
            outcome.append(server.run())
        except BaseException as error:  # reported by the test below
            outcome.append(error)

    caplog.set_level(logging.INFO, logger="feedmux.server")
    thread = threading.Thread(target=run)
    thread.start()
    try:
        data, control = wait_for_addresses(server, timeout=10)
        with RemoteLoader(data, control=control, timeout=20) as loader:
            assert sorted(sample["id"] for sample in loader) == list(range(4))
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome == [0]
    assert f"data {data}, control {control}," in caplog.text
    # Ended on its own, it no longer answers on its control socket; its last figures stay.
    final = server.final_stats
    assert final is not None and final["server_id"] == server.config.server_id
    assert final["workers"] == 1 and final["epochs_completed"] == 1


def test_final_stats_are_none_before_the_server_ran() -> None:
    assert feedmux.Server(numbers(1)).final_stats is None


def test_a_zmq_socket_reads_its_port_back() -> None:
    context = zmq.Context()
    try:
        with context.socket(zmq.PUSH) as push:
            push.bind("tcp://127.0.0.1:0")
            assert port_of(bound_address(push)) > 0
    finally:
        context.term()
