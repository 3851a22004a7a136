"""A ranked loader over two real servers tells each one how far it got in its messages.

A rank's data messages are released by its hand-out marks alone: a server that
deals by credit stops dealing to the rank once a credit's worth of them is
unmarked. The loader's acknowledging thread looks every few milliseconds and
marks the message that is current then; a loader over two servers that takes
one server's message and moves on to the other's between two looks must still
tell the first how far it got. It told only the server of the current message:
a trainer that read one server's samples in a flash and spent its steps on the
other's never told the first, which stopped after the rank's credit and never
sent the rest (a Ray fleet's ranked trainers intermittently got no data from
one of its two servers: ``tests/ray/test_fleet.py``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from feedmux import RemoteLoader
from tests.integration.conftest import Spawned

pytestmark = pytest.mark.timeout(90)

SOURCE = "tests.integration.samplers:numbered"
#: Samples of the server read at once (more than its startup can deal before the other
#: server's messages flow: it needs marks all along) and of the one read slowly.
QUICK, SLOW = 40, 10
#: The trainer's step on each sample of the slow server: the thread looks (and marks)
#: several times meanwhile, and the slow server has its next messages queued.
STEP = 0.05
#: Credit, in messages of one sample: the quick server needs a mark every two samples.
CREDIT = 2


def test_a_ranked_loader_marks_the_server_whose_message_it_left(
        serve: Callable[..., Spawned]) -> None:
    quick, slow = (
        serve(SOURCE, "--arg", "streams=2", "--arg", f"per_stream={samples // 2}",
              "--epochs", "1", "--samples-per-message", "1", "--seed", str(seed))
        for seed, samples in ((1, QUICK), (2, SLOW)))
    seen: dict[str, list[int]] = defaultdict(list)
    with RemoteLoader([quick.data, slow.data], control=[quick.control, slow.control],
                      rank=0, world_size=1, hwm=CREDIT, with_meta=True,
                      timeout=15) as loader:
        for meta, sample in loader:
            seen[meta.server_id].append(int(sample["id"]))
            if meta.server_id == loader.server_ids[1]:
                time.sleep(STEP)  # a step of the trainer's own (the quick server's: none)
        server_ids = loader.server_ids
    # Every sample of each server once, under that server's id.
    assert sorted(seen) == sorted(server_ids)
    assert sorted(seen[server_ids[0]]) == list(range(QUICK))
    assert sorted(seen[server_ids[1]]) == list(range(SLOW))
