"""torch's DataLoader over real servers: RemoteDataset with 0 and 2 workers, free and ranked
(2 ranks under gloo, real processes), a plain RemoteLoader under a DataLoader, forks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402

from feedmux.client.remote import RemoteLoader  # noqa: E402
from feedmux.torch import RemoteDataset  # noqa: E402
from tests.integration.conftest import ROOT, CheckedThread, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SAMPLER = "tests.integration.samplers"
#: numbered(): 4 streams of 50 samples, ids 0..199, once each per epoch.
IDS = 200


def ids_of(samples: list[Any]) -> list[int]:
    return [int(sample["id"]) for sample in samples]


def joined(parts: list[list[int]]) -> list[int]:
    return [i for part in parts for i in part]


def trainers_connected(stderr: str) -> set[str]:
    return set(re.findall(r"trainer (\S+) connected", stderr))


@pytest.mark.parametrize("workers", [0, 2])
def test_free_dataloader_passes_are_exact_epochs(serve: Any, workers: int) -> None:
    server = serve(f"{SAMPLER}:numbered", "--epochs", "2", "--min-trainers", str(max(1, workers)))
    dataset = RemoteDataset(server.data, control=server.control, timeout=30)
    loader = DataLoader(dataset, batch_size=None, num_workers=workers,
                        persistent_workers=workers > 0)
    passes = [list(loader) for _ in range(2)]
    for samples in passes:
        assert sorted(ids_of(samples)) == list(range(IDS))  # every sample once, no other
        assert all(isinstance(sample["x"], torch.Tensor) for sample in samples)
        assert all(sample["x"].dtype == torch.float32 for sample in samples)
    assert list(loader) == []  # the stream has ended after the server's 2 epochs
    server.wait(timeout=30)
    # every worker was a trainer of its own (the main process alone with no workers)
    assert len(trainers_connected(server.stderr)) == max(1, workers)
    assert "unconfirmed" not in server.stderr


@pytest.mark.parametrize("epochs", [2, 3])
def test_default_workers_made_again_each_pass_get_every_epoch_exactly_once(
    serve: Any, epochs: int
) -> None:
    # torch's default: the workers are made again for every pass (not persistent). A pass's
    # workers end their iter_epoch() at the first sample of the next epoch, with more of it
    # queued: they took the next epoch into their queues and exited. It came to nobody
    # (plain delivery: pass 2 was empty and the server never ended); now what a worker
    # received and did not hand out goes back (its goodbye at the worker's exit) for the
    # next pass's workers, in the order of the samples and shared among them: all of it went
    # to whichever connected first, and the in-order DataLoader waited on the other worker,
    # which had none of the epoch (with 3 epochs the stream is sent whole in the first pass).
    server = serve(f"{SAMPLER}:numbered", "--arg", "streams=3", "--arg", "per_stream=20",
                   "--epochs", str(epochs), "--min-trainers", "2")
    dataset = RemoteDataset(server.data, control=server.control, timeout=30)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for epoch in range(1, epochs + 1):
        assert sorted(ids_of(list(loader))) == list(range(60)), f"pass {epoch}"
    assert server.wait(timeout=60) == 0


def test_server_stacked_batches_pass_through_as_tensors(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--epochs", "1", "--min-trainers", "2")
    dataset = RemoteDataset(server.data, control=server.control, timeout=30, batch_size=8)
    batches = list(DataLoader(dataset, batch_size=None, num_workers=2))
    assert all(batch["x"].shape == (8, 4) and batch["x"].dtype == torch.float32
               for batch in batches)
    assert sorted(int(i) for batch in batches for i in batch["id"]) == list(range(IDS))


def test_a_worker_that_gets_nothing_does_not_stall_the_end(serve: Any, tmp_path: Path) -> None:
    """Worker 1 connects after the server sent its whole stream to worker 0: its end of
    stream must come at once. Before, it waited for the drain of worker 0, which waited
    for the in-order DataLoader, which waited for worker 1: the server gave up after
    ~13 s ("1 trainer(s) went away") or libzmq aborted worker 0 (its control queue full
    of drain questions)."""
    go = tmp_path / "go"
    # Four messages: the whole epoch fits in worker 0's credit.
    server = serve(f"{SAMPLER}:numbered", "--epochs", "1", "--arg", "per_stream=5",
                   "--samples-per-message", "5")
    dataset = LateSecondWorker(server.data, server.control, str(go))
    running = CheckedThread(lambda: ids_of(list(DataLoader(dataset, batch_size=None,
                                                           num_workers=2))))
    server.wait_for_stderr(lambda text: "epoch 1 sampled" in text, 60, "the whole epoch sent")
    go.touch()  # only now may worker 1 connect: nothing is left for it
    assert sorted(running.join(timeout=60)) == list(range(20))
    server.wait(timeout=30)
    assert "unconfirmed" not in server.stderr and "went away" not in server.stderr
    assert len(trainers_connected(server.stderr)) == 2


class LateSecondWorker(IterableDataset):  # type: ignore[type-arg]
    """Loaders made in each worker; worker 1 makes its own once ``go`` exists."""

    def __init__(self, data: str, control: str, go: str) -> None:
        self.data, self.control, self.go = data, control, go

    def __iter__(self) -> Any:
        info = get_worker_info()
        if info is not None and info.id == 1:
            wait_until(lambda: os.path.exists(self.go), 60, "the test's go")
        with RemoteLoader(self.data, control=self.control, timeout=60) as loader:
            yield from loader


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_remote_loader_under_a_dataloader(serve: Any, workers: int) -> None:
    server = serve(f"{SAMPLER}:numbered", "--epochs", "1", "--min-trainers", str(max(1, workers)))
    remote = RemoteLoader(server.data, control=server.control, timeout=30)
    batches = list(DataLoader(remote, batch_size=4, num_workers=workers))  # iterated, not indexed
    ids = [int(i) for batch in batches for i in batch["id"]]
    assert sorted(ids) == list(range(IDS))
    server.wait(timeout=30)
    # each worker a forked copy with a client id of its own (before: one id, one starved)
    assert len(trainers_connected(server.stderr)) == max(1, workers)


def test_a_forked_loader_takes_a_fresh_client_id_and_sockets(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered")  # endless: the parent's queue never holds it all
    loader = RemoteLoader(server.data, control=server.control, timeout=30, with_meta=True)
    first = next(loader)[0]  # the parent is connected and has received
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: iterate the copy, report, exit without running pytest's teardown
        code, report = 1, {}
        try:
            os.close(read)
            meta, _ = next(loader)
            report = {"client_id": loader.client_id, "epoch": meta.epoch}
            loader.close()
            code = 0
        except BaseException as error:  # reported to the parent, which fails the test
            report = {"error": repr(error)}
        finally:
            os.write(write, json.dumps(report).encode())
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, child
    assert child["client_id"] != loader.client_id and child["epoch"] >= 1
    # the parent's own sockets still work after the fork
    assert next(loader)[0].epoch >= first.epoch
    loader.close()
    assert len(trainers_connected(server.stderr)) == 2


def test_pin_memory_works_on_this_build(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--epochs", "1")
    dataset = RemoteDataset(server.data, control=server.control, timeout=30)
    # A CPU-only build warns that nothing is pinned, and goes on with pageable memory.
    cpu_only = not torch.cuda.is_available()
    with pytest.warns(UserWarning, match="pin") if cpu_only else contextlib.nullcontext():
        samples = list(DataLoader(dataset, batch_size=None, pin_memory=True))
    assert sorted(ids_of(samples)) == list(range(IDS))
    assert all(sample["x"].is_pinned() == torch.cuda.is_available() for sample in samples)



# -- ranked: two real processes under torch.distributed (gloo) ------------------------------

def run_ranks(server: Any, tmp_path: Path, workers: int, *extra: str) -> list[dict[str, Any]]:
    """Two rank processes (tests/integration/torch_ranks.py); their reports."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tmp_path.mkdir(parents=True, exist_ok=True)
    processes = [
        subprocess.Popen([sys.executable, "-m", "tests.integration.torch_ranks", server.data,
                          server.control, str(rank), "2", str(workers),
                          str(tmp_path / f"rank{rank}.json"), str(tmp_path / "rendezvous"),
                          *extra], env=env, cwd=ROOT, stderr=subprocess.PIPE)
        for rank in range(2)]
    try:
        for process in processes:
            try:
                _, stderr = process.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate(timeout=10)
            assert process.returncode == 0, stderr.decode(errors="replace")[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ranked_dataloader_workers_keep_the_ranks_order_equal_steps_and_resume(
        serve: Any, tmp_path: Path) -> None:
    """2 ranks under gloo, each with no DataLoader worker, then with 2: with workers each
    rank gets the samples, in the order, that it gets with none (the same seeded server
    run), every sample once per epoch across the ranks, equal steps (each step an
    all_reduce). The run with workers checkpoints after 30 steps (from the samples the
    training loop was handed) and resumes on a fresh server with fresh workers: the
    rest of each rank's sequence, exactly."""
    first, fresh = serve(f"{SAMPLER}:numbered", "--epochs", "2"), serve(
        f"{SAMPLER}:numbered", "--epochs", "2")
    (tmp_path / "alone").mkdir()
    # One pair of rank processes does both runs: first with no worker, then with 2.
    workers = run_ranks(serve(f"{SAMPLER}:numbered", "--epochs", "2"), tmp_path / "workers", 2,
                        "--stop-after", "30", "--resume-on", fresh.data, fresh.control,
                        "--first-alone", first.data, first.control,
                        str(tmp_path / "alone" / "rank{rank}.json"))
    alone = [json.loads((tmp_path / "alone" / f"rank{rank}.json").read_text())
             for rank in range(2)]
    for epoch in range(2):
        per_rank = [rank["epochs"][epoch] for rank in alone]
        assert len(per_rank[0]) == len(per_rank[1]) == IDS // 2
        assert sorted(per_rank[0] + per_rank[1]) == list(range(IDS))
    assert all(rank["steps"] == [IDS // 2, IDS // 2] for rank in alone)
    for rank in range(2):
        assert workers[rank]["steps"] == [30, IDS // 2 - 30, IDS // 2]
        assert [len(ids) for ids in workers[rank]["epochs"]] == [30, IDS // 2 - 30, IDS // 2]
        assert joined(workers[rank]["epochs"]) == joined(alone[rank]["epochs"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_lightning_example_trains_two_exact_epochs(serve: Any, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    server = serve(f"{SAMPLER}:numbered", "--epochs", "2", "--min-trainers", "2")
    results = tmp_path / "seen.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "lightning_train.py"), "--address",
         server.data, "--control", server.control, "--epochs", "2", "--workers", "2",
         "--key", "x", "--results", str(results)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True,
        timeout=240)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    seen = json.loads(results.read_text())
    assert [sorted(epoch) for epoch in seen] == [list(range(IDS))] * 2
    server.wait(timeout=30)
    assert len(trainers_connected(server.stderr)) == 2  # the two persistent workers
