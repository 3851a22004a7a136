"""How ``Server.start()`` makes its background process, and how that process keeps track of it.

This module owns the background server process: how it is made (a fresh Python
interpreter given the configuration as data over a pipe, or a fork where the
source only exists in the starting program), the report pipe over which the new
process says what it bound or why it could not, the wait for that report (every
outcome named: bound, failed with the child's error, exited or killed before
binding, silent past the timeout), and the watch that stops a started server
when the process that started it is gone, however it died. It must never
import the starting program's main module again (that is what makes
``multiprocessing``'s spawn and forkserver fail in an unguarded script), and it
never binds a socket or decides anything about serving: :class:`Server` does.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import multiprocessing
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from feedmux._stderrlog import install as install_logging
from feedmux.server.config import EXIT_FAILED, ServerConfig

__all__ = [
    "PARENT_CHECK",
    "STOP_GRACE",
    "ChildReport",
    "ServerProcess",
    "check_not_nested",
    "launch",
    "watch_parent",
]

log = logging.getLogger("feedmux.server")

#: Seconds between two looks of a started server at whether its starter still runs.
PARENT_CHECK = 0.25
#: Seconds a started server whose starter is gone has to stop by itself before it
#: kills its workers and exits (a streamer stuck in user code never returns).
STOP_GRACE = 3.0
#: Seconds to wait for the exit code of a child that closed its report pipe.
EXIT_WAIT = 5.0
# The fresh interpreter's whole program: the starter's import path as it is (so a module
# imports there exactly when it imports here), then run.
_CHILD_CODE = (
    "import sys; sys.path[:] = sys.argv[3:]; "
    "from feedmux.server._launch import child_main; "
    "from feedmux.server.server import serve_started; "
    "child_main(int(sys.argv[1]), int(sys.argv[2]), serve_started)"
)

#: How a started process serves: ``serve(config, report, parent pid) -> exit code``
#: (:func:`feedmux.server.server.serve_started`; passed in, as the server imports this module).
Serve = Callable[[ServerConfig, "ChildReport", int], int]


# Set in a process that start() made: a start() there is a source module starting itself.
_in_started_server = False


class _NeedsFork(Exception):
    """The source refers to the starting program's ``__main__``: a fresh interpreter lacks it."""


class _NoMainPickler(pickle.Pickler):
    """A pickler that refuses anything defined in ``__main__``.

    Unpickling such a reference means importing the main module again, which
    runs the starting script a second time (its own ``Server.start()`` too).
    """

    def reducer_override(self, obj: Any) -> Any:
        if getattr(obj, "__module__", None) == "__main__" or type(obj).__module__ == "__main__":
            raise _NeedsFork(f"{obj!r:.60} is defined in the main script")
        return NotImplemented


def _payload(config: ServerConfig) -> tuple[bytes | None, str]:
    """The configuration pickled for a fresh interpreter, or None and why it must fork."""
    buffer = io.BytesIO()
    try:
        _NoMainPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(
            (config, logging.getLogger().getEffectiveLevel(), os.getpid()))
    except _NeedsFork as error:
        return None, str(error)
    except Exception as error:  # a lambda, a generator, a socket in the source...
        return None, f"the source cannot be pickled ({type(error).__name__}: {error})"
    return buffer.getvalue(), ""


