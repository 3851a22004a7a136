"""The server's use of the shared-memory pool without sockets to trainers: the wait of a
full pool is the outbox's back-pressure wait, counted as blocked time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zmq

from feedmux._plumbing.shm import ShmPool
from feedmux.protocol import Data, encode
from feedmux.server._delivery.outbox import Outbox
from feedmux.server._delivery.pool import place_or_wait
from tests.server.test_outbox import FakeSocket

MIB = 1 << 20


def message(value: float) -> list[Any]:
    return encode(Data(np.array([[1, 0]]), [{"x": np.full(MIB // 4, value, np.float32)}]))


def test_a_full_pool_waits_in_the_outbox_and_the_wait_counts_as_blocked(tmp_path: Path) -> None:
    pool = ShmPool.create(MIB, directory=str(tmp_path))  # room for one 1 MiB message
    assert pool is not None
    context: zmq.Context[Any] = zmq.Context()
    control = context.socket(zmq.PAIR)  # never connected: nothing arrives on it
    try:
        box = Outbox(FakeSocket(), control, lambda: None)
        first = pool.place(message(1.0))
        assert first is not None  # the whole pool: the next placement must wait
        looks = []

        def halted() -> bool:  # asked before each look: the third time, the run comes back
            looks.append(1)
            if len(looks) == 3:
                pool.cancel(first)
            return False

        placed = place_or_wait(pool, message(2.0), box, halted)
        assert placed is not None and pool.stalls == 1
        assert len(looks) == 3 and box.blocked_seconds > 0
        # A server that stops while the pool is full gets no placement, and waits no more.
        assert place_or_wait(pool, message(3.0), box, lambda: True) is None
    finally:
        control.close(linger=0)
        context.term()
        pool.close()
