"""A real torch.distributed job (gloo, CPU) fed by a ranked feedmux server.

Every rank iterates its loader's epochs with one ``all_reduce`` per step: the
job finishes only if every rank takes the same number of steps per epoch.
Coverage is checked from the ids each rank trained on.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedmux import RemoteLoader, Server
from feedmux.errors import RemoteError
from tests.integration.conftest import CheckedThread

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLER = "tests.integration.samplers:numbered"
#: A small epoch that no tested world size divides: 2 streams x 25 samples.
EPOCH = 50
EPOCHS = 3


#: (world_size, workers, uneven) of the gloo jobs, run one after the other by the same
#: rank processes (sub-groups of one gloo group: three torch imports, not ten).
CASES = [(2, 1, "pad"), (3, 2, "pad"), (3, 1, "drop"), (2, 2, "drop")]
PROCESSES = max(world_size for world_size, _, _ in CASES)


def run_ranks(rank: int, endpoints: list[tuple[str, str]], folder: str) -> None:
    """One spawned process: rank ``rank`` of every case it takes part in, in turn."""
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank,
                            world_size=PROCESSES)
    try:
        for case, (world_size, _, _) in enumerate(CASES):
            group = dist.new_group(list(range(world_size)))  # (every process makes each)
            if rank < world_size:
                address, control = endpoints[case]
                run_rank(rank, world_size, address, control, group, Path(folder, str(case)))
    finally:
        dist.destroy_process_group()


def run_rank(rank: int, world_size: int, address: str, control: str, group: Any,
             folder: Path) -> None:
    """Train EPOCHS epochs as rank ``rank`` of ``group``, one all_reduce a step; write the
    ids seen."""
    seen = []
    with RemoteLoader(address, control=control, rank=rank, world_size=world_size,
                      timeout=30) as loader:
        steps = len(loader)  # known before the first sample: the size is declared
        for _ in range(EPOCHS):
            ids = []
            for sample in loader.iter_epoch():
                step = torch.ones(1)
                dist.all_reduce(step, group=group)
                ids.append(int(sample["id"]))
            seen.append(ids)
    folder.mkdir(exist_ok=True)
    (folder / f"rank{rank}.json").write_text(json.dumps({"len": steps, "epochs": seen}))


def ranked_server(workers: int, uneven: str) -> Server:
    return Server(SAMPLER, factory_kwargs={"streams": 2, "per_stream": EPOCH // 2},
                  bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0", workers=workers,
                  epochs=EPOCHS, epoch_size=EPOCH, uneven=uneven, rank_timeout=60).start()


def check_coverage(folder: Path, world_size: int, uneven: str) -> None:
    results = [json.loads((folder / f"rank{rank}.json").read_text())
               for rank in range(world_size)]
    steps = math.ceil(EPOCH / world_size) if uneven == "pad" else EPOCH // world_size
    for result in results:
        assert result["len"] == steps
        assert [len(ids) for ids in result["epochs"]] == [steps] * EPOCHS
    for epoch in range(EPOCHS):
        counts = Counter(i for result in results for i in result["epochs"][epoch])
        if uneven == "pad":
            assert set(counts) == set(range(EPOCH))
            assert sum(counts.values()) - EPOCH == world_size * steps - EPOCH
        else:
            assert len(counts) == sum(counts.values()) == world_size * (EPOCH // world_size)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_gloo_ranks_take_equal_steps_and_cover_each_epoch(tmp_path: Path) -> None:
    """Every case of CASES: 2 or 3 ranks, 1 or 2 workers, padded or dropped remainders."""
    servers = [ranked_server(workers, uneven) for _, workers, uneven in CASES]
    try:
        endpoints = [(server.data_address, server.control_address) for server in servers]
        torch_mp.spawn(run_ranks, args=(endpoints, str(tmp_path)), nprocs=PROCESSES,
                       join=True)
        assert [server.join(timeout=30) for server in servers] == [0] * len(CASES)
    finally:
        for server in servers:
            server.stop()
    for case, (world_size, _, uneven) in enumerate(CASES):
        check_coverage(tmp_path / str(case), world_size, uneven)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torchrun_runs_the_ddp_example(tmp_path: Path) -> None:
    server = ranked_server(workers=1, uneven="pad")
    try:
        torchrun = Path(sys.executable).with_name("torchrun")
        done = subprocess.run(
            [str(torchrun), "--standalone", "--nproc_per_node", "2",
             str(ROOT / "examples" / "ddp_train.py"), "--address", server.data_address,
             "--control", server.control_address, "--epochs", str(EPOCHS),
             "--results", str(tmp_path)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
            text=True, timeout=100,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert server.join(timeout=30) == 0
    finally:
        server.stop()
    for rank in range(2):
        epochs = json.loads((tmp_path / f"rank{rank}.json").read_text())
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"len": EPOCH // 2,
                                                               "epochs": epochs}))
    check_coverage(tmp_path, 2, "pad")


# -- bad input: the newcomer gets a clear error, the established ranks go on ----------------
@pytest.fixture
def waiting_server() -> Iterator[Server]:
    # Long epochs: the ranks stop reading while the newcomer tries, and a welcome per tiny
    # epoch would fill their control queues (then the server drops those connections).
    server = Server(SAMPLER, factory_kwargs={"streams": 2, "per_stream": 50_000},
                    bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0", rank_timeout=60)
    server.start()
    yield server
    server.stop()


def first_sample(server: Server, **ranking: int) -> object:
    with RemoteLoader(server.data_address, control=server.control_address, timeout=10,
                      **ranking) as loader:
        return next(loader)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("ranking", "message"), [
    ({"rank": 1, "world_size": 3}, r"expected world_size 2 \(the ranks already connected\), "
                                   r"got world_size 3 from rank 1"),
    ({"rank": 0, "world_size": 2}, "rank 0 is held by live trainer .*, got rank 0 again"),
    ({}, "deals to 2 ranked trainers: .* got a free trainer"),
])
def test_a_bad_newcomer_gets_a_clear_error_and_the_ranks_go_on(
    waiting_server: Server, ranking: dict[str, int], message: str
) -> None:
    server = waiting_server
    with RemoteLoader(server.data_address, control=server.control_address, timeout=20, rank=0,
                      world_size=2) as rank0, \
            RemoteLoader(server.data_address, control=server.control_address, timeout=20,
                         rank=1, world_size=2) as rank1:
        # Both ask for the size (no size is declared, so TypeError), then both take a
        # sample (together: the server deals once both said hello), so both are
        # established before the newcomer comes.
        for loader in (rank0, rank1):
            with pytest.raises(TypeError):
                len(loader)
        first = CheckedThread(next, rank0)
        next(rank1)
        first.join(timeout=20)
        with pytest.raises(RemoteError, match=message):
            first_sample(server, **ranking)
        assert [next(rank0) is not None, next(rank1) is not None] == [True, True]


@pytest.mark.timeout(60)
def test_a_rank_that_never_comes_fails_the_run_clearly(tmp_path: Path) -> None:
    server = Server(SAMPLER, bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0",
                    rank_timeout=1.0).start()
    try:
        with pytest.raises(RemoteError, match=r"rank\(s\) \[1\] of 2 never connected within the "
                                              r"rank timeout of 1 s"):
            first_sample(server, rank=0, world_size=2)
        assert server.join(timeout=20) == 1
    finally:
        server.stop()


def test_a_rank_outside_the_world_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match=r"expected rank an int in \[0, 2\) for world_size 2, "
                                         r"got 2"):
        RemoteLoader("tcp://127.0.0.1:1", rank=2, world_size=2)