class ServerProcess:
    """The background server process, made by :func:`launch`: a fresh interpreter or a fork.

    ``method`` says which: ``"interpreter"`` (the configuration went over a pipe)
    or ``"fork"`` (the starter ran one thread, or the source is defined in the
    starting script or does not pickle, so only a copy of this process has it).
    Only the process that made it may signal or wait for it (:attr:`ours`).
    """

    def __init__(self, method: str, handle: subprocess.Popen[bytes] | Any, report: int) -> None:
        self.method = method
        self._handle = handle
        self._starter = os.getpid()
        #: The read end of the report pipe (closed by :meth:`read_report`).
        self.report = report

    @property
    def pid(self) -> int:
        return int(self._handle.pid)

    @property
    def ours(self) -> bool:
        """Whether this is the process that started it (not a forked copy of that one)."""
        return os.getpid() == self._starter

    @property
    def exitcode(self) -> int | None:
        """The exit code (negative: killed by that signal), None while it runs."""
        if isinstance(self._handle, subprocess.Popen):
            return self._handle.poll()
        code: int | None = self._handle.exitcode
        return code

    def join(self, timeout: float | None = None) -> int | None:
        if isinstance(self._handle, subprocess.Popen):
            try:
                self._handle.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        else:
            self._handle.join(timeout)
        return self.exitcode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.exitcode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def read_report(self, timeout: float) -> tuple[str, ...]:
        """What the process reported: ``("bound", data, control, metrics)`` or
        ``("failed", why)``; a silence or an early exit becomes ``("failed", why)`` too.
        """
        try:
            return self._read_report(timeout)
        finally:
            os.close(self.report)

    def _read_report(self, timeout: float) -> tuple[str, ...]:
        deadline = time.monotonic() + timeout
        received = b""
        while b"\n" not in received:
            remaining = deadline - time.monotonic()
            # A short slice, so that a death is seen even while forked workers keep the
            # pipe open.
            ready, _, _ = select.select([self.report], [], [], max(0.0, min(remaining, 0.1)))
            chunk = os.read(self.report, 1 << 16) if ready else b""
            if ready and not chunk:  # end of file: it exited (or closed the pipe) silently
                return ("failed", self._exit_problem(self.join(EXIT_WAIT)))
            received += chunk
            if not ready and self.exitcode is not None:
                return ("failed", self._exit_problem(self.exitcode))
            if not ready and remaining <= 0:
                return ("failed", f"it had not bound within {timeout:g} s (pid {self.pid} "
                                  "still running; see its log above)")
        fields: list[str] = json.loads(received.split(b"\n", 1)[0])
        return tuple(fields)

    def _exit_problem(self, code: int | None) -> str:
        if code is None:
            return (f"it closed its report pipe before binding and had not exited "
                    f"{EXIT_WAIT:g} s later")
        if code < 0:
            return (f"it was killed by {signal.Signals(-code).name} before binding "
                    "(see its log above)")
        return f"it exited with code {code} before binding (see its log above)"


def _is_main(module: str) -> bool:
    """Whether importing ``module`` would run the starting script (``__main__``) again."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == module:  # python -m module
        return True
    path = getattr(main, "__file__", None)
    try:
        found = importlib.util.find_spec(module) if path else None
    except Exception:  # not importable at all: the new process says so
        return False
    return bool(found and found.origin and path
                and os.path.realpath(found.origin) == os.path.realpath(path))


def _from_main(config: ServerConfig) -> ServerConfig:
    """A ``"module:attr"`` source that names the running script: its object instead, so
    that the script is never imported a second time (the server is forked with it)."""
    if not isinstance(config.source, str):
        return config
    module, sep, attr = config.source.partition(":")
    if not (sep and module and attr and _is_main(module)):
        return config
    found: Any = sys.modules["__main__"]
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            return config
    return replace(config, source=found)


def _threads() -> int:
    """Threads of this process: the kernel's count (native ones too: BLAS's, torch's, libzmq's)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def launch(config: ServerConfig, serve: Serve) -> ServerProcess:
    """Start the background server process for ``config``; it reports on the returned pipe.

    A process that runs one thread is forked: nothing can hold a lock at the fork,
    and nothing is imported again (the cheapest start). Otherwise a fresh
    interpreter gets the configuration, unless the source exists only in the
    starting script (then it is forked all the same, with a warning when other
    Python threads run).
    """
    config = _from_main(config)
    report_read, report_write = os.pipe()
    try:
        if _threads() == 1:
            return ServerProcess("fork", _fork(config, report_write, serve), report_read)
        payload, why = _payload(config)
        if payload is not None:
            return ServerProcess("interpreter", _fresh(payload, report_write), report_read)
        if threading.active_count() > 1:
            log.warning("forking the server from a process that runs %d threads, as %s: a "
                        "thread holding a lock at the fork can hang it; define the source in "
                        "an importable module (or pass it as 'module:attr') to start a fresh "
                        "interpreter instead", threading.active_count(), why)
        return ServerProcess("fork", _fork(config, report_write, serve), report_read)
    except BaseException:
        os.close(report_read)
        raise
    finally:
        os.close(report_write)


