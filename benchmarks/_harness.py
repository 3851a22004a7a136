"""One measurement: a fresh trainer process, its producer, a watchdog and a timed loop.

The suite's process calls ``measure()``, which forks a *leader* process in a
new session (its own process group). The leader starts the contender's
producer, consumes a warm-up, then times the trainer loop with
``time.perf_counter`` (wall) and ``time.process_time`` (the trainer's own CPU,
every thread of it included) and sends the figures back over a pipe. The
suite's process is the watchdog: past the deadline it kills the leader's
process group and every producer pid the leader reported, so no measurement
can hang the run or leave a process behind. The suite's process itself never
opens a socket.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks import peers
from benchmarks.scenarios import Contender, Scenario

_FORK = multiprocessing.get_context("fork")

#: How a measurement starts its producer and opens its trainer's side: the peers' own
#: by default; a benchmark of feedmux's options passes its own (same signatures).
StartProducer = Callable[[Contender, str, peers.Endpoints, float], peers.Producer]
Connect = Callable[..., peers.Consumer]


@dataclass(frozen=True)
class Budget:
    """How long one measurement warms up and runs."""

    warmup_seconds: float
    seconds: float
    warmup_samples: int = 1
    max_samples: int | None = None  # stop the timed loop early (quick runs)
    check_every: int = 1
    timeout: float = 60.0  # the watchdog's deadline for the whole measurement

    @classmethod
    def full(cls, scenario: Scenario, seconds: float | None = None) -> Budget:
        run_seconds = scenario.seconds if seconds is None else seconds
        return cls(
            warmup_seconds=scenario.warmup_seconds,
            seconds=run_seconds,
            warmup_samples=2,
            check_every=scenario.check_every,
            timeout=40.0 + 3 * (scenario.warmup_seconds + run_seconds),
        )

    @classmethod
    def quick(cls, scenario: Scenario) -> Budget:
        return cls(
            warmup_seconds=0.0,
            seconds=0.3,
            warmup_samples=2,
            max_samples=8 if scenario.large else 64,
            check_every=1,
            timeout=30.0,
        )


def endpoints_for(transport: str, workdir: str) -> peers.Endpoints:
    """Where a producer binds: ipc paths in the run's folder, or port 0 on loopback
    (the producer reports the ports it got)."""
    if transport == "ipc":
        return peers.Endpoints(f"ipc://{workdir}/data", f"ipc://{workdir}/control")
    return peers.Endpoints("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")


# --------------------------------------------------------------------------
# Inside the trainer process


def _cpu_of_descendants(exclude: frozenset[int] = frozenset()) -> float | None:
    """CPU seconds used so far by this process's descendants (None without psutil)."""
    try:
        import psutil
    except ImportError:
        return None
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        if child.pid in exclude:
            continue
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def _consume(consumer: peers.Consumer, budget: Budget, start_gate: Any = None) -> dict[str, Any]:
    """Warm up, then time the trainer loop; the figures of this process only."""
    samples = consumer.samples
    check_every = max(1, budget.check_every)

    warmup_end = time.perf_counter() + budget.warmup_seconds
    count = 0
    for _ in samples:
        count += 1
        if count >= budget.warmup_samples and time.perf_counter() >= warmup_end:
            break
    if start_gate is not None:
        start_gate()

    max_samples = budget.max_samples or (1 << 62)
    count = 0
    cpu_start = time.process_time()
    wall_start = time.perf_counter()
    wall_end = wall_start + budget.seconds
    for _ in samples:
        count += 1
        if count % check_every == 0 and (count >= max_samples or time.perf_counter() >= wall_end):
            break
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - cpu_start
    return {"samples": count, "seconds": wall, "cpu_seconds": cpu}


def _one_trainer(
    contender: Contender, kind: str, endpoints: peers.Endpoints, budget: Budget, report: Any,
    connect: Connect = peers.connect,
) -> dict[str, Any]:
    consumer = connect(contender, kind, endpoints, timeout=budget.timeout)
    try:
        producer_cpu: list[float | None] = []

        def at_start() -> None:
            report(("pids", consumer.pids()))
            producer_cpu.append(_cpu_of_descendants())

        figures = _consume(consumer, budget, start_gate=at_start)
        end_cpu = _cpu_of_descendants()
        start_cpu = producer_cpu[0] if producer_cpu else None
        if start_cpu is not None and end_cpu is not None:
            figures["producer_cpu_seconds"] = end_cpu - start_cpu
        return figures
    finally:
        consumer.close()


def _trainer_process(
    contender: Contender,
    kind: str,
    endpoints: peers.Endpoints,
    budget: Budget,
    barrier: Any,
    connection: Any,
    index: int = 0,
    lockstep: Any = None,
    connect: Connect = peers.connect,
) -> None:
    try:
        consumer = connect(
            contender, kind, endpoints, timeout=budget.timeout, trainers=contender.trainers,
            index=index,
        )
        try:
            if lockstep is None:
                figures = _consume(consumer, budget,
                                   start_gate=lambda: barrier.wait(budget.timeout))
            else:
                figures = _consume(consumer, budget, start_gate=lambda: lockstep.arrive(consumer))
            connection.send(("result", figures))
            if lockstep is not None:
                lockstep.drain(consumer)
        finally:
            consumer.close()
    except BaseException:
        connection.send(("error", traceback.format_exc()))


