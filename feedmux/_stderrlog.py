"""Log lines to stderr that never stop the process writing them.

A server logs on the thread that serves data and control. With a plain blocking
write, a stderr that nobody reads (a pipe whose reader is busy, stopped, or
never reads: 64 KiB of lines fill it) would stop delivery to every trainer and
leave the control socket unanswered. This module owns how feedmux's own
processes (``feedmux serve``, a started server and its sampling workers) write
to stderr: never blocking. A line that cannot go now waits in a bounded buffer
and goes with the next line or at exit; lines beyond the buffer are dropped and
counted, and the count is written once the reader is back. It must never raise
out of a logging call, and never changes the flags of a file description it
shares with another program (the terminal, the pipe of whoever started us).

Only pipes and sockets are written without blocking: a regular file never
blocks for long, and a terminal only when its user paused it (Ctrl-S), which
is the pause they asked for.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import time
import weakref

__all__ = ["LOG_FORMAT", "NonBlockingStderrHandler", "flush_logs", "install", "write_stderr"]

#: The format of every log line feedmux writes itself.
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

#: Bytes held while stderr's reader is behind; lines beyond them are dropped and counted.
MAX_PENDING = 1 << 20
#: Seconds a flush (at exit) waits for a slow reader before it gives the lines up.
FLUSH_WAIT = 2.0
#: The largest write to a pipe that is all or nothing (POSIX's PIPE_BUF, 4096 on Linux).
ATOMIC_WRITE = 4096

_handlers: weakref.WeakSet[NonBlockingStderrHandler] = weakref.WeakSet()
#: (fd, device, inode) -> a non-blocking descriptor of that pipe. A forked child shares
#: it: the same description, and every process of ours wants it non-blocking.
_writers: dict[tuple[int, int, int], int] = {}


def _writer(fd: int) -> tuple[int, bool] | None:
    """A descriptor that writes where ``fd`` does, and whether a write to it may block
    (a pipe or a socket), or None when ``fd`` is closed.

    For a pipe, a new open file description of it (``/proc/self/fd``) with
    ``O_NONBLOCK``: the caller's own, so that the flag reaches no other program. A
    socket (or a pipe where ``/proc`` cannot reopen it) is written only when ``poll``
    says it takes a write; a file or a terminal is ``fd``, written as it is.
    """
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    if stat.S_ISSOCK(status.st_mode):
        return fd, True
    if not stat.S_ISFIFO(status.st_mode):
        return fd, False
    key = (fd, status.st_dev, status.st_ino)
    if key not in _writers:
        try:
            _writers[key] = os.open(f"/proc/self/fd/{fd}",
                                    os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            _writers[key] = fd
    return _writers[key], True


def _write(fd: int, data: bytes | bytearray, wait: float, may_block: bool) -> int:
    """Bytes of ``data`` written to ``fd`` within ``wait`` seconds (0: what goes without
    waiting); -1 when ``fd`` is gone (its reader closed it, or it was closed)."""
    if not may_block:
        try:
            return os.write(fd, data)
        except OSError:
            return -1
    written = 0
    deadline = time.monotonic() + wait
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while written < len(data):
        left = max(0.0, deadline - time.monotonic())
        try:
            if not poller.poll(int(left * 1000)):
                return written
            written += os.write(fd, data[written:written + ATOMIC_WRITE])
        except BlockingIOError:
            if left <= 0:
                return written
        except InterruptedError:
            continue
        except OSError:
            return -1
    return written


def write_stderr(text: str) -> None:
    """Write ``text`` to stderr now if the reader takes it, else drop it (it takes no
    lock: a signal handler may call it while a log line is being written)."""
    writer = _writer(2)
    if writer is not None:
        _write(writer[0], text.encode("utf-8", "replace"), 0.0, writer[1])


class NonBlockingStderrHandler(logging.Handler):
    """A logging handler for stderr whose ``emit`` never blocks.

    Parameters
    ----------
    fd
        The descriptor to write to (stderr by default).
    max_pending
        Bytes of lines held while the reader is behind; lines beyond are dropped,
        and how many is written before the next line that fits.
    flush_wait
        Seconds :meth:`flush` (called at exit) waits for a slow reader.

    Examples
    --------
    >>> import logging, os
    >>> read, write = os.pipe()
    >>> handler = NonBlockingStderrHandler(write, max_pending=100)
    >>> logger = logging.getLogger("doctest.stderrlog")
    >>> logger.addHandler(handler)
    >>> logger.warning("hello")
    >>> os.read(read, 100)
    b'hello\\n'
    >>> logger.removeHandler(handler); handler.close(); os.close(read); os.close(write)
    """

    def __init__(self, fd: int = 2, *, max_pending: int = MAX_PENDING,
                 flush_wait: float = FLUSH_WAIT) -> None:
        super().__init__()
        self.fd = fd
        self.max_pending = max_pending
        self.flush_wait = flush_wait
        self.dropped = 0  # lines dropped since the last that went out
        self._pending = bytearray()
        self._gone = False  # the reader closed its end: nothing more is written
        _handlers.add(self)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8", "replace")
        except Exception:
            self.handleError(record)
            return
        if self._gone:
            return
        self._drain(0.0)  # a reader that is back makes room first
        if self.dropped:
            notice = (f"feedmux: {self.dropped} log lines dropped: stderr was not read\n"
                      ).encode()
            if len(self._pending) + len(notice) + len(line) <= self.max_pending:
                self._pending += notice
                self.dropped = 0
        if self.dropped or len(self._pending) + len(line) > self.max_pending:
            self.dropped += 1
        else:
            self._pending += line
        self._drain(0.0)

    def flush(self) -> None:
        self.acquire()
        try:
            self._drain(self.flush_wait)
        finally:
            self.release()

    def _drain(self, wait: float) -> None:
        if not self._pending or self._gone:
            return
        writer = _writer(self.fd)
        written = -1 if writer is None else _write(writer[0], self._pending, wait, writer[1])
        if written < 0:
            self._gone = True
            self._pending.clear()
        else:
            del self._pending[:written]

    def close(self) -> None:
        """Write what is held (within ``flush_wait``), then close this handler's
        non-blocking descriptor of its pipe (the reader sees the end once every other
        writer is gone too)."""
        self.flush()
        for key in [key for key in _writers if key[0] == self.fd]:
            writer = _writers.pop(key)
            if writer != self.fd:
                os.close(writer)
        super().close()

    def _after_fork(self) -> None:
        # The parent writes what it held; a forked child starts with nothing to write.
        self._pending.clear()
        self.dropped = 0


def _after_fork_in_child() -> None:
    for handler in list(_handlers):
        handler._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def install(level: int | str | None = None) -> None:
    """Log to stderr through a :class:`NonBlockingStderrHandler` (``logging.basicConfig``
    with it: a root logger that has handlers already is left as it is)."""
    logging.basicConfig(format=LOG_FORMAT, level=level,
                        handlers=[NonBlockingStderrHandler()])


def flush_logs() -> None:
    """Write what this process's handlers hold, each waiting at most its ``flush_wait``
    (a forked worker ends with ``os._exit``, which runs no exit handlers)."""
    for handler in list(_handlers):
        handler.flush()
