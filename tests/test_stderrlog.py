"""Log lines to a pipe nobody reads: the writer never blocks, loses count of nothing."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from feedmux._stderrlog import NonBlockingStderrHandler, flush_logs

pytestmark = pytest.mark.timeout(60)

LINE = "x" * 99  # 100 bytes a line with its newline


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    for fd in (read, write):
        try:
            os.close(fd)
        except OSError:
            pass


def logger_with(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"test.stderrlog.{id(handler)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers[:] = [handler]
    return logger


def read_all(fd: int) -> str:
    """What the pipe holds now (its write end stays open: read without blocking)."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


class Reader:
    """Reads a pipe to its end on a thread of its own."""

    def __init__(self, fd: int) -> None:
        self.chunks: list[bytes] = []
        self.fd = fd
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while chunk := os.read(self.fd, 1 << 16):
            self.chunks.append(chunk)

    def text(self, timeout: float) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the pipe never ended"
        return b"".join(self.chunks).decode()


def test_lines_past_what_the_pipe_and_the_buffer_hold_are_dropped_and_counted(
        pipe: tuple[int, int]) -> None:
    read, write = pipe
    handler = NonBlockingStderrHandler(write, max_pending=64 << 10)
    logger = logger_with(handler)
    emitted = 5000  # 500 KB: the pipe's 64 KiB, the buffer's 64 KiB, the rest dropped

    def log_all() -> None:
        for number in range(emitted):
            logger.info("%s %d", LINE, number)

    writer = threading.Thread(target=log_all, daemon=True)
    writer.start()
    writer.join(20)
    assert not writer.is_alive(), "a log call blocked on a pipe nobody reads"
    assert handler.dropped > 0
    received = Reader(read)  # the reader is back
    handler.flush()  # the held lines go (within its wait: the reader reads on)
    logger.info("after")  # the count of the dropped lines, then this one
    handler.close()  # writes what it holds (the reader reads on), closes its descriptor
    os.close(write)
    lines = received.text(timeout=10).splitlines()
    assert lines[-1] == "after"
    notices = [line for line in lines if "log lines dropped" in line]
    assert len(notices) == 1
    dropped = int(notices[0].split()[1])
    numbers = [int(line.split()[1]) for line in lines if line.startswith(LINE)]
    # In order, each at most once; what is missing is what was counted.
    assert numbers == sorted(set(numbers))
    assert len(numbers) + dropped == emitted
    assert notices[0] == f"feedmux: {dropped} log lines dropped: stderr was not read"


def test_the_callers_pipe_stays_blocking(pipe: tuple[int, int]) -> None:
    # The non-blocking writes go through a description of the pipe of the handler's
    # own: whoever else writes to it (a shell, the program that started us) is untouched.
    read, write = pipe
    handler = NonBlockingStderrHandler(write)
    logger = logger_with(handler)
    logger.info("hello")
    assert read_all(read) == "hello\n"
    assert not fcntl.fcntl(write, fcntl.F_GETFL) & os.O_NONBLOCK
    handler.close()


def test_a_flush_waits_for_a_slow_reader_within_its_bound(pipe: tuple[int, int]) -> None:
    read, write = pipe
    handler = NonBlockingStderrHandler(write, flush_wait=10.0)
    logger = logger_with(handler)
    for number in range(1000):  # 100 KB: more than the pipe holds
        logger.info("%s %d", LINE, number)
    received: list[bytes] = []

    def reader() -> None:
        while sum(map(len, received)) < 100 * 1000 + 3 * 1000:
            received.append(os.read(read, 1 << 16))

    reading = threading.Thread(target=reader, daemon=True)
    reading.start()
    flush_logs()  # every handler of the process: this one's lines all go within its wait
    reading.join(10)
    text = b"".join(received).decode()
    assert [int(line.split()[1]) for line in text.splitlines()] == list(range(1000))
    handler.close()


def test_a_flush_gives_up_on_a_reader_that_never_comes(pipe: tuple[int, int]) -> None:
    _, write = pipe
    handler = NonBlockingStderrHandler(write, flush_wait=0.2)
    logger = logger_with(handler)
    for number in range(1000):
        logger.info("%s %d", LINE, number)
    done = threading.Event()
    threading.Thread(target=lambda: (handler.flush(), done.set()), daemon=True).start()
    assert done.wait(10), "a flush waited for ever on a pipe nobody reads"
    handler.close()


def test_a_reader_that_closed_its_end_turns_the_handler_off(pipe: tuple[int, int]) -> None:
    read, write = pipe
    handler = NonBlockingStderrHandler(write)
    logger = logger_with(handler)
    os.close(read)
    logger.info("nobody reads this")  # EPIPE: no exception, no retry for ever
    logger.info("nor this")
    assert handler._gone
    handler.close()


def test_a_forked_child_writes_its_own_lines_not_its_parents_held_ones(
        pipe: tuple[int, int]) -> None:
    read, write = pipe
    handler = NonBlockingStderrHandler(write, flush_wait=0.0)
    logger = logger_with(handler)
    for number in range(1000):  # the pipe fills: the parent holds the rest
        logger.info("%s %d", LINE, number)
    held = bytes(handler._pending)
    assert held
    pid = os.fork()
    if pid == 0:  # the child: it held nothing of its parent's; its own line goes out
        try:
            code = 0 if not handler._pending else 3
            logger.info("child")
            handler.flush_wait = 10.0  # the parent reads on meanwhile
            flush_logs()
        finally:
            os._exit(code)
    text = ""
    deadline = time.monotonic() + 30
    while True:  # read until the child is gone and the pipe is empty
        text += read_all(read)
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            text += read_all(read)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child did not end within 30 s")
    assert os.waitstatus_to_exitcode(status) == 0
    handler.flush()
    text += read_all(read)
    lines = text.splitlines()
    assert lines.count("child") == 1
    numbers = [int(line.split()[1]) for line in lines if line.startswith(LINE)]
    assert sorted(numbers) == list(range(1000))  # the parent's held lines, once
    handler.close()
