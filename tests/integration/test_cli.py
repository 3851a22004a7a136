"""The real ``feedmux`` console script, run from a user's folder as the README says."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from feedmux import RemoteLoader
from feedmux.errors import RemoteError
from tests.integration.conftest import Spawned
from tests.integration.test_start import user_folder

FEEDMUX = str(Path(sys.executable).with_name("feedmux"))


@pytest.fixture
def feedmux(tmp_path: Path) -> Iterator[Callable[..., Spawned]]:
    """Run ``feedmux ARGS...`` in a folder holding ``mydata.py``; every process killed after."""
    env = user_folder(tmp_path)
    started: list[Spawned] = []

    def run(*args: str) -> Spawned:
        process = subprocess.Popen([FEEDMUX, *args], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(Spawned(process))
        return started[-1]

    yield run
    for spawned in started:
        spawned.kill()
        spawned.wait(10)


def test_serve_imports_a_module_from_the_current_folder(feedmux: Callable[..., Spawned]) -> None:
    # Before: "cannot import module 'mydata'" (the console script's folder was on the path,
    # not the current one).
    server = feedmux("serve", "mydata:make_mux", "--epochs", "1", "--bind", "tcp://127.0.0.1:0")
    with RemoteLoader(server.data, control=server.control, timeout=30) as loader:
        assert sorted(int(sample["i"]) for sample in loader) == list(range(10))
    assert server.wait(30) == 0
    assert "exits with code 0: the stream ended after 1 epoch(s)" in server.stderr


def test_an_import_error_says_where_it_looked(feedmux: Callable[..., Spawned],
                                              tmp_path: Path) -> None:
    server = feedmux("serve", "mydatta:make_mux")
    assert server.wait(30) == 2
    assert "cannot import module 'mydatta'" in server.stderr
    assert f"looked in {tmp_path}, " in server.stderr
    assert f"the current directory is {tmp_path}" in server.stderr


def test_a_factory_that_raises_has_its_traceback_logged(feedmux: Callable[..., Spawned]) -> None:
    server = feedmux("serve", "mydata:broken")
    assert server.wait(30) == 2
    error_line = next(line for line in server.stderr.splitlines() if " ERROR " in line)
    assert "factory 'mydata:broken' raised RuntimeError: no files in /data" in error_line
    # Before: the one line only. Now the traceback follows, down to the user's line.
    assert "Traceback (most recent call last)" in server.stderr
    assert 'mydata.py", line' in server.stderr and "in broken" in server.stderr


def test_a_rank_timeout_exit_says_why(feedmux: Callable[..., Spawned]) -> None:
    server = feedmux("serve", "mydata:make_mux", "--rank-timeout", "1",
                     "--bind", "tcp://127.0.0.1:0")
    with RemoteLoader(server.data, control=server.control, rank=0, world_size=2,
                      timeout=30) as loader, pytest.raises(RemoteError, match="never connected"):
        next(loader)
    assert server.wait(30) == 1
    # Before: exit 1 and not a word of why in the server's log.
    assert ("exits with code 1: TransportTimeoutError: rank(s) [1] of 2 never connected "
            "within the rank timeout of 1 s") in server.stderr


@pytest.mark.parametrize("command", ["stats", "ping"])
def test_the_data_port_given_to_stats_is_named(feedmux: Callable[..., Spawned],
                                               command: str, tmp_path: Path) -> None:
    # The control endpoint derived from the data one, as tcp://HOST:5555 gives :5556 (a
    # port a test may not choose): ipc://PATH gives ipc://PATH.control.
    server = feedmux("serve", "mydata:make_mux", "--bind", f"ipc://{tmp_path}/data")
    assert server.control == f"ipc://{tmp_path}/data.control"
    asked = feedmux(command, server.data, "--timeout", "1")
    assert asked.wait(30) == 1
    # Before: only "no answer from ... within 1 s".
    assert (f"{server.data} is the data endpoint of server " in asked.stderr
            and f"its control endpoint is {server.control}" in asked.stderr)
    assert "Traceback" not in asked.stderr


def test_top_into_a_closed_pipe_ends_quietly(feedmux: Callable[..., Spawned],
                                             tmp_path: Path) -> None:
    server = feedmux("serve", "mydata:make_mux", "--bind", "tcp://127.0.0.1:0")
    errors = tmp_path / "top.err"
    done = subprocess.run(
        ["sh", "-c", f'"{FEEDMUX}" top {server.control} --interval 0.1 2>"{errors}" | head -1'],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("feedmux top: ")
    # Before: a BrokenPipeError traceback.
    assert errors.read_text() == ""
