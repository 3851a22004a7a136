"""The suite: which measurements run, in what interleaved order, and what is kept.

``run()`` plans every (scenario, contender) pair, repeats the whole plan a few
times with the contenders' order rotated each round (so slow drifts of a
shared machine hit every contender alike), hands each measurement to the
harness, and turns the records into medians, ratios, the issue's targets, a
markdown table and a JSON file. It never touches a socket itself.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import inspect
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import _harness, _report
from benchmarks import scenarios as scenario_table

RESULTS_DIR = Path(__file__).resolve().parent / "results"
FULL_REPEATS = 5
QUICK_REPEATS = 1
OTHER_BENCHMARKS = ("benchmarks.bench_codec", "benchmarks.bench_mux")


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("feedmux", "numpy", "zmq", "msgpack", "pescador", "torch", "psutil"):
        try:
            module = importlib.import_module(name)
        except Exception:
            found[name] = None
            continue
        found[name] = str(getattr(module, "__version__", "?"))
    try:
        import zmq

        found["libzmq"] = zmq.zmq_version()
    except ImportError:
        found["libzmq"] = None
    return found


def _source_revision() -> dict[str, Any]:
    """The commit of the checkout the suite runs from, and whether it had local changes."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "--short", "HEAD"), "local_changes": bool(changed)}


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "load_average": list(os.getloadavg()),
    }


def plan(
    chosen: Sequence[scenario_table.Scenario], repeats: int, only: Sequence[str] | None = None
) -> list[tuple[int, scenario_table.Scenario, scenario_table.Contender]]:
    """Every measurement in run order: round after round, contenders rotated each round."""
    order = []
    for round_index in range(repeats):
        for scenario in chosen:
            contenders = [c for c in scenario.contenders if not only or c.peer in only]
            if not contenders:
                continue
            shift = round_index % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                order.append((round_index, scenario, contender))
    return order


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _progress_line(index: int, total: int, record: dict[str, Any]) -> str:
    transport = record["contender"]["transport"]
    head = f"[{index}/{total}] {record['scenario']:<12} {record['label']:<34} {transport:<5}"
    if "error" in record:
        return f"{head} FAILED: {_report._first_line(record['error'])}"
    line = (
        f"{head} {record['samples_per_second']:>12,.0f} samples/s"
        f"  {record['trainer_cpu_us_per_sample']:8.2f} µs CPU/sample"
    )
    if (record.get("gb_per_second") or 0) >= 0.01:
        line += f"  {record['gb_per_second']:.2f} GB/s"
    if record.get("shares"):
        line += "  shares " + "/".join(f"{share:.0%}" for share in record["shares"])
    return line


def run(
    quick: bool = False,
    scenarios: Sequence[str] | None = None,
    *,
    repeats: int | None = None,
    seconds: float | None = None,
    peers: Sequence[str] | None = None,
    results_dir: str | os.PathLike[str] | None = RESULTS_DIR,
    progress: Callable[[str], None] | None = _say,
) -> dict[str, Any]:
    """Run the benchmark suite and return every figure.

    Parameters
    ----------
    quick : a tiny run (a few samples per measurement, one round): checks that
        everything works, measures nothing worth quoting.
    scenarios : keys or numbers of the scenarios to run (default: all).
    repeats : rounds of the whole plan (default 5, or 1 when quick).
    seconds : timed seconds per measurement, overriding each scenario's own.
    peers : run only these contenders ("feedmux", "pyzmq", "pescador", "torch", "inline").
    results_dir : where the JSON goes (None: not written).
    progress : called with one line per finished measurement (None: silent).

    Returns
    -------
    A dict with ``meta``, ``measurements`` (raw records), ``summary`` (medians
    and ratios per scenario), ``targets`` and ``markdown``.
    """
    chosen = scenario_table.select(list(scenarios) if scenarios else None)
    rounds = repeats if repeats is not None else (QUICK_REPEATS if quick else FULL_REPEATS)
    order = plan(chosen, rounds, peers)
    if any(contender.peer == "torch" for _, _, contender in order):
        # Imported once here, before the trainer processes fork, instead of in each.
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    started = datetime.datetime.now(datetime.timezone.utc)
    meta: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "quick": quick,
        "repeats": rounds,
        "seconds": seconds,
        "scenarios": [s.key for s in chosen],
        "peers": list(peers) if peers else None,
        "versions": _versions(),
        "source": _source_revision(),
        "machine": _machine(),
    }
    sizes = {s.key: scenario_table.sample_nbytes(s.kind) for s in chosen}
    records = []
    for index, (round_index, scenario, contender) in enumerate(order, start=1):
        budget = (
            _harness.Budget.quick(scenario) if quick else _harness.Budget.full(scenario, seconds)
        )
        record = _harness.measure(scenario, contender, budget)
        record["round"] = round_index
        record["sample_bytes"] = sizes[scenario.key]
        records.append(_report.derive(record, sizes[scenario.key]))
        if progress is not None:
            progress(_progress_line(index, len(order), record))
    meta["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta["machine"]["load_average_after"] = list(os.getloadavg())
    summary = {s.key: _report.summarize(s, records) for s in chosen}
    checks = _report.targets(summary)
    result: dict[str, Any] = {
        "meta": meta,
        "measurements": records,
        "summary": summary,
        "targets": checks,
        "markdown": _describe_run(meta) + _report.markdown(chosen, summary, checks),
    }
    if results_dir is not None:
        directory = Path(results_dir)
        directory.mkdir(parents=True, exist_ok=True)
        stamp = started.strftime("%Y%m%d-%H%M%S")
        path = directory / f"bench-{stamp}{'-quick' if quick else ''}.json"
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        result["path"] = str(path)
    return result


def _describe_run(meta: dict[str, Any]) -> str:
    machine, versions = meta["machine"], meta["versions"]
    before = ", ".join(f"{load:.1f}" for load in machine["load_average"])
    after = ", ".join(f"{load:.1f}" for load in machine["load_average_after"])
    commit = meta["source"]["commit"] or "unknown"
    if meta["source"]["local_changes"]:
        commit += " with local changes"
    return (
        f"Run of {meta['started']} ({'quick, ' if meta['quick'] else ''}"
        f"{meta['repeats']} round{'s' if meta['repeats'] != 1 else ''}), feedmux at {commit}; "
        f"{machine['cpus']} CPUs, load average {before} before and {after} after; "
        f"Python {versions['python']}, pyzmq {versions['zmq']} (libzmq {versions['libzmq']}), "
        f"numpy {versions['numpy']}, pescador {versions['pescador']}, "
        f"torch {versions['torch']}.\n\n"
    )


def run_others(quick: bool = False) -> dict[str, Any]:
    """Run the other benchmark modules of the package (codec, mux) when they exist.

    Returns each module's own result by module name; each result's markdown
    table, when it has one, is printed.
    """
    outcomes: dict[str, Any] = {}
    for name in OTHER_BENCHMARKS:
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        runner = getattr(module, "run", None)
        if runner is None:
            continue
        accepted = inspect.signature(runner).parameters
        options: dict[str, Any] = {}
        if "quick" in accepted:
            options["quick"] = quick
        if "echo" in accepted:
            options["echo"] = False
        outcome = runner(**options)
        outcomes[name] = outcome
        if isinstance(outcome, dict) and isinstance(outcome.get("markdown"), str):
            print(f"\n## {name}\n\n{outcome['markdown']}", flush=True)
    return outcomes
