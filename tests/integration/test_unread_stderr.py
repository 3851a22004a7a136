"""A server whose stderr nobody reads serves on: its log lines never block it.

A server logs a line per epoch on the thread that serves data and control. Started
by a program that pipes its stderr and never reads it (a pipe holds 64 KiB), it
used to block in a log write after about 870 short epochs, and every trainer with
it. Now a line that cannot go is held (up to 1 MiB), then dropped and counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from feedmux import RemoteLoader
from tests.integration.conftest import ROOT, Endpoints, kill_remaining

pytestmark = pytest.mark.timeout(180)

EPOCHS = 3000  # a line each, about 80 bytes: about 4 pipes' worth


@pytest.mark.parametrize("workers", [1, 2])
def test_a_server_whose_stderr_is_never_read_serves_every_epoch(tmp_path: Path,
                                                                workers: int) -> None:
    endpoints = Endpoints.ipc(tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "feedmux", "serve", "tests.integration.samplers:numbered",
         "--arg", "streams=2", "--arg", "per_stream=1", "--epochs", str(EPOCHS),
         "--workers", str(workers), *endpoints.args()],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # stderr: never read
    try:
        epochs: dict[int, list[int]] = {}
        with RemoteLoader(endpoints.data, control=endpoints.control, timeout=30,
                          with_meta=True) as loader:
            for meta, sample in loader:
                epochs.setdefault(meta.epoch, []).append(int(sample["id"]))
        assert sorted(epochs) == list(range(1, EPOCHS + 1))
        assert all(sorted(ids) == [0, 1] for ids in epochs.values())
        # It ends on its own too: at exit it gives what it holds a bounded wait.
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining([server])
        assert server.stderr is not None
        server.stderr.close()
