"""Real server processes for the integration tests, and the waits and threads they use.

This module owns how a test starts ``python -m feedmux ...`` (every process, and its
children, killed by pid afterwards), where a server binds (port 0 on 127.0.0.1, or
ipc paths in the test's temporary folder) and how the test learns the endpoints it
got: from the server's start line on stderr, read with a bounded wait. It also owns
the test's waits (a condition polled until a deadline), its threads (joined with
a timeout, their exception re-raised) and what a loader's first sample raised. It
must never pick a port by binding and releasing it (another process may take the
port in between), never sleep to synchronise, and never wait without a bound.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from feedmux.errors import FeedmuxError

if TYPE_CHECKING:
    from feedmux import RemoteLoader

ROOT = Path(__file__).resolve().parents[2]

#: Seconds a server may take to bind and log its start line (a loaded machine is slow).
START_TIMEOUT = 30.0

# The server's documented start line (docs/server.md) names the bound endpoints.
_START_LINE = re.compile(r"serving .*?: data (\S+), control (\S+),")


@dataclass(frozen=True)
class Endpoints:
    """A data and a control endpoint, as given to ``feedmux serve``."""

    data: str
    control: str

    @classmethod
    def any_port(cls) -> Endpoints:
        """Port 0 on loopback: the system picks free ports when the server binds."""
        return cls("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")

    @classmethod
    def ipc(cls, folder: Path) -> Endpoints:
        """ipc paths in ``folder``: stable across a restart, private to the test."""
        return cls(f"ipc://{folder}/data", f"ipc://{folder}/control")

    def args(self) -> list[str]:
        return ["--bind", self.data, "--control", self.control]


class Spawned:
    """A ``python -m feedmux ...`` process whose output is read as it comes, never blocking.

    A thread per pipe reads it to its end whether or not the test is looking: a pipe
    holds 64 KiB, and a process whose pipe nobody reads blocks in its next write (a
    server logging a line per epoch stopped serving after 864 short epochs while the
    test waited on a trainer). Waits for a line are bounded and notice a process that
    dies (its stderr goes into the failure).
    """

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None and process.stderr is not None
        self.process = process
        self._output = {"stdout": bytearray(), "stderr": bytearray()}
        self._open = set(self._output)
        self._written = threading.Condition()
        self._readers = [
            threading.Thread(target=self._drain, args=(name, pipe.fileno()), daemon=True,
                             name=f"spawned-{process.pid}-{name}")
            for name, pipe in (("stdout", process.stdout), ("stderr", process.stderr))]
        for reader in self._readers:
            reader.start()
        self._endpoints: Endpoints | None = None

    def _drain(self, name: str, fd: int) -> None:
        """Read one pipe to its end (the process and its children all gone)."""
        while chunk := os.read(fd, 1 << 16):
            with self._written:
                self._output[name] += chunk
                self._written.notify_all()
        with self._written:
            self._open.discard(name)
            self._written.notify_all()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    @property
    def stdout(self) -> str:
        """What the process wrote on stdout so far."""
        with self._written:
            return self._output["stdout"].decode(errors="replace")

    @property
    def stderr(self) -> str:
        """What the process wrote on stderr so far."""
        with self._written:
            return self._output["stderr"].decode(errors="replace")

    def _wait_for(self, name: str, condition: Callable[[str], bool], timeout: float,
                  what: str) -> str:
        deadline = time.monotonic() + timeout
        with self._written:
            while not condition(text := self._output[name].decode(errors="replace")):
                if name not in self._open:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                                         f"stderr:\n{self.stderr}")
                self._written.wait(remaining)
            else:
                return text
        raise AssertionError(f"the process exited (code {self.process.wait(10)}) "
                             f"before {what}; stderr:\n{self.stderr}")

    def wait_for_stderr(self, condition: Callable[[str], bool], timeout: float,
                        what: str) -> str:
        """Wait until ``condition(stderr)`` holds; fail after ``timeout`` s or at exit."""
        return self._wait_for("stderr", condition, timeout, what)

    def wait_for_stdout(self, condition: Callable[[str], bool], timeout: float,
                        what: str) -> str:
        """Wait until ``condition(stdout)`` holds; fail after ``timeout`` s or at exit."""
        return self._wait_for("stdout", condition, timeout, what)

    def endpoints(self, timeout: float = START_TIMEOUT) -> Endpoints:
        """The endpoints a ``feedmux serve`` process bound, from its start line."""
        if self._endpoints is None:
            text = self.wait_for_stderr(lambda text: _START_LINE.search(text) is not None,
                                        timeout, "the server's start line")
            match = _START_LINE.search(text)
            assert match is not None
            self._endpoints = Endpoints(match[1], match[2])
        return self._endpoints

    @property
    def data(self) -> str:
        return self.endpoints().data

    @property
    def control(self) -> str:
        return self.endpoints().control

    def wait(self, timeout: float) -> int:
        """Wait for the output's end and the exit code, all within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._written:
            while self._open and time.monotonic() < deadline:
                self._written.wait(deadline - time.monotonic())
        code = self.process.wait(max(0.0, deadline - time.monotonic()))
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        return code

    def kill(self) -> None:
        """SIGKILL the process and what runs under it (zygote, sampling workers), if still
        running."""
        if self.process.poll() is None:
            # The workers before their zygote, which kills them too when it ends (so one
            # may be gone by the time it is named here).
            for child in reversed(descendant_pids(self.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            self.process.kill()


def child_pids(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def descendant_pids(pid: int) -> list[int]:
    """Every process under ``pid``: its children, theirs, ... (from /proc)."""
    found, todo = [], [pid]
    while todo:
        for child in child_pids(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def process_name(pid: int) -> str:
    """``/proc/PID/comm`` ("" once the process is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def zygote_pid(server: int) -> int | None:
    """The server's zygote (the child named ``feedmux-zygote``), or None."""
    return next((pid for pid in child_pids(server) if process_name(pid) == "feedmux-zygote"),
                None)


def worker_pids(server: int) -> list[int]:
    """The server's sampling workers: the zygote's children that run (not zombies; named
    ``feedmux-wkr-N`` once they have started)."""
    zygote = zygote_pid(server)
    if zygote is None:
        return []
    return sorted(pid for pid in child_pids(zygote) if pid_alive(pid))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def spawn() -> Iterator[Callable[..., Spawned]]:
    """Start ``python -m feedmux ARGS...``; every process (and its children) is killed after."""
    started: list[Spawned] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(*args: str) -> Spawned:
        process = subprocess.Popen(
            [sys.executable, "-m", "feedmux", *args], env=env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        started.append(Spawned(process))
        return started[-1]

    yield start
    for spawned in started:
        spawned.kill()
        spawned.wait(timeout=10)


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    """In-process started ``feedmux.Server`` objects to stop after the test: append them."""
    running: list[Any] = []
    yield running
    for server in running:
        server.stop()


@pytest.fixture
def serve(spawn: Callable[..., Spawned]) -> Callable[..., Spawned]:
    """Start ``feedmux serve SOURCE ARGS...`` on port 0 (or ``endpoints=``); return it bound."""

    def start(source: str, *args: str, endpoints: Endpoints | None = None) -> Spawned:
        server = spawn("serve", source, *(endpoints or Endpoints.any_port()).args(), *args)
        server.endpoints()
        return server

    return start



def kill_remaining(processes: list[subprocess.Popen[Any]]) -> None:
    """SIGKILL and reap each of ``processes`` still running (a test's clean-up, bounded)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # the poll interval of a bounded wait, not a synchronisation


def holds_for(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition`` holds at every poll for ``seconds`` (False at its first miss)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not condition():
            return False
        time.sleep(0.05)  # the poll interval of an observation window
    return condition()


def first_error(loader: RemoteLoader) -> str:
    """What the loader's first sample raised ("no error" if it came); the loader closed
    (a rank refused, a trainer whose batches cannot be built)."""
    try:
        next(loader)
    except FeedmuxError as error:
        return str(error)
    finally:
        loader.close()
    return "no error"


class CheckedThread:
    """Run ``target(*args)`` in a thread; :meth:`join` re-raises what it raised.

    A thread that has not finished within the join timeout fails the test, so no
    thread is left behind unnoticed and no failure in one is lost.
    """

    def __init__(self, target: Callable[..., Any], *args: Any) -> None:
        self.result: Any = None
        self._error: BaseException | None = None
        self._target = target
        self._thread = threading.Thread(target=self._run, args=args, daemon=True,
                                        name=getattr(target, "__name__", "worker"))
        self._thread.start()

    def _run(self, *args: Any) -> None:
        try:
            self.result = self._target(*args)
        except BaseException as error:  # handed to join(), in the test's thread
            self._error = error

    def join(self, timeout: float) -> Any:
        """Wait up to ``timeout`` s; return the target's result or raise its exception."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"thread {self._thread.name} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self.result


def records(path: Path) -> list[tuple[int, int]]:
    return [(int(epoch), int(sample_id)) for epoch, sample_id in
            (line.split() for line in path.read_text().splitlines())]


def assert_each_epoch_once(rows: list[tuple[int, int]], size: int, stderr: str,
                           epochs: tuple[int, ...] = (1, 2)) -> None:
    """Every id of ``range(size)`` exactly once in each of ``epochs`` of ``rows``
    ``(epoch, id)``; else what was lost and what came twice, and the server's log."""
    for epoch in epochs:
        got = Counter(i for e, i in rows if e == epoch)
        assert got == Counter(range(size)), (
            f"epoch {epoch}: lost {sorted(set(range(size)) - set(got))[:30]}, twice "
            f"{sorted(i for i, n in got.items() if n > 1)[:20]}; the server said:\n"
            f"{stderr[-3000:]}")
