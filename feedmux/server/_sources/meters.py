"""Where a server's time goes: sampling (busy) versus waiting for trainers (blocked).

This module owns the figures behind the question "is the sampler or the
trainer the limit?": seconds spent sampling and encoding, per sampling
process, streams skipped after an error, and seconds the sending loop waited
because every trainer's queue was full. A :class:`SamplerMeter` lives in
plain memory for a one-process server and in a shared array for worker
processes (each worker adds to its own slot, the server process reads them
all: no messages, no locks, since one writer per slot). With a count field
(``--count-field tokens``) it also sums each sample's value of that field (its
length, or the number itself): the rate in the user's unit. It must never read a
clock of its own, log or decide anything: the producer and the shell measure
and add, the control core reports. It lives with the sources, which write the
sampling figures from every process; the data path adds its control time
through a callable it is given, so it never imports this module.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable, Mapping, MutableSequence
from numbers import Number
from typing import Any

__all__ = ["SLOTS", "ControlMeter", "SamplerMeter", "SharedMeters", "sample_count",
           "sampler_stats"]

#: Values per sampling process: busy seconds, streams skipped after an error, the count
#: field's sum, samples without the count field.
SLOTS = 4
_BUSY, _SKIPPED, _COUNTED, _UNCOUNTED = 0, 1, 2, 3


def sample_count(sample: Any, field: str) -> float | None:
    """What ``sample`` counts in the unit of ``field``: the length of its value (tokens
    of a sequence, rows of an array) or the value itself (a number); None when the
    sample has no such field.

    Examples
    --------
    >>> sample_count({"tokens": [5, 9, 2]}, "tokens"), sample_count({"n": 7}, "n")
    (3, 7)
    >>> sample_count({"x": 1}, "tokens") is None, sample_count((1, 2), "tokens") is None
    (True, True)
    """
    if not isinstance(sample, Mapping) or field not in sample:
        return None
    value = sample[field]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, Number):  # a numpy scalar
        return float(value)  # type: ignore[arg-type]
    try:
        return len(value)
    except TypeError:
        return None


class SamplerMeter:
    """One sampling process's counters, in ``values[offset : offset + SLOTS]``.

    The values may be a list (one process) or a shared ``RawArray`` (worker
    processes): a float add per data message is all the producer pays.

    Examples
    --------
    >>> meter = SamplerMeter()
    >>> meter.add_busy(0.25); meter.add_busy(0.5); meter.skipped()
    >>> meter.busy_seconds, meter.errors_skipped
    (0.75, 1)
    >>> tokens = SamplerMeter(count_field="tokens")
    >>> tokens.count([{"tokens": [1, 2]}, {"tokens": [3]}, {"other": 1}])
    >>> tokens.counted, tokens.uncounted
    (3.0, 1)
    """

    __slots__ = ("_offset", "_values", "count_field")

    def __init__(self, values: MutableSequence[float] | None = None, offset: int = 0,
                 count_field: str = "") -> None:
        self._values: MutableSequence[float] = [0.0] * SLOTS if values is None else values
        self._offset = offset
        #: The field of a sample whose length or value is summed ("": none).
        self.count_field = count_field

    def count(self, samples: Iterable[Any]) -> None:
        """Add what ``samples`` count in the count field's unit (nothing without one)."""
        field = self.count_field
        if not field:
            return
        total, missing = 0.0, 0
        for sample in samples:
            value = sample_count(sample, field)
            if value is None:
                missing += 1
            else:
                total += value
        self._values[self._offset + _COUNTED] += total
        if missing:
            self._values[self._offset + _UNCOUNTED] += missing

    def add_busy(self, seconds: float) -> None:
        self._values[self._offset + _BUSY] += seconds

    def skipped(self) -> None:
        self._values[self._offset + _SKIPPED] += 1

    @property
    def busy_seconds(self) -> float:
        return float(self._values[self._offset + _BUSY])

    @property
    def errors_skipped(self) -> int:
        return int(self._values[self._offset + _SKIPPED])

    @property
    def counted(self) -> float:
        return float(self._values[self._offset + _COUNTED])

    @property
    def uncounted(self) -> int:
        return int(self._values[self._offset + _UNCOUNTED])


class ControlMeter:
    """The server thread's CPU spent on control messages, and how many it took in.

    The shell reads ``time.thread_time()`` (this thread's CPU, not the wall
    clock: the I/O threads of ZeroMQ and a loaded machine do not count) before and
    after each batch of control messages it receives, decodes and answers (the
    control socket, and the credit and acknowledgements on the data socket), and
    adds the difference here: a clock read per batch, never per
    message.

    Examples
    --------
    >>> meter = ControlMeter()
    >>> meter.add(3, 0.002); meter.add(1, 0.001)
    >>> meter.stats()
    {'control_messages': 4, 'control_cpu_seconds': 0.003}
    """

    __slots__ = ("cpu_seconds", "messages")

    def __init__(self) -> None:
        self.messages = 0
        self.cpu_seconds = 0.0

    def add(self, messages: int, cpu_seconds: float) -> None:
        self.messages += messages
        self.cpu_seconds += cpu_seconds

    def stats(self) -> dict[str, float | int]:
        return {"control_messages": self.messages,
                "control_cpu_seconds": round(self.cpu_seconds, 6)}


class SharedMeters:
    """The meters of ``count`` worker processes in memory shared across a fork."""

    def __init__(self, count: int, count_field: str = "") -> None:
        self._values = multiprocessing.get_context("fork").RawArray("d", SLOTS * count)
        self.meters = [SamplerMeter(self._values, SLOTS * index, count_field)
                       for index in range(count)]


def sampler_stats(meters: list[SamplerMeter], blocked_seconds: float) -> dict[str, float | int]:
    """The figures the control core reports, summed over the sampling processes.

    ``sampler_busy_seconds`` adds up every process's sampling time, so its rate
    divided by the number of workers is their mean utilisation.

    Examples
    --------
    >>> one, two = SamplerMeter(), SamplerMeter()
    >>> one.add_busy(1.0); two.add_busy(2.0)
    >>> sampler_stats([one, two], blocked_seconds=0.5)
    {'sampler_busy_seconds': 3.0, 'send_blocked_seconds': 0.5, 'errors_skipped': 0}

    With a count field, ``counted`` is the sum of its values so far and
    ``uncounted_samples`` the samples that had no such field (a misspelt field
    counts nothing: this says so).
    """
    stats: dict[str, float | int] = {
        "sampler_busy_seconds": round(sum(m.busy_seconds for m in meters), 6),
        "send_blocked_seconds": round(blocked_seconds, 6),
        "errors_skipped": sum(m.errors_skipped for m in meters),
    }
    if meters and meters[0].count_field:
        stats["counted"] = sum(m.counted for m in meters)
        stats["uncounted_samples"] = sum(m.uncounted for m in meters)
    return stats