class _Lockstep:
    """Start and stop gates for ranked trainers, which must never stop reading alone.

    The server deals ranks in lockstep: a rank that stops reading (waiting at a
    barrier, or done) stalls the others once its queue is full. So a rank waits
    for the others *while reading*: it arrives, then reads (untimed) until all
    arrived; after its timed loop it reads until the leader says stop.
    """

    def __init__(self, trainers: int, timeout: float) -> None:
        self.trainers = trainers
        self.timeout = timeout
        self.arrived = _FORK.Value("i", 0)
        self.stop = _FORK.Event()

    def arrive(self, consumer: peers.Consumer) -> None:
        with self.arrived.get_lock():
            self.arrived.value += 1
        deadline = time.monotonic() + self.timeout
        for _ in consumer.samples:
            if self.arrived.value >= self.trainers:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the other ranks did not start within {self.timeout} s")

    def drain(self, consumer: peers.Consumer) -> None:
        deadline = time.monotonic() + self.timeout
        for _ in consumer.samples:
            if self.stop.is_set() or time.monotonic() > deadline:
                return


def _several_trainers(
    contender: Contender, kind: str, endpoints: peers.Endpoints, budget: Budget,
    connect: Connect = peers.connect,
) -> dict[str, Any]:
    """Several trainer processes on one producer, timed over the same window."""
    barrier = _FORK.Barrier(contender.trainers + 1)
    # Ranks, and groups (their buffer holds the others back), never stop reading alone.
    together = contender.ranked or contender.groups
    lockstep = _Lockstep(contender.trainers, budget.timeout) if together else None
    processes, connections = [], []
    for index in range(contender.trainers):
        receiver, sender = _FORK.Pipe(duplex=False)
        process = _FORK.Process(
            target=_trainer_process,
            args=(contender, kind, endpoints, budget, barrier, sender, index, lockstep, connect),
            daemon=True,
        )
        process.start()
        processes.append(process)
        connections.append(receiver)
    trainer_pids = frozenset(p.pid for p in processes if p.pid)
    try:
        if lockstep is None:
            barrier.wait(budget.timeout)
        start_cpu = _cpu_of_descendants(exclude=trainer_pids)
        results = []
        for receiver in connections:
            if not receiver.poll(budget.timeout):
                raise TimeoutError(f"a trainer sent nothing within {budget.timeout} s")
            kind_of_message, payload = receiver.recv()
            if kind_of_message == "error":
                raise RuntimeError(f"a trainer process failed:\n{payload}")
            results.append(payload)
        end_cpu = _cpu_of_descendants(exclude=trainer_pids)
    finally:
        if lockstep is not None:
            lockstep.stop.set()
        for process in processes:
            process.join(5)
            if process.pid and process.is_alive():
                peers.kill_pid(process.pid)
    seconds = max(r["seconds"] for r in results)
    figures: dict[str, Any] = {
        "samples": sum(r["samples"] for r in results),
        "seconds": seconds,
        "cpu_seconds": sum(r["cpu_seconds"] for r in results),
        "trainers": results,
    }
    if start_cpu is not None and end_cpu is not None:
        figures["producer_cpu_seconds"] = end_cpu - start_cpu
    return figures


def _leader(
    scenario: Scenario, contender: Contender, budget: Budget, workdir: str, connection: Any,
    start_producer: StartProducer = peers.start_producer, connect: Connect = peers.connect,
) -> None:
    os.setsid()  # one process group: the watchdog kills it whole
    signal.alarm(int(budget.timeout) + 15)  # a backstop if the watchdog dies too
    producer = None
    try:
        producer = start_producer(
            contender, scenario.kind, endpoints_for(contender.transport, workdir), budget.timeout
        )
        connection.send(("pids", producer.pids))
        endpoints = producer.endpoints
        if contender.trainers > 1:
            figures = _several_trainers(contender, scenario.kind, endpoints, budget, connect)
        else:
            figures = _one_trainer(contender, scenario.kind, endpoints, budget, connection.send,
                                   connect)
        connection.send(("result", figures))
    except BaseException:
        connection.send(("error", traceback.format_exc()))
    finally:
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.stop()
        connection.close()


# --------------------------------------------------------------------------
# In the suite's process: the watchdog


def measure(
    scenario: Scenario, contender: Contender, budget: Budget, *,
    start_producer: StartProducer = peers.start_producer, connect: Connect = peers.connect,
) -> dict[str, Any]:
    """Run one measurement in a fresh trainer process; figures or an error, never a hang.

    ``start_producer`` and ``connect`` replace the peers' own (the trainer process is
    forked, so they may be closures)."""
    workdir = tempfile.mkdtemp(prefix="feedmux-bench-")
    receiver, sender = _FORK.Pipe(duplex=False)
    leader = _FORK.Process(
        target=_leader,
        args=(scenario, contender, budget, workdir, sender, start_producer, connect),
        daemon=False,
    )
    started = time.monotonic()
    leader.start()
    sender.close()
    pids: list[int] = []
    outcome: dict[str, Any] = {"error": f"timed out after {budget.timeout:.0f} s"}
    deadline = started + budget.timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not receiver.poll(remaining):
                break
            try:
                kind, payload = receiver.recv()
            except EOFError:
                outcome = {"error": f"the trainer process died (exit code {leader.exitcode})"}
                break
            if kind == "pids":
                pids.extend(pid for pid in payload if pid)
            elif kind == "result":
                outcome = payload
                break
            else:
                outcome = {"error": payload}
                break
    finally:
        leader.join(10)
        assert leader.pid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader.pid, signal.SIGKILL)
        for pid in pids:
            peers.kill_pid(pid)
        leader.join(5)
        receiver.close()
        shutil.rmtree(workdir, ignore_errors=True)
    outcome.update(
        scenario=scenario.key,
        contender=asdict(contender),
        label=contender.label,
        elapsed=time.monotonic() - started,
    )
    return outcome
