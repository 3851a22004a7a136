"""Consumer groups: four jobs on one sampled stream, next to one job and to four servers.

Run from the repository root (``make bench`` runs it after the suite)::

    python -m benchmarks.bench_groups            # the full run (about a minute)
    python -m benchmarks.bench_groups --quick    # a few seconds, for a smoke test

Three configurations, interleaved and repeated, small samples (the suite's
``small`` generator, transport-batched), one trainer process per job:

- ``1 plain``: a server and one trainer without a group (no buffer: what a
  server with no group trainer does, the same as before groups existed);
- ``1 group``: a server with ``group_buffer`` and one trainer;
- ``4 groups``: the same server and four trainers, each in its own group
  (each receives the whole stream);
- ``4 servers``: four plain servers, one trainer each (what a job needs today).

Figures are medians over the rounds. *Rate per job* is the slowest trainer's
samples/s in the timed window (every job must get the whole stream). *Server
CPU per delivered sample* is the CPU seconds of the server process(es) in the
window over the samples all trainers received; *trainer CPU per sample* is the
same for the trainer processes (what each job's own process spends per sample:
on a machine with fewer cores than trainers plus server, it bounds the rate
per job). Targets: 4 groups' rate per
job >= 80 % of 1 group's; 4 groups' server CPU per delivered sample <= 40 % of
4 servers'.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from typing import Any

import psutil

from benchmarks.scenarios import SMALL, feedmux_source
from feedmux import RemoteLoader, Server

_FORK = multiprocessing.get_context("fork")
CONFIGURATIONS = ("1 plain", "1 group", "4 groups", "4 servers")
TIMEOUT = 60.0


def _trainer(data: str, control: str, group: str | None, warmup: float, seconds: float,
             barrier: Any, results: Any) -> None:
    try:
        with RemoteLoader(data, control=control, group=group, timeout=TIMEOUT) as loader:
            samples = iter(loader)
            end = time.perf_counter() + warmup
            while time.perf_counter() < end:
                for _ in range(256):
                    next(samples)
            barrier.wait(TIMEOUT)
            count, start, cpu_start = 0, time.perf_counter(), time.process_time()
            end = start + seconds
            while time.perf_counter() < end:
                for _ in range(256):
                    next(samples)
                count += 256
            # process_time: this process's CPU, its loader's threads included.
            results.put(("ok", count, time.perf_counter() - start,
                         time.process_time() - cpu_start))
    except BaseException as error:
        results.put(("error", repr(error), 0.0, 0.0))


def _servers(configuration: str) -> list[Server]:
    grouped = configuration in ("1 group", "4 groups")
    count = 4 if configuration == "4 servers" else 1
    # The stream has no epochs: every group must be there from the start (or join "now").
    options: dict[str, Any] = {"group_buffer": "64MiB",
                               "min_trainers": 1 if configuration == "1 group" else 4}
    if not grouped:
        options = {}
    return [Server(feedmux_source(SMALL), bind="tcp://127.0.0.1:0", control="tcp://127.0.0.1:0",
                   **options).start() for _ in range(count)]


def measure(configuration: str, warmup: float, seconds: float) -> dict[str, float]:
    """One run of ``configuration``: rate per job and server CPU per delivered sample."""
    servers = _servers(configuration)
    jobs = 1 if configuration.startswith("1 ") else 4
    barrier = _FORK.Barrier(jobs + 1)
    results = _FORK.Queue()
    trainers = []
    try:
        for job in range(jobs):
            server = servers[job % len(servers)]
            group = f"g{job}" if "group" in configuration else None
            process = _FORK.Process(target=_trainer, daemon=True, args=(
                server.data_address, server.control_address, group, warmup, seconds, barrier,
                results))
            process.start()
            trainers.append(process)
        watched = [psutil.Process(server.pid) for server in servers]
        try:
            barrier.wait(TIMEOUT)
        except threading.BrokenBarrierError:
            problem = results.get(timeout=1) if not results.empty() else "none reported"
            raise RuntimeError(f"{configuration}: a trainer did not start: {problem}") from None
        cpu_start = sum(sum(p.cpu_times()[:2]) for p in watched)
        outcomes = [results.get(timeout=TIMEOUT) for _ in range(jobs)]
        cpu = sum(sum(p.cpu_times()[:2]) for p in watched) - cpu_start
    finally:
        for process in trainers:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
        for server in servers:
            server.stop()
    failed = [outcome[1] for outcome in outcomes if outcome[0] != "ok"]
    if failed:
        raise RuntimeError(f"{configuration}: a trainer failed: {failed[0]}")
    rates = [count / wall for _, count, wall, _ in outcomes]
    delivered = sum(count for _, count, _, _ in outcomes)
    trainer_cpu = sum(cpu for _, _, _, cpu in outcomes)
    return {"rate_per_job": min(rates), "server_cpu_us_per_sample": 1e6 * cpu / delivered,
            "trainer_cpu_us_per_sample": 1e6 * trainer_cpu / delivered}


def run(repeats: int, warmup: float, seconds: float) -> dict[str, dict[str, float]]:
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGURATIONS}
    for round_number in range(repeats):
        order = CONFIGURATIONS if round_number % 2 == 0 else CONFIGURATIONS[::-1]
        for configuration in order:
            figures[configuration].append(measure(configuration, warmup, seconds))
    return {name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            for name, runs in figures.items()}


def report(medians: dict[str, dict[str, float]]) -> str:
    plain, one, four, separate = (medians[name] for name in CONFIGURATIONS)
    rate_ratio = four["rate_per_job"] / one["rate_per_job"]
    cpu_ratio = four["server_cpu_us_per_sample"] / separate["server_cpu_us_per_sample"]
    lines = ["| configuration | samples/s per job | server CPU µs per delivered sample "
             "| trainer CPU µs per sample |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {medians[name]['rate_per_job']:,.0f} | "
              f"{medians[name]['server_cpu_us_per_sample']:.2f} | "
              f"{medians[name]['trainer_cpu_us_per_sample']:.2f} |" for name in CONFIGURATIONS]
    lines.append("")
    lines.append(f"1 group / 1 plain, rate per job: "
                 f"{one['rate_per_job'] / plain['rate_per_job']:.0%} (what the buffer costs "
                 f"one job; a server nobody asks for a group keeps none)")
    lines.append(f"4 groups / 1 group, rate per job: {rate_ratio:.0%} (target >= 80%): "
                 f"{'met' if rate_ratio >= 0.8 else 'missed'}")
    lines.append(f"4 groups / 4 servers, rate per job: "
                 f"{four['rate_per_job'] / separate['rate_per_job']:.0%} (the same 4 trainers: "
                 f"what the machine's cores allow 4 jobs)")
    lines.append(f"4 groups / 4 servers, server CPU per delivered sample: {cpu_ratio:.0%} "
                 f"(target <= 40%): {'met' if cpu_ratio <= 0.4 else 'missed'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_groups",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    repeats, warmup, seconds = (1, 0.3, 0.5) if args.quick else (args.repeats, 1.0, args.seconds)
    print(report(run(repeats, warmup, seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
