"""``python -m benchmarks``: run the suite and print the markdown table."""

from __future__ import annotations

import argparse
import sys

from benchmarks import _suite
from benchmarks.scenarios import SCENARIOS


def _parser() -> argparse.ArgumentParser:
    scenario_help = ", ".join(f"{s.number}/{s.key}" for s in SCENARIOS)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="feedmux against raw pyzmq, pescador ZMQStreamer, torch DataLoader and "
        "the in-process generator: interleaved, repeated, medians and ratios.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny run that checks everything works"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help=f"run only this scenario (repeatable): {scenario_help}",
    )
    parser.add_argument(
        "--peer",
        action="append",
        choices=["feedmux", "pyzmq", "pescador", "torch", "inline"],
        help="run only this contender (repeatable)",
    )
    parser.add_argument("--repeats", type=int, help="rounds of the whole plan (default 5)")
    parser.add_argument("--seconds", type=float, help="timed seconds per measurement")
    parser.add_argument(
        "--no-json", action="store_true", help="do not write the JSON file of raw figures"
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="also run the codec and mux micro-benchmarks (benchmarks.bench_codec, bench_mux)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = _suite.run(
            quick=args.quick,
            scenarios=args.scenario,
            repeats=args.repeats,
            seconds=args.seconds,
            peers=args.peer,
            results_dir=None if args.no_json else _suite.RESULTS_DIR,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(result["markdown"])
    if "path" in result:
        print(f"raw figures: {result['path']}", file=sys.stderr)
    if args.all:
        _suite.run_others(quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
