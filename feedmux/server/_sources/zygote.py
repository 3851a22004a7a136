"""The zygote: a single-threaded template process that forks the sampling workers on demand.

Forking a process that runs threads or a ZeroMQ context is unsafe (a lock held by
another thread stays held in the child forever, a context's I/O threads are not
copied), and a server has both once it serves. So the server forks one process
at start, before it creates either: the **zygote**, which holds a copy of what a
worker needs (the shards, the configuration, the shared memory made before the
fork) and does nothing but wait on a socket pair for requests. Asked to, it forks
a worker (``os.fork`` of a process with one thread and no context: safe), replies
with its pid, reaps its children and reports each one's exit status. The worker
creates its own sockets after the fork, as workers always did.

:class:`Zygote` is the server's side: :meth:`Zygote.fork` (bounded wait for the
reply), :meth:`Zygote.exits` (the exits reported, never blocking),
:meth:`Zygote.stop`. The zygote never makes a thread or a ZeroMQ context, never
imports zmq code paths that would, and never samples. When the server goes (its end of
the pair closes, however it ended), the zygote SIGKILLs the workers it forked
and exits. When the zygote dies on its own, the server is told by the closed
pair (:attr:`Zygote.gone`) and goes on with the workers it has; they no longer
have a parent that reaps them, so the server watches them by pid
(:func:`pid_alive`), and a worker tells whether its server still runs from a
pipe only the server holds open (:func:`server_alive`).

Processes are named for ``ps`` and ``top`` through ``/proc/self/comm`` (15
characters at most): ``feedmux-zygote`` and ``feedmux-wkr-N`` (N the worker's
seat).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from feedmux._stderrlog import flush_logs

__all__ = ["FORK_TIMEOUT", "ZYGOTE_NAME", "Zygote", "pid_alive", "set_process_name",
           "worker_name"]

log = logging.getLogger("feedmux.server")

#: The longest the server waits for the zygote's reply to a fork request.
FORK_TIMEOUT = 10.0
#: How long the zygote waits for the workers it killed to be reaped when it ends.
REAP_TIMEOUT = 5.0
#: ``comm`` of the zygote.
ZYGOTE_NAME = "feedmux-zygote"
#: One message on the pair: a kind, then two numbers (seat and generation; seat and
#: pid; pid and exit code).
_MESSAGE = struct.Struct("!cqq")
_FORK, _FORKED, _EXITED, _FAILED = b"F", b"P", b"E", b"X"

#: What runs in a forked worker: ``work(seat, generation, server_alive)``.
Work = Callable[[int, int, Callable[[], bool]], None]


def worker_name(seat: int) -> str:
    """The process name of the worker in ``seat`` (``/proc/PID/comm``: 15 characters).

    >>> worker_name(3)
    'feedmux-wkr-3'
    """
    return f"feedmux-wkr-{seat}"


def set_process_name(name: str) -> None:
    """Name this process for ``ps`` / ``top`` (``/proc/self/comm``; nothing elsewhere)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not os.path.isdir("/proc")  # /proc exists but had no entry: gone


def server_alive(lifeline: int, zygote: int) -> Callable[[], bool]:
    """In a worker: whether its server still runs. While the zygote is its parent, yes
    (the zygote kills its workers when the server goes); after that, while the server
    holds its end of the ``lifeline`` pipe open (closed by the kernel at its exit)."""

    def alive() -> bool:
        if os.getppid() == zygote:
            return True
        readable, _, _ = select.select([lifeline], [], [], 0)
        return not readable

    return alive


