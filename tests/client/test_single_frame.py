"""Every message a loader sends is one frame.

libzmq 4.3.5 aborts the process (``session_base.cpp:233``) when a socket is
closed or disconnected while its connection is part-way through writing a
multipart message and that connection fails meanwhile. A loader closes its
sockets and re-points them at moved servers (disconnect, connect) at any
time: it can do so safely because nothing it sends has a second frame.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import Any

from feedmux import protocol
from feedmux.protocol import Ack, Credit, Heartbeat, Hello, Scale, ShmAttach, StatsRequest, encode

CLIENT = Path(protocol.__file__).parent.parent / "client"

#: The largest message of each kind a loader sends (the longest fields it fills in).
EXAMPLES: dict[str, Any] = {
    "Hello": Hello("t" * 1024, world_size=64, rank=63, group="g", resume=(9, 99, 64, 1),
                   handed=tuple(range(3 * 64))),
    "Heartbeat": Heartbeat("t" * 1024, received_messages=1 << 40, group="g"),
    "StatsRequest": StatsRequest("t" * 1024),
    "Credit": Credit(credits=256, client_id="t" * 1024),
    "Ack": Ack(seqs=list(range(256)), client_id="t" * 1024, server_id="s" * 12, rank=3,
               epoch=9, position=12345),
    "ShmAttach": ShmAttach(token="k" * 64, client_id="t" * 1024),
    "Scale": Scale(workers=1024, client_id="t" * 1024),
}


def _sent_by_the_client() -> set[str]:
    """The message classes the client package constructs."""
    kinds = {kind.__name__ for kind in typing.get_args(protocol.Message)}
    built = set()
    for path in CLIENT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in kinds):
                built.add(node.func.id)
    return built


def test_every_message_a_loader_sends_is_one_frame() -> None:
    sent = _sent_by_the_client()
    assert sent and sent <= set(EXAMPLES), f"no example for {sorted(sent - set(EXAMPLES))}"
    for name in sorted(sent):
        frames = encode(EXAMPLES[name])
        assert len(frames) == 1, f"{name} is {len(frames)} frames"
