"""CURVE delivery against the default delivery: small samples, one trainer.

Run from the repository root (``make bench`` runs it after the suite)::

    python -m benchmarks.bench_modes --repeats 5   # the full run (about 2 minutes)
    python -m benchmarks.bench_modes --quick       # a few seconds, for a smoke test

One feedmux server over tcp on 127.0.0.1 serves the suite's small scenario
(``{'X': float32[16], 'y': int64}``, messages of up to 256 samples) to one
trainer, in two modes: the default (every free trainer is dealt by credit and
acknowledges its hand-outs: what ``reliable=True`` did, now the only free
delivery; the at-most-once "plain" mode it was compared with is gone), and
CURVE (a key pair made with feedmux's keygen, any client let in). Each
measurement is the suite's (``benchmarks._harness``: a fresh trainer process,
warm-up, timed loop, watchdog); the modes run interleaved round by round,
rotated each round. The ratios are paired: the
two modes' rates are divided round by round and the median quotient is
reported, which cancels most of the drift of a shared machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

from benchmarks import _harness, peers
from benchmarks.scenarios import SCENARIOS, SMALL, Contender

MODES = ("default", "curve")
#: The issue's targets: samples/s of each mode over the default delivery's, same run.
TARGETS = {"curve": 0.50}


class _Keys:
    """The server's CURVE key pair, in a folder removed by :meth:`remove`."""

    def __init__(self) -> None:
        from feedmux._plumbing.curve import create_keys

        self.folder = tempfile.mkdtemp(prefix="feedmux-bench-keys-")
        public, secret = create_keys(self.folder, "server")
        self.public, self.secret = str(public), str(secret)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _options(mode: str, keys: _Keys) -> tuple[dict[str, Any], dict[str, Any]]:
    """The server's and the loader's keyword arguments for ``mode``."""
    return {
        "default": ({}, {}),
        "curve": ({"curve_secret": keys.secret}, {"curve_server_key": keys.public}),
    }[mode]


def _starter(mode: str, keys: _Keys) -> _harness.StartProducer:
    def start(contender: Contender, kind: str, endpoints: peers.Endpoints,
              timeout: float) -> peers.Producer:
        import feedmux

        return peers.started_server(feedmux.Server(
            peers.FEEDMUX_SOURCE, bind=endpoints.data, control=endpoints.control,
            factory_kwargs={"kind": kind}, **_options(mode, keys)[0]))

    return start


def _connector(mode: str, keys: _Keys) -> _harness.Connect:
    def connect(contender: Contender, kind: str, endpoints: peers.Endpoints, timeout: float,
                trainers: int = 1, index: int = 0) -> peers.Consumer:
        import feedmux

        loader = feedmux.RemoteLoader(endpoints.data, control=endpoints.control,
                                      timeout=timeout, **_options(mode, keys)[1])
        return peers.Consumer(samples=iter(loader), close=loader.close)

    return connect


def run(repeats: int, quick: bool = False, seconds: float | None = None,
        progress: Callable[[str], None] | None = print) -> dict[str, list[dict[str, Any]]]:
    """Every mode once per round, rotated; the raw records per mode."""
    keys = _Keys()
    try:
        return rotated_rounds(MODES, repeats, lambda mode: _starter(mode, keys),
                              lambda mode: _connector(mode, keys), quick, seconds, progress)
    finally:
        keys.remove()


def rotated_rounds(modes: tuple[str, ...], repeats: int,
                   starter: Callable[[str], _harness.StartProducer],
                   connector: Callable[[str], _harness.Connect], quick: bool = False,
                   seconds: float | None = None,
                   progress: Callable[[str], None] | None = print,
                   ) -> dict[str, list[dict[str, Any]]]:
    """The small scenario served to one trainer in each of ``modes``, every mode once per
    round in an order rotated each round (the drift of a shared machine cancels in the
    paired ratios); the raw records per mode, with the server's CPU per sample."""
    scenario = next(s for s in SCENARIOS if s.key == SMALL)
    budget = (_harness.Budget.quick(scenario) if quick
              else _harness.Budget.full(scenario, seconds))
    records: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for round_index in range(repeats):
        shift = round_index % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            record = _harness.measure(scenario, Contender("feedmux"), budget,
                                      start_producer=starter(mode), connect=connector(mode))
            record.update(mode=mode, round=round_index)
            if rates(record) and record.get("producer_cpu_seconds") is not None:
                record["server_cpu_us_per_sample"] = (
                    1e6 * record["producer_cpu_seconds"] / record["samples"])
            records[mode].append(record)
            if progress is not None:
                progress(_progress_line(round_index, record))
    return records