class Zygote:
    """The server's side of the zygote process.

    ``work(seat, generation, server_alive)`` is what a forked worker runs (in the
    worker, with what the zygote copied at :meth:`start`).
    """

    def __init__(self, work: Work) -> None:
        self._work = work
        self._process: multiprocessing.process.BaseProcess | None = None
        self._channel: socket.socket | None = None
        self._lifeline: int | None = None
        #: Exits reported and not yet taken: (pid, exit code as Process.exitcode gives it).
        self._exits: list[tuple[int, int]] = []
        #: Set once the pair closed without a stop: the zygote died on its own.
        self.gone = False

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Fork the zygote (call before this process makes a thread or a ZeroMQ context)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lifeline_read, lifeline_write = os.pipe()
        process = multiprocessing.get_context("fork").Process(
            target=_zygote_main, args=(theirs, ours, lifeline_read, lifeline_write, self._work),
            name=ZYGOTE_NAME, daemon=True)
        try:
            process.start()
        finally:
            theirs.close()
            os.close(lifeline_read)
        self._process, self._channel, self._lifeline = process, ours, lifeline_write

    def fileno(self) -> int:
        """The pair's descriptor, readable when the zygote reports (for a poller)."""
        assert self._channel is not None
        return self._channel.fileno()

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the zygote to report something."""
        if not self.gone and self._channel is not None:
            select.select([self._channel], [], [], timeout)

    def fork(self, seat: int, generation: int, timeout: float = FORK_TIMEOUT) -> int | None:
        """A new worker in ``seat`` (its ``generation``-th there); its pid, or None when
        the zygote is gone or did not answer within ``timeout`` s (it is then gone for
        this server)."""
        if self.gone or self._channel is None:
            return None
        try:
            self._channel.send(_MESSAGE.pack(_FORK, seat, generation))
        except OSError:
            self._lost()
            return None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            reply = self._receive(max(0.0, remaining)) if remaining > 0 else None
            if reply is None:
                if not self.gone:
                    log.error("the zygote (pid %s) did not answer a fork within %.0f s; "
                              "stopped it: no worker is started or replaced from now on",
                              self.pid, timeout)
                    self._kill_zygote()
                    self._lost()
                return None
            kind, first, second = reply
            if kind == _FORKED and first == seat:
                return second
            if kind == _FAILED:
                log.error("the zygote could not fork worker %d: %s", seat,
                          os.strerror(second))
                return None

    def exits(self) -> list[tuple[int, int]]:
        """The workers' exits reported since last asked, (pid, code): the code as
        ``Process.exitcode`` says it (negative: the signal). Never blocks."""
        while not self.gone and self._receive(0.0) is not None:
            pass  # _receive keeps the exits aside
        taken, self._exits = self._exits, []
        return taken

    def _receive(self, timeout: float) -> tuple[bytes, int, int] | None:
        """One message (exits kept aside and returned too), or None after ``timeout``."""
        channel = self._channel
        assert channel is not None
        readable, _, _ = select.select([channel], [], [], timeout)
        if not readable:
            return None
        try:
            data = channel.recv(_MESSAGE.size)
        except OSError:
            data = b""
        if len(data) != _MESSAGE.size:
            self._lost()
            return None
        kind, first, second = _MESSAGE.unpack(data)
        if kind == _EXITED:
            self._exits.append((first, second))
        return kind, first, second

    def _lost(self) -> None:
        if not self.gone:
            self.gone = True
            if self._process is not None:
                self._process.join(1.0)
            code = None if self._process is None else self._process.exitcode
            log.error("the zygote (pid %s) exited with code %s: no sampling worker can be "
                      "started or replaced from now on; the run goes on with the workers "
                      "it has", self.pid, code)

    def _kill_zygote(self) -> None:
        if self._process is not None and self._process.exitcode is None:
            self._process.kill()
            self._process.join(REAP_TIMEOUT)

    def stop(self, timeout: float = REAP_TIMEOUT) -> None:
        """End the zygote: closing the pair makes it SIGKILL the workers it forked (those
        still running) and exit; waits up to ``timeout`` s, then kills it."""
        self.gone = True  # a stop, not a loss: nothing more to log
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._process is not None:
            self._process.join(timeout)
            self._kill_zygote()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None


def _zygote_main(channel: socket.socket, servers: socket.socket, lifeline: int,
                 lifeline_write: int, work: Work) -> None:
    """The zygote's loop: fork on request, reap and report, until the server goes."""
    servers.close()  # the server's end: only the server may hold it (its exit closes it)
    os.close(lifeline_write)
    set_process_name(ZYGOTE_NAME)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)  # a child's exit wakes the select below
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, int] = {}  # pid -> seat
    zygote = os.getpid()
    try:
        while True:
            if not _reap(children, channel):
                return
            readable, _, _ = select.select([channel.fileno(), wake_read], [], [], 1.0)
            if wake_read in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 512)
            if channel.fileno() not in readable:
                continue
            try:
                request = channel.recv(_MESSAGE.size)
            except OSError:
                return
            if len(request) != _MESSAGE.size:
                return  # the server closed its end (a stop), or died
            kind, seat, generation = _MESSAGE.unpack(request)
            if kind != _FORK:
                continue
            try:
                pid = os.fork()
            except OSError as error:
                channel.send(_MESSAGE.pack(_FAILED, seat, error.errno or errno.EAGAIN))
                continue
            if pid == 0:
                _worker_child(seat, generation, work, (channel, wake_read, wake_write),
                              server_alive(lifeline, zygote))
            children[pid] = seat
            channel.send(_MESSAGE.pack(_FORKED, seat, pid))
    except OSError:
        pass  # the pair broke: the server is gone
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + REAP_TIMEOUT
        while children and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                pid, _ = os.waitpid(-1, 0)
                children.pop(pid, None)
                continue
            break


def _reap(children: dict[int, int], channel: socket.socket) -> bool:
    """Reap the exited workers and report them; False when the server is gone."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            break
        if pid == 0:
            break
        if children.pop(pid, None) is None:
            continue
        try:
            channel.send(_MESSAGE.pack(_EXITED, pid, os.waitstatus_to_exitcode(status)))
        except OSError:
            return False
    return True


def _worker_child(seat: int, generation: int, work: Work, inherited: tuple[Any, int, int],
                  alive: Callable[[], bool]) -> None:
    """In the forked worker: drop the zygote's descriptors and handlers, run, exit."""
    code = 1
    try:
        channel, wake_read, wake_write = inherited
        channel.close()
        signal.set_wakeup_fd(-1)
        os.close(wake_read)
        os.close(wake_write)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        set_process_name(worker_name(seat))
        work(seat, generation, alive)
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else 1
    except BaseException:  # the worker's last word, then its exit code
        traceback.print_exc()
    finally:
        flush_logs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
