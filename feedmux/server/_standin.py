"""Control answered while the server's own thread is in the streamer: the stand-in thread.

A server that samples in its own process (``--workers 1``, the default, and
``--workers auto`` at a count of one) runs the streamer on the thread that drives
its sockets, and answered control only
between two messages: with a streamer taking 50 ms a sample, ``feedmux stats``
took 52-61 ms at the median, and a sample of seconds (a huge image) left hellos,
heartbeats and ``stats`` / ``top`` unanswered until it was done.
:class:`ControlStandIn` is a thread that drives the shell's control socket
*only while* the server's thread is inside a draw (the streamer's code, a chunk
at a time): at once for a sampler whose draws last ``STAND_IN_AFTER`` on
average, else once a draw has lasted that long (looked at every
``IDLE_LOOK``). The shell is driven by one thread at a time, handed over under
a lock (the full memory barrier ZeroMQ asks of a socket that changes threads),
and the server's thread, in user code meanwhile, touches nothing of it. A
streamer in pure Python holds the GIL, but the interpreter makes it let go
every switch interval, made 0.5 ms while the stand-in stands in, so each of the
stand-in's steps gets the GIL back within that: ``feedmux stats`` took 4-7 ms
at the median with a streamer of 50 ms a sample in pure Python
(``benchmarks.bench_control``; docs/server.md has the figures).

Why a thread and not a process of its own for the one sampler, as ``--workers
N`` has (tried and measured: the answers came as fast, and small samples went
as fast once its messages were no longer cut every 16 samples): the workers'
forwarding path lacks what the one-process path does (a batch that cannot be
built is one trainer's error, not the server's; a refused sample is named with
its streamer; an epoch skipped whole names its first error), and 8 tests of
those failed with it; a thread keeps every one of them. What the thread costs:
a lock released and taken back per drawn chunk, one look at the draw under way
every ``IDLE_LOOK``, and for a sampler of long draws a wake-up at each draw's
start and the shell handed back at its end (scenarios 1 and 4 of ``python -m
benchmarks``: the same rate with and without it). A streamer in C that holds
the GIL for long (rare: decoders let it go) would still hold control up;
``--workers 2`` takes sampling out of the server's process.

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
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

__all__ = ["IDLE_LOOK", "STAND_IN_AFTER", "ControlStandIn"]

log = logging.getLogger("feedmux.server")

#: Seconds a draw lasts before the stand-in takes the control socket over: shorter draws
#: (a fast sampler's chunk of 5 ms) are never interrupted, since handing the shell back
#: waits for the stand-in's thread to run (on a loaded machine, up to milliseconds).
STAND_IN_AFTER = 0.02
#: Seconds between the stand-in's looks at a draw it was not told about: the draws of a
#: sampler whose draws last ``STAND_IN_AFTER`` on average wake it as they start; a fast
#: sampler's (say, a stall in a stream of small samples) are looked at this often only,
#: so that the stand-in asks for the GIL 20 times a second at most. (Looking every 5 ms cost a
#: server of small samples a third of its rate on a loaded machine: each look makes the
#: sampling thread hand the GIL over and wait until the stand-in has run.)
IDLE_LOOK = 0.05
#: The interpreter's switch interval while the stand-in stands in (the default is 5 ms).
STANDING_SWITCH_INTERVAL = 0.0005
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
        #: The draws' running mean duration, and whether the one under way is expected to
        #: last ``STAND_IN_AFTER`` (the stand-in takes it over at once).
        self._draw_seconds = 0.0
        self._expected_long = False
        self._stopped = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._thread = threading.Thread(target=self._run, name="feedmux-control-stand-in",
                                        daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        """Around a draw (user code): the stand-in may answer control meanwhile."""
        self._expected_long = self._draw_seconds >= STAND_IN_AFTER
        since = self._drawing_since = time.monotonic()
        self._shell.release()
        if self._expected_long:  # the draws last long: the stand-in takes this one over
            os.write(self._wake_write, b"!")
        try:
            yield
        finally:
            self._drawing_since = None
            if self._standing_in:  # it holds the shell: wake it to hand it back
                os.write(self._wake_write, b"!")
            self._shell.acquire()
            # A running mean: a draw that the machine's load stretched now and then does
            # not make the next ones be taken over (each costs a hand-back).
            self._draw_seconds += 0.2 * (time.monotonic() - since - self._draw_seconds)
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
            poller.poll(int(IDLE_LOOK * 1000))  # woken early by a draw after a long one
            self._drain()
            # Wait for the draw under way to have lasted STAND_IN_AFTER (or to end), unless
            # it follows a draw that long.
            while (since := self._drawing_since) is not None and not self._stopped:
                after = 0.0 if self._expected_long else STAND_IN_AFTER
                left = since + after - time.monotonic()
                if left <= 0:
                    break
                poller.poll(int(left * 1000) + 1)
                self._drain()
            if since is None or self._stopped or not self._shell.acquire(blocking=False):
                continue
            switching = sys.getswitchinterval()
            try:
                self._standing_in = True
                # Each of the stand-in's steps that lets the GIL go (a poll, a receive, a
                # send) waits for a switch interval to have it back from a streamer in pure
                # Python: shorter while it stands in, so an answer takes a few of them.
                sys.setswitchinterval(min(switching, STANDING_SWITCH_INTERVAL))
                while self._drawing_since is not None and not self._stopped:
                    if self._answer(0):
                        self._answered = True
                    looking.poll(_STANDING_POLL_MS)
            except Exception:
                log.exception("the control stand-in failed; control is answered between "
                              "messages only from now on")
                self._stopped = True
            finally:
                sys.setswitchinterval(switching)
                self._standing_in = False
                self._drain()
                self._shell.release()

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 64):
                pass
