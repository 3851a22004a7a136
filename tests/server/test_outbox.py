"""The outbox's one error policy and its one wait, with a fake socket (strays: over ipc)."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any

import pytest
import zmq

from feedmux._plumbing.sockets import send_message
from feedmux.protocol import Credit
from feedmux.server._delivery.outbox import FULL, GONE, SENT, Outbox, Wait
from feedmux.server._delivery.reliable import ReliableLink


class FakeSocket:
    """Records what was sent; each send raises the next scripted error, if any."""

    def __init__(self, script: Sequence[BaseException | None] = ()) -> None:
        self.script = list(script)
        self.sent: list[list[Any]] = []

    def send_multipart(self, parts: list[Any], flags: int = 0, copy: bool = True) -> None:
        assert flags == zmq.NOBLOCK  # the outbox never blocks in a send
        error = self.script.pop(0) if self.script else None
        if error is not None:
            raise error
        self.sent.append(parts)


def unreachable() -> zmq.ZMQError:
    return zmq.ZMQError(errno.EHOSTUNREACH)


def outbox(socket: FakeSocket) -> tuple[Outbox, zmq.Context[Any], zmq.Socket[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    control = context.socket(zmq.PAIR)  # never connected: nothing arrives on it
    return Outbox(socket, control, lambda: None), context, control


@pytest.fixture
def parts() -> list[bytes]:
    return [b"header", b"tags"]


def test_a_send_is_addressed_and_each_failure_named(parts: list[bytes]) -> None:
    socket = FakeSocket([zmq.Again(), unreachable(), None])
    box, context, control = outbox(socket)
    try:
        assert box.send(b"t1", parts) is FULL
        assert box.send(b"t1", parts) is GONE
        assert box.send(b"t1", parts) is SENT
        assert socket.sent == [[b"t1", b"header", b"tags"]]
    finally:
        control.close()
        context.term()


def test_any_other_error_is_raised_not_taken_for_a_busy_trainer(parts: list[bytes]) -> None:
    box, context, control = outbox(FakeSocket([zmq.ZMQError(errno.ENOTSOCK)]))
    try:
        with pytest.raises(zmq.ZMQError):
            box.send(b"t1", parts)
    finally:
        control.close()
        context.term()


def test_the_loop_waits_between_tries_and_counts_it_as_blocked(parts: list[bytes]) -> None:
    socket = FakeSocket([zmq.Again(), zmq.Again(), None])
    box, context, control = outbox(socket)
    try:
        tries = []

        def attempt() -> Wait | None:
            tries.append(1)
            return None if box.send(b"t1", parts) is SENT else Wait.BRIEF

        assert box.deliver(attempt, lambda: False)
        assert len(tries) == 3 and box.blocked_seconds > 0
        box.count([b"12345", memoryview(bytearray(8)).cast("d")])
        assert box.bytes_sent == 13
    finally:
        control.close()
        context.term()


def test_the_loop_gives_up_when_halted_and_never_spins() -> None:
    box, context, control = outbox(FakeSocket())
    try:
        turns = []

        def halted() -> bool:
            turns.append(1)
            return len(turns) > 3

        assert not box.deliver(lambda: Wait.IDLE, halted)
        # Three waits of at most 0.1 s each: bounded, and each one counted.
        assert 0 < box.blocked_seconds < 5
    finally:
        control.close()
        context.term()


def test_a_wait_serves_control_when_it_speaks(parts: list[bytes]) -> None:
    context: zmq.Context[Any] = zmq.Context()
    control, peer = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        control.bind("inproc://outbox-control")
        peer.connect("inproc://outbox-control")
        served = []
        box = Outbox(FakeSocket(), control, lambda: served.append(control.recv()))
        peer.send(b"hello")
        for _ in range(50):  # bounded: each wait lasts at most 0.1 s
            box.wait(Wait.IDLE)
            if served:
                break
        assert served == [b"hello"]
    finally:
        control.close()
        peer.close()
        context.term()


def test_strays_on_the_data_socket_are_read_dropped_and_counted_in_a_wait(tmp_path: Any) -> None:
    # As the server assembles it: the outbox's waits read the data socket with the link
    # that takes the trainers' credit and acknowledgements. What stray peers send there
    # among them is dropped and counted, and a trainer's credit is still taken.
    context: zmq.Context[Any] = zmq.Context()
    try:
        data, control = context.socket(zmq.ROUTER), context.socket(zmq.PAIR)
        data.bind(f"ipc://{tmp_path}/data")
        stray, trainer = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
        trainer.setsockopt(zmq.ROUTING_ID, b"t")
        for peer in (stray, trainer):
            peer.connect(f"ipc://{tmp_path}/data")
        for number in range(5):
            stray.send_multipart([b"stray", bytes([number])])
        send_message(trainer, Credit(client_id="t", credits=4))
        box = Outbox(data, control, lambda: None)
        link = ReliableLink(data, box, "s")
        box.serve_data = link.serve
        looks = 50  # messages arrive over ipc in the background: look a bounded while
        while (box.stray_dropped < 5 or b"t" not in link.credits.peers) and looks:
            box.wait(Wait.CREDIT)
            looks -= 1
        assert box.stray_dropped == 5 and b"t" in link.credits.peers
        link.serve()  # nothing left: it returns at once
        assert box.stray_dropped == 5
        for socket in (data, control, stray, trainer):
            socket.close(linger=0)
    finally:
        context.term()
