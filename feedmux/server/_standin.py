"""Control answered while the server's own thread is in the streamer: the stand-in thread.

A server that samples in its own process (``--workers 1``, the default) runs
the streamer on the thread that drives its sockets, and answered control only
between two messages: a streamer taking 50 ms a sample held statistics,
heartbeats and hellos up to a sample's time (p50 52 ms, p99 0.15-0.5 s with a
trainer reading), and a sample of seconds (a huge image) let ``feedmux stats``
and ``top`` report the server unreachable. :class:`ControlStandIn` is a thread
that drives the shell's control socket *only while* the server's thread is
inside a draw (the streamer's code, a chunk at a time) that has lasted a few
milliseconds: the shell is driven by one thread at a time, handed over under a
lock (the full memory barrier ZeroMQ asks of a socket that changes threads),
and the server's thread, in user code meanwhile, touches nothing of it. A
streamer in pure Python holds the GIL, but the interpreter makes it let go every
switch interval (5 ms), so the stand-in answers within about 10-20 ms of a
request whatever the streamer does (``benchmarks.bench_control``: p99 about
20 ms with a streamer of 50 ms a sample in pure Python).

Why a thread and not a process of its own for the one sampler, as ``--workers
N`` has: the forwarding path of the workers lacks what the one-process path
does (a batch that cannot be built is one trainer's error; a refused sample is
named with its streamer), a message of small samples crossed one more socket,
and the thread costs a fast sampler nothing (a lock released and taken back
per drawn chunk; the stand-in looks every 10 ms whether a draw is under way).
A streamer in C that holds the GIL for long (rare: decoders let it go) would
still hold control up; ``--workers 2`` takes sampling out of the process.

The stand-in answers the control messages (the shell's ``answer``), never the
data side of what they said (a rank's replay to its successor, consumer groups
opening): the server's thread does that (``follow``) as soon as it has the shell
back. It must never touch the data path, nor run while the server's thread
drives the shell.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

__all__ = ["ControlStandIn", "STAND_IN_AFTER"]

log = logging.getLogger("feedmux.server")

#: Seconds a draw lasts before the stand-in takes the control socket over (it looks
#: twice as often): a fast sampler's draws, shorter, are never interrupted.
STAND_IN_AFTER = 0.005
#: Milliseconds the stand-in waits on the control socket before it looks again whether
#: the server is stopping (a draw's end wakes it at once).
_STANDING_POLL_MS = 100


class ControlStandIn:
    """A thread that answers the control socket while the server's thread draws samples.

    Parameters
    ----------
    control : zmq.Socket
        The shell's control socket (polled here only while standing in).
    answer : callable
        ``answer(timeout)``: answer what the control socket holds; True if anything came.
    follow : callable
        ``follow()``: the data side of what was answered, run by the server's thread
        once it has the shell back (only after the stand-in answered something).
    """

    def __init__(self, control: zmq.Socket[Any], answer: Callable[[float], bool],
                 follow: Callable[[], None]) -> None:
        self._control = control
        self._answer = answer
        self._follow = follow
        #: Held by whichever thread drives the shell: the server's, except within a draw.
        self._shell = threading.Lock()
        self._shell.acquire()
        #: When the draw under way began (None: no draw).
        self._drawing_since: float | None = None
        self._standing_in = False
        self._answered = False
        self._stopped = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._thread = threading.Thread(target=self._run, name="feedmux-control-stand-in",
                                        daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        """Around a draw (user code): the stand-in may answer control meanwhile."""
        self._drawing_since = time.monotonic()
        self._shell.release()
        try:
            yield
        finally:
            self._drawing_since = None
            if self._standing_in:  # it holds the shell: wake it to hand it back
                os.write(self._wake_write, b"!")
            self._shell.acquire()
            if self._answered:
                self._answered = False
                self._follow()

    def close(self) -> None:
        """Stop the thread (from the server's thread, outside a draw: the shell is its)."""
        self._stopped = True
        os.write(self._wake_write, b"!")
        self._thread.join(timeout=5)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_read, zmq.POLLIN)
        looking = zmq.Poller()
        looking.register(self._wake_read, zmq.POLLIN)
        looking.register(self._control, zmq.POLLIN)
        while not self._stopped:
            poller.poll(int(STAND_IN_AFTER * 1000))
            self._drain()
            since = self._drawing_since
            if since is None or time.monotonic() - since < STAND_IN_AFTER:
                continue
            if not self._shell.acquire(blocking=False):
                continue
            try:
                self._standing_in = True
                while self._drawing_since is not None and not self._stopped:
                    if self._answer(0):
                        self._answered = True
                    looking.poll(_STANDING_POLL_MS)
            except Exception:
                log.exception("the control stand-in failed; control is answered between "
                              "messages only from now on")
                self._stopped = True
            finally:
                self._standing_in = False
                self._drain()
                self._shell.release()

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 64):
                pass