def rates(record: dict[str, Any]) -> bool:
    """Add a measurement's samples/s and trainer CPU µs/sample; False if it failed."""
    if "error" in record:
        return False
    record["samples_per_second"] = record["samples"] / record["seconds"]
    record["trainer_cpu_us_per_sample"] = 1e6 * record["cpu_seconds"] / record["samples"]
    return True


def _progress_line(round_index: int, record: dict[str, Any], name: str = "mode",
                   width: int = 8) -> str:
    head = f"round {round_index + 1} {record[name]:<{width}}"
    if "error" in record:
        return f"{head} FAILED: {record['error'].strip().splitlines()[-1]}"
    return (f"{head} {record['samples_per_second']:>12,.0f} samples/s "
            f"{record['trainer_cpu_us_per_sample']:7.2f} µs trainer CPU/sample")


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.median(values) if values else None


def paired(records: dict[str, list[dict[str, Any]]], label: str, base: str,
           key: str = "samples_per_second") -> list[float]:
    """``label``'s ``key`` over ``base``'s in the same round, for every round."""
    under = {r["round"]: r.get(key) for r in records[base]}
    return [r[key] / under[r["round"]] for r in records[label]
            if r.get(key) and under.get(r["round"])]


def paired_ratios(records: dict[str, list[dict[str, Any]]], mode: str) -> list[float]:
    """``mode``'s samples/s over the default's in the same round, for every round."""
    return paired(records, mode, "default")


def failures_line(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The closing line of a table whose measurements failed (none if every one ran)."""
    failed = sum("error" in r for rs in records.values() for r in rs)
    return [f"\n{failed} measurement(s) failed (see above)."] if failed else []


def markdown(records: dict[str, list[dict[str, Any]]]) -> str:
    rounds = max(len(r) for r in records.values())
    lines = [f"### Small samples, one trainer, tcp: CURVE against the default "
             f"({rounds} round(s), medians)", "",
             "| mode | samples/s | trainer CPU µs/sample | server CPU µs/sample "
             "| ratio to default (paired; min-max over rounds) | target |",
             "|---|---|---|---|---|---|"]
    for mode in MODES:
        rate = _median(records[mode], "samples_per_second")
        trainer = _median(records[mode], "trainer_cpu_us_per_sample")
        server = _median(records[mode], "server_cpu_us_per_sample")
        target = TARGETS.get(mode)
        ratios = paired_ratios(records, mode)
        ratio = statistics.median(ratios) if ratios else None
        verdict = "-" if target is None or ratio is None else (
            f">= {target:.2f}: {'met' if ratio >= target else 'MISSED'}")
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if ratios and mode != "default" else ""
        lines.append(f"| {mode} | {_fmt(rate, ',.0f')} | {_fmt(trainer, '.2f')} | "
                     f"{_fmt(server, '.2f')} | {_fmt(ratio, '.2f')}x{spread} | {verdict} |")
    return "\n".join(lines + failures_line(records))


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def rounds_main(module: str, doc: str, run: Callable[..., dict[str, list[dict[str, Any]]]],
                markdown: Callable[[dict[str, list[dict[str, Any]]]], str],
                argv: list[str] | None) -> int:
    """The command line of a benchmark of rounds: ``--quick``, ``--repeats``, ``--seconds``;
    prints the table and returns 0 when every measurement succeeded."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}",
                                     description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--seconds", type=float, help="timed seconds per measurement")
    args = parser.parse_args(argv)
    records = run(1 if args.quick else args.repeats, quick=args.quick, seconds=args.seconds)
    print(markdown(records))
    return 0 if all("error" not in r for rs in records.values() for r in rs) else 1


def main(argv: list[str] | None = None) -> int:
    return rounds_main("benchmarks.bench_modes", __doc__ or "", run, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
