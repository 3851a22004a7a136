"""The send path is chosen once, as sampling starts, and a trainer's hello never changes it.

A server in a thread of the test process, real loaders over 127.0.0.1: the
path its shell sends along is read before and after a consumer group's first
trainer comes (it used to open the groups' path then, in the middle of a send).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from feedmux import RemoteLoader, Server
from feedmux.server._delivery.fanout import GroupFanout
from feedmux.server._delivery.paths import NOT_OPEN, RankedJob, SendPath

SOURCE = "tests.integration.samplers:numbered"
BOUND = 30.0


@contextmanager
def _serving(**options: object) -> Iterator[Server]:
    server = Server(SOURCE, bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0",
                    seed=1, **options)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + BOUND
        while server._bound is None:  # the shell this test runs
            assert time.monotonic() < deadline, "the server did not bind"
            time.sleep(0.01)
        yield server
    finally:
        server.request_stop("the test is over")
        thread.join(BOUND)
        assert not thread.is_alive(), "the server did not stop"


def _path(server: Server) -> SendPath:
    shell = server._endpoints
    assert shell is not None
    return shell.path


def _take(loader: RemoteLoader, count: int) -> list[int]:
    samples = iter(loader)
    return [int(next(samples)["id"]) for _ in range(count)]


def test_a_free_server_sends_along_the_groups_path_and_a_group_joining_keeps_it() -> None:
    with _serving(hwm=2) as server:
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=BOUND, hwm=2) as free:
            first = _take(free, 8)
            path = _path(server)
            assert isinstance(path, GroupFanout)
            assert set(path.buffer.groups) == {"default"}
            # The free trainer reads no more: the server waits with messages for it,
            # and the evaluation group's first trainer comes meanwhile.
            with RemoteLoader(server.data_address, control=server.control_address,
                              group="eval", timeout=BOUND) as evaluation:
                assert len(_take(evaluation, 8)) == 8
                assert _path(server) is path
                assert set(path.buffer.groups) == {"default", "eval"}
            # The free trainer goes on where it was: nothing of its stream went elsewhere.
            more = _take(free, 8)
            assert len(set(first + more)) == 16


def test_a_ranked_job_has_a_path_of_its_own() -> None:
    with _serving() as server:
        assert _path(server) is NOT_OPEN  # nobody said hello: sampling has not started
        loaders = [RemoteLoader(server.data_address, control=server.control_address,
                                rank=rank, world_size=2, timeout=BOUND) for rank in (0, 1)]
        try:
            # Sampling starts once both ranks said hello: each takes its first in a thread.
            takers = [threading.Thread(target=next, args=(iter(loader),), daemon=True)
                      for loader in loaders]
            for taker in takers:
                taker.start()
            for taker in takers:
                taker.join(BOUND)
            assert not any(taker.is_alive() for taker in takers)
            assert isinstance(_path(server), RankedJob)
        finally:
            for loader in loaders:
                loader.close()


def test_the_free_trainers_group_is_kept_while_nobody_reads() -> None:
    timeout = 0.2
    # The free trainers' group is the only one: dropping it for want of members would let
    # go of what the next free trainer must get. The stream has 200 samples an epoch, all
    # sampled into the buffer at once: the end of sampling waits for the free trainers past
    # the drain timeout too (a DataLoader's next pass may come seconds later; the chaos
    # test's seed 2 found its last epoch short by 185 samples when it did not).
    # The first trainer holds a message or two (hwm=1): the rest waits in the buffer.
    with _serving(group_timeout=timeout, drain_timeout=timeout, epochs=1,
                  samples_per_message=4) as server:
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=BOUND, hwm=1) as first:
            seen = _take(first, 50)
        time.sleep(5 * timeout)  # what the rule is about: longer than the group timeout
        with RemoteLoader(server.data_address, control=server.control_address,
                          timeout=BOUND) as second:
            seen += [int(sample["id"]) for sample in second]
        assert sorted(seen) == list(range(200))
