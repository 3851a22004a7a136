"""The ``feedmux`` command line: argument parsing only.

Each sub-command parses its arguments and calls the library; no sampling,
socket or protocol logic lives here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from feedmux._version import __version__


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="feedmux",
        description="A ZeroMQ data server for machine-learning training.",
    )
    parser.add_argument("--version", action="version", version=f"feedmux {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``feedmux`` command; return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    parser.error(f"unknown command {args.command!r}")
    return 2  # pragma: no cover - parser.error exits


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
