"""The control stand-in: it answers while the server's thread draws, and only then."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from feedmux.server._standin import IDLE_LOOK, ControlStandIn


@pytest.fixture
def control() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    context: zmq.Context[Any] = zmq.Context()
    server, peer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    server.bind("inproc://control")
    peer.connect("inproc://control")
    yield server, peer
    server.close(linger=0)
    peer.close(linger=0)
    context.term()


class _Shell:
    """What the stand-in drives: an answer to every request, the thread each ran on."""

    def __init__(self, socket: zmq.Socket[Any]) -> None:
        self.socket = socket
        self.answered_on: list[str] = []
        self.followed_on: list[str] = []

    def answer(self, timeout: float) -> bool:
        if not self.socket.poll(int(timeout * 1000)):
            return False
        while self.socket.poll(0):
            identity, request = self.socket.recv_multipart()
            self.socket.send_multipart([identity, b"re: " + request])
            self.answered_on.append(threading.current_thread().name)
        return True

    def follow(self) -> None:
        self.followed_on.append(threading.current_thread().name)


def test_a_long_draw_has_control_answered_and_the_rest_done_after_it(control):
    server, peer = control
    shell = _Shell(server)
    stand_in = ControlStandIn(server, shell.answer, shell.follow)
    try:
        with stand_in.drawing():
            peer.send(b"stats")
            # The draw: user code that never looks at the socket (it holds the GIL but at
            # each switch interval).
            deadline = time.monotonic() + 5
            while not peer.poll(0) and time.monotonic() < deadline:
                pass
            assert peer.poll(0), "no answer while the server's thread was drawing"
        assert peer.recv() == b"re: stats"
    finally:
        stand_in.close()
    assert shell.answered_on == ["feedmux-control-stand-in"]
    # The data side of what was answered: on the server's thread, once the draw is over.
    assert shell.followed_on == [threading.current_thread().name]


def test_outside_a_draw_the_server_thread_answers_alone(control):
    server, peer = control
    shell = _Shell(server)
    stand_in = ControlStandIn(server, shell.answer, shell.follow)
    try:
        peer.send(b"stats")
        with stand_in.drawing():
            pass  # a draw too short to be taken over: the shell is handed back at once
        time.sleep(3 * IDLE_LOOK)  # the stand-in's looks find no draw under way
    finally:
        stand_in.close()
    assert shell.answered_on == [] and shell.followed_on == []
    assert shell.answer(0)  # the server's thread answers it, between two draws
    assert peer.recv() == b"re: stats"


def test_close_stops_the_thread(control):
    server, _ = control
    shell = _Shell(server)
    stand_in = ControlStandIn(server, shell.answer, shell.follow)
    stand_in.close()
    assert not any(t.name == "feedmux-control-stand-in" for t in threading.enumerate())