def _fresh(payload: bytes, report_write: int) -> subprocess.Popen[bytes]:
    config_read, config_write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD_CODE, str(config_read), str(report_write),
             *sys.path],
            pass_fds=(config_read, report_write), stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(config_read)
    try:
        with open(config_write, "wb", closefd=True) as pipe:
            pipe.write(payload)
    except BrokenPipeError:  # it died before reading: its exit code tells the rest
        pass
    return process


def _fork(config: ServerConfig, report_write: int, serve: Serve) -> Any:
    context: Any = multiprocessing.get_context("fork")
    process = context.Process(
        target=_forked_main,
        args=(config, report_write, os.getpid(), serve),
        name=f"feedmux-server-{config.server_id}", daemon=False,
    )
    process.start()
    return process


class ChildReport:
    """The background server's end of the report pipe: one line of JSON, then closed."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def send(self, *fields: str) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.write(fd, json.dumps(list(fields)).encode() + b"\n")
        except OSError:  # the starter stopped waiting: nobody to tell
            pass
        finally:
            os.close(fd)


def child_main(config_fd: int, report_fd: int, serve: Serve) -> None:
    """The fresh interpreter's entry point: read the configuration, serve, exit."""
    global _in_started_server
    _in_started_server = True
    report = ChildReport(report_fd)
    with open(config_fd, "rb", closefd=True) as pipe:
        payload = pipe.read()
    try:
        config, level, parent = pickle.loads(payload)  # imports the source's modules
    except BaseException as error:
        install_logging()
        log.error("cannot read the server's configuration: %s: %s", type(error).__name__,
                  error, exc_info=error)
        report.send("failed", f"cannot read the configuration in the new process: "
                              f"{type(error).__name__}: {error}")
        raise SystemExit(EXIT_FAILED) from None
    install_logging(level)
    raise SystemExit(_guarded(serve, config, report, parent))


def _forked_main(config: ServerConfig, report_fd: int, parent: int, serve: Serve) -> None:
    global _in_started_server
    _in_started_server = True
    raise SystemExit(_guarded(serve, config, ChildReport(report_fd), parent))


def check_not_nested() -> None:
    """Refuse ``Server.start()`` inside a started server (a source module that starts one
    when it is imported would otherwise start servers without end)."""
    if _in_started_server:
        raise RuntimeError(
            "Server.start() called inside a server that Server.start() made: a module the "
            "source imports starts a server when it is imported; put that call under "
            "if __name__ == \"__main__\":")


def _guarded(serve: Serve, config: ServerConfig, report: ChildReport, parent: int) -> int:
    """``serve(...)``; whatever escapes it is logged and reported, never lost."""
    try:
        return serve(config, report, parent)
    except BaseException as error:
        log.error("server %s failed: %s: %s", config.server_id, type(error).__name__, error,
                  exc_info=error)
        report.send("failed", f"{type(error).__name__}: {error}")
        return EXIT_FAILED


def watch_parent(parent: int, stop: Callable[[], None], *,
                 check: float = PARENT_CHECK, grace: float = STOP_GRACE) -> threading.Thread:
    """Stop this process once ``parent`` is no longer its parent (it exited or was killed).

    ``stop()`` is asked first (the server's loops see it within a poll period);
    if the process is still there ``grace`` seconds later, its children (the
    sampling workers) are killed and it exits: a stuck streamer cannot keep it.
    The shared-memory pool goes with it (its reaper removes the segment).
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(check)  # the period of a liveness check, not a synchronisation
        log.warning("the process that started this server (pid %d) is gone: stopping", parent)
        stop()
        time.sleep(grace)
        log.error("still running %g s after its starter went away: killing its workers and "
                  "exiting", grace)
        for child in multiprocessing.active_children():
            child.kill()
        os._exit(EXIT_FAILED)

    thread = threading.Thread(target=watch, name="feedmux-parent-watch", daemon=True)
    thread.start()
    return thread
