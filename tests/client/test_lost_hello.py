"""A trainer whose hello a dying server swallowed says hello to the next one.

The trainer's link state and a restarted server's control core, talking with no
sockets: the hello went to a server killed before it answered, so the first
welcome the trainer gets is the new server's answer to its heartbeat.
"""

from __future__ import annotations

import pytest

from feedmux.client._link import Send, ServerLinks
from feedmux.protocol import Message, Welcome
from feedmux.server._control.core import ControlCore, Phase
from feedmux.server.config import ServerConfig

TRAINER = b"trainer"


def deliver(core: ControlCore, sends: list[Message], now: float) -> list[Message]:
    """Every message the trainer sent to the core; the core's answers."""
    return [answer for message in sends
            for _, answer in core.receive(TRAINER, message, now=now)]


@pytest.mark.parametrize("rank", [-1, 0])
def test_a_trainer_whose_hello_was_lost_says_hello_to_the_restarted_server(rank: int) -> None:
    links = ServerLinks(["tcp://h:1"], ["tcp://h:2"], client_id="t", world_size=1 if rank == 0
                        else 0, rank=rank, timeout=60.0,
                        heartbeat_interval=1.0)
    [lost] = links.hello()  # written to a server killed before it read it
    assert isinstance(lost, Send)
    core = ControlCore(ServerConfig(source="unused:source", server_id="new",
                                    min_trainers=1), started=0.0)
    core.begin()
    assert core.phase is Phase.WAITING
    pending = [action.message for action in links.tick(now=1.0) if isinstance(action, Send)]
    for step in range(1, 6):  # a few heartbeats and their answers
        answers = deliver(core, pending, now=float(step))
        assert answers and all(isinstance(answer, Welcome) for answer in answers)
        pending = [action.message for answer in answers for action in links.control(0, answer)
                   if isinstance(action, Send)]
        pending += [action.message for action in links.tick(now=step + 1.0)
                    if isinstance(action, Send)]
    assert core.connected_trainers(now=6.0) == 1
    core.tick(now=6.0)  # welcomes the trainers it waits for, then starts
    core.tick(now=6.1)
    assert core.phase is Phase.SAMPLING
