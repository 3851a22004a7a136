"""``feedmux top``: a live view of one or more servers, from their control endpoints.

This module owns the view: :func:`describe` turns two statistics answers of a
server (the previous and the current one, as ``feedmux stats`` prints them)
into lines — rates, busy and blocked fractions, the trainers' reported wait
for data, epoch progress with an ETA, workers, trainers with their rates and
waits (the slowest few and a summary when there are many) — and :func:`run_top` asks every server
once a second and redraws. On a terminal it draws full frames in the
alternate screen and reads ``q`` without waiting for Enter; otherwise it
prints plain lines. It must never change a server: it only sends statistics
requests, through the client's ``fetch_stats``.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

__all__ = ["describe", "progress_bar", "run_top"]

Stats = Mapping[str, Any]
#: Redraw the screen: cursor home, clear it.
_CLEAR = "\x1b[H\x1b[2J"


def progress_bar(done: int, total: int, width: int = 30) -> str:
    """A text progress bar.

    Examples
    --------
    >>> progress_bar(1, 4, width=8)
    '[##......]'
    """
    filled = 0 if total <= 0 else min(width, width * done // total)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _rate(current: Stats, previous: Stats | None, key: str) -> float | None:
    """Growth of ``key`` per second of server uptime between two answers."""
    if previous is None or previous.get("server_id") != current.get("server_id"):
        return None
    elapsed = float(current.get("uptime_s", 0)) - float(previous.get("uptime_s", 0))
    if elapsed <= 0 or key not in current or key not in previous:
        return None
    return (float(current[key]) - float(previous[key])) / elapsed


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * min(1.0, max(0.0, value)):.0f}%"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def describe(address: str, current: Stats, previous: Stats | None) -> list[str]:
    """The lines for one server, rates from the difference with ``previous``.

    Examples
    --------
    The samples per second (and the ETA, and each trainer's rate) are the server's,
    over its last seconds (``samples_per_second``, ``eta_s``): none is shown before the
    server has one, rather than a rate averaged over its wait for trainers. The other
    rates come from the difference with ``previous``.

    >>> before = {"server_id": "s", "uptime_s": 10.0, "samples_sent": 1000, "epoch": 2,
    ...           "epoch_position": 100, "epoch_size": 1000, "workers": 1, "messages_sent": 10,
    ...           "sampler_busy_seconds": 5.0, "send_blocked_seconds": 1.0, "bytes_sent": 0}
    >>> after = dict(before, uptime_s=11.0, samples_sent=1500, epoch_position=600,
    ...              messages_sent=15, sampler_busy_seconds=5.9, send_blocked_seconds=1.0,
    ...              samples_per_second=480.0, eta_s=0.8)
    >>> for line in describe("tcp://h:5556", after, before)[:3]:
    ...     print(line)
    server s at tcp://h:5556: pid ?, up 11s, 1 worker(s), 0 trainer(s), 1500 samples sent
      480 samples/s, 5 messages/s, 0.0 MB/s; sampling 90%, blocked on sending 0%
      epoch 2 [##################............] 60% 600/1000, ETA 0s
    >>> print(describe("tcp://h:5556", dict(before, samples_per_second=None), None)[1])
      - samples/s (no rate yet), - messages/s, - MB/s; sampling -, blocked on sending -
    """
    shown_rate = current.get("samples_per_second")
    if "samples_per_second" not in current:  # an older server: the difference
        shown_rate = _rate(current, previous, "samples_sent")
    message_rate = _rate(current, previous, "messages_sent")
    byte_rate = _rate(current, previous, "bytes_sent")
    workers = max(1, int(current.get("workers") or 1))
    changes = int(current.get("worker_changes") or 0)
    scaled = (f" ({'auto, ' if current.get('workers_auto') else ''}{changes} change(s), "
              f"last: {current.get('worker_change_reason')})") if changes else ""
    busy = _rate(current, previous, "sampler_busy_seconds")
    busy = None if busy is None else busy / workers
    blocked = _rate(current, previous, "send_blocked_seconds")
    waited = current.get("trainers_wait_fraction")
    reported = "" if waited is None else (
        f"; trainers waited {_percent(waited)} (mean of "
        f"{current.get('trainers_reporting_wait', 0)}, most "
        f"{_percent(current.get('trainers_wait_fraction_max'))})")
    lines = [
        f"server {current.get('server_id', '?')} at {address}: pid {current.get('pid', '?')}, "
        f"up {_duration(float(current.get('uptime_s', 0)))}, {workers} worker(s){scaled}, "
        f"{current.get('connected_trainers', 0)} trainer(s), "
        f"{current.get('samples_sent', 0)} samples sent"
        + (", finished" if current.get("finished") else ""),
        f"  {_figure(shown_rate, '{:.0f}')} samples/s"
        + (" (no rate yet)" if shown_rate is None else "") + _counted(current)
        + f", {_figure(message_rate, '{:.0f}')} messages/s, "
        f"{_figure(None if byte_rate is None else byte_rate / 1e6, '{:.1f}')} MB/s; "
        f"sampling {_percent(busy)}, blocked on sending {_percent(blocked)}{reported}",
    ]
    lines.append("  " + _epoch_line(current, shown_rate))
    alive = [key for key in current if key.startswith("worker.") and key.endswith(".alive")]
    if alive or current.get("sampling_in_server"):
        lines.append("  " + _workers_line(current, alive))
    lines.extend(_trainer_lines(current, previous))
    lines.append(f"  reconnects {current.get('reconnects', 0)}, "
                 f"errors skipped {current.get('errors_skipped', 0)}")
    return lines


def _workers_line(current: Mapping[str, Any], alive: list[str]) -> str:
    """Each worker process by seat (``seat:pid``, or ``seat:DOWN`` for a dead one nobody
    replaced), the replacements and whether the zygote that forks them runs; with
    ``auto`` at a count of one, that the server's own process samples (``here``).

    >>> _workers_line({"worker.0.alive": 1, "worker.0.pid": 41, "worker.1.alive": 0,
    ...                "workers_replaced": 2, "zygote_alive": 0},
    ...               ["worker.0.alive", "worker.1.alive"])
    'workers 0:41 1:DOWN, 2 replaced, zygote DOWN (no worker is forked or replaced)'
    >>> _workers_line({"sampling_in_server": 1, "pid": 40, "zygote_alive": 1}, [])
    "workers none: sampling in the server's process (pid 40)"
    """
    seats = sorted(alive, key=lambda key: int(key.split(".")[1]))
    states = " ".join(
        f"{key.split('.')[1]}:"
        f"{current.get(key[: -len('alive')] + 'pid', 'up') if current[key] else 'DOWN'}"
        for key in seats)
    if current.get("sampling_in_server"):
        # A worker still ending as asked may be listed until it has.
        states = (f"{states} ending, " if states else "none: ") + (
            f"sampling in the server's process (pid {current.get('pid', '?')})")
    line = f"workers {states}"
    if current.get("workers_replaced"):
        line += f", {current['workers_replaced']} replaced"
    if current.get("zygote_alive") == 0:
        line += ", zygote DOWN (no worker is forked or replaced)"
    return line


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _counted(current: Stats) -> str:
    """The rate in the count field's unit (``--count-field``), when the server has one.

    Examples
    --------
    >>> _counted({"count_field": "tokens", "counted_per_second": 51234.0})
    ', 51234 tokens/s'
    >>> _counted({"count_field": "tokens", "counted_per_second": None}), _counted({})
    (', - tokens/s', '')
    """
    field = current.get("count_field")
    if not field:
        return ""
    return f", {_figure(current.get('counted_per_second'), '{:.0f}')} {field}/s"


def _epoch_line(current: Stats, rate: float | None) -> str:
    epoch, size = current.get("epoch", 0), current.get("epoch_size")
    done = int(current.get("epoch_position") or 0)
    if not size:
        return f"epoch {epoch}: {done} samples so far (epoch size known after the first epoch)"
    done = min(done, int(size))
    eta_s = current.get("eta_s")
    if "eta_s" not in current:  # an older server
        eta_s = (size - done) / rate if rate else None
    eta = "-" if eta_s is None else _duration(float(eta_s))
    return (f"epoch {epoch} {progress_bar(done, int(size))} {100 * done // int(size)}% "
            f"{done}/{size}, ETA {eta}")


#: Trainers listed one per line at most; beyond, the slowest are listed and the rest summed up.
TRAINER_LINES = 8


def _trainer_lines(current: Stats, previous: Stats | None) -> list[str]:
    """A line per trainer; with more than :data:`TRAINER_LINES`, the slowest ones and
    one line for all (a server may have hundreds: the view must fit a screen). A trainer
    whose link ``--compress`` compresses says with which codec, and why; one that
    reports its wait for data, how much of its last second it waited. A trainer's
    rate is the server's, over its last seconds of heartbeats (``-`` before it has one).

    Examples
    --------
    >>> stats = {"trainer.t1.received_messages": 5, "trainer.t1.compress": "lz4",
    ...          "trainer.t1.compress_reason": "link is the limit",
    ...          "trainer.t1.samples_per_second": 97.0,
    ...          "trainer.t2.received_messages": 9, "trainer.t2.wait_fraction": 0.42,
    ...          "trainer.t2.samples_per_second": None}
    >>> for line in _trainer_lines(stats, None):
    ...     print(line)
      trainer t1: rank -, ~97 samples/s, 5 messages received, compressed lz4 (link is the limit)
      trainer t2: rank -, ~- samples/s, 9 messages received, waits 42%
    """
    per_message = (float(current.get("samples_sent", 0)) / current["messages_sent"]
                   if current.get("messages_sent") else 0.0)
    trainers = []
    for key in sorted(current):
        if not (key.startswith("trainer.") and key.endswith(".received_messages")):
            continue
        client_id = key[len("trainer."):-len(".received_messages")]
        rate_key = f"trainer.{client_id}.samples_per_second"
        if rate_key in current:
            trainers.append((client_id, current[rate_key]))
            continue
        rate = _rate(current, previous, key)  # an older server: the difference
        trainers.append((client_id, None if rate is None else rate * per_message))
    shown = trainers
    if len(trainers) > TRAINER_LINES:  # the slowest first: the ones holding a job back
        shown = sorted(trainers, key=lambda item: -1.0 if item[1] is None else item[1])
        shown = shown[:TRAINER_LINES]
    lines = []
    for client_id, rate in shown:
        rank = current.get(f"trainer.{client_id}.rank", "-")
        received = current[f"trainer.{client_id}.received_messages"]
        codec = current.get(f"trainer.{client_id}.compress", "off")
        why = current.get(f"trainer.{client_id}.compress_reason", "")
        waits = current.get(f"trainer.{client_id}.wait_fraction")
        lines.append(f"  trainer {client_id}: rank {rank}, "
                     f"~{'-' if rate is None else f'{rate:.0f}'} samples/s, "
                     f"{received} messages received"
                     + ("" if codec == "off" else f", compressed {codec} ({why})")
                     + ("" if waits is None else f", waits {_percent(waits)}"))
    if len(shown) < len(trainers):
        lines.append("  " + _trainers_summary(trainers, len(trainers) - len(shown)))
    return lines


def _trainers_summary(trainers: list[tuple[str, float | None]], hidden: int) -> str:
    """One line for many trainers: how many, and the spread of their rates.

    Examples
    --------
    >>> _trainers_summary([("a", 10.0), ("b", 30.0), ("c", None)], hidden=1)
    '3 trainers (1 more not listed): ~10 / 20 / 30 samples/s (slowest / median / fastest)'
    """
    rates = sorted(rate for _, rate in trainers if rate is not None)
    spread = "rates after the next refresh"
    if rates:
        middle = len(rates) // 2
        median = rates[middle] if len(rates) % 2 else (rates[middle - 1] + rates[middle]) / 2
        spread = (f"~{rates[0]:.0f} / {median:.0f} / {rates[-1]:.0f} samples/s "
                  "(slowest / median / fastest)")
    return f"{len(trainers)} trainers ({hidden} more not listed): {spread}"


Fetch = Callable[[str], dict[str, Any]]


def frame(addresses: Sequence[str], fetch: Fetch,
          previous: dict[str, Stats]) -> list[str]:
    """Ask every server once and describe it (an unreachable one says why)."""
    lines = [f"feedmux top: {time.strftime('%H:%M:%S')}  (q or Ctrl-C quits)"]
    for address in addresses:
        try:
            current = fetch(address)
        except Exception as error:  # one server down must not stop the view of the others
            lines.append(f"server at {address}: unreachable ({error})")
            previous.pop(address, None)
            continue
        lines.extend(describe(address, current, previous.get(address)))
        previous[address] = current
    return lines


def run_top(addresses: Sequence[str], fetch: Fetch, *, interval: float = 1.0,
            count: int | None = None, out: TextIO | None = None) -> int:
    """Redraw every ``interval`` seconds until ``q``, Ctrl-C or ``count`` refreshes."""
    out = out or sys.stdout
    terminal = out.isatty() and sys.stdin.isatty()
    previous: dict[str, Stats] = {}
    saved = None
    if terminal:
        saved = termios.tcgetattr(sys.stdin)
        tty.setcbreak(sys.stdin.fileno())
        out.write("\x1b[?1049h")  # the alternate screen: the shell's screen comes back after
    refreshes = 0
    try:
        while count is None or refreshes < count:
            lines = frame(addresses, fetch, previous)
            refreshes += 1
            if terminal:
                out.write(_CLEAR + "\r\n".join(lines) + "\r\n")
            else:
                out.write("\n".join(lines) + "\n")
            out.flush()
            if _quit_requested(interval if count is None or refreshes < count else 0,
                               terminal):
                break
    except KeyboardInterrupt:
        pass
    finally:
        if saved is not None:
            out.write("\x1b[?1049l")
            out.flush()
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
    return 0


def _quit_requested(timeout: float, terminal: bool) -> bool:
    """Wait up to ``timeout`` s; True when ``q`` was pressed (terminals only)."""
    if not terminal:
        time.sleep(timeout)
        return False
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], remaining)
        if ready and os.read(sys.stdin.fileno(), 1) in (b"q", b"Q"):
            return True
    return False
