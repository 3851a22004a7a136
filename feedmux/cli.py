"""The ``feedmux`` command line: argument parsing only.

Each sub-command parses its arguments and calls the library; no sampling,
socket or protocol logic lives here.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence

from feedmux._shm import DEFAULT_SHM_SIZE
from feedmux._transport import DEFAULT_BIND, DEFAULT_HWM
from feedmux._version import __version__

EXIT_USAGE = 2


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``, else "expected <what>, got ..."."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_seed = _int_at_least(0, "an integer >= 0")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="feedmux",
        description="A ZeroMQ data server for machine-learning training.",
    )
    parser.add_argument("--version", action="version", version=f"feedmux {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser(
        "serve", help="run a sampler server",
        description="Serve the samples of a streamer, a mux, or a factory returning one.",
    )
    serve.add_argument("source", metavar="MODULE:ATTR",
                       help="e.g. mypkg.data:make_mux (a streamer, a mux, or a factory)")
    serve.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                       help="keyword argument for the factory (JSON value, else a string)")
    serve.add_argument("--bind", default=DEFAULT_BIND,
                       help=f"data endpoint (default {DEFAULT_BIND})")
    serve.add_argument("--control",
                       help="control endpoint (default: data port + 1; port 0 if that is 0)")
    serve.add_argument("--workers", type=_positive_int, default=1,
                       help="sampling processes (default 1)")
    serve.add_argument("--seed", type=_seed,
                       help="reseed every sampling process per epoch from (seed, worker, epoch) "
                            "(default: the mux's integer random_state, else fresh each run)")
    serve.add_argument("--epochs", type=_positive_int, help="stop after N epochs (default: never)")
    serve.add_argument("--epoch-size", type=_positive_int,
                       help="declare the epoch size (default: measured after one epoch)")
    serve.add_argument("--hwm", type=_positive_int, default=DEFAULT_HWM,
                       help=f"messages queued per trainer (default {DEFAULT_HWM})")
    serve.add_argument("--samples-per-message", type=_positive_int,
                       help="fixed transport batch (default: sized from the samples)")
    serve.add_argument("--min-trainers", type=int, default=0, metavar="N",
                       help="start sampling once N trainers are connected (default 0)")
    serve.add_argument("--zero-copy", action="store_true",
                       help="send arrays without copying them: only for a streamer that never "
                       "reuses an array it yielded")
    serve.add_argument("--uneven", choices=("pad", "drop"), default="pad",
                       help="ranked trainers: pad the last round with repeats so every rank "
                            "gets ceil(E/n) samples, or drop it: E//n (default pad)")
    serve.add_argument("--rank-timeout", type=_positive_float, default=60.0, metavar="S",
                       help="ranked trainers: fail if not all ranks connect within S seconds "
                            "of the first (default 60)")
    serve.add_argument("--group-buffer", metavar="N|SIZE",
                       help="serve consumer groups (RemoteLoader(group=...)): each group gets the "
                            "whole stream, sampled once; buffer N messages or SIZE bytes "
                            "(e.g. 64MiB) for the slowest group (default: no groups)")
    serve.add_argument("--join", choices=("epoch", "now"), default="epoch",
                       help="groups: a group joining mid-stream starts at the next epoch "
                            "boundary, or at once (default epoch)")
    serve.add_argument("--group-timeout", type=_positive_float, default=10.0, metavar="S",
                       help="groups: drop a group S seconds after its last member left "
                            "(default 10)")
    serve.add_argument("--reliable", action="store_true",
                       help="acknowledged delivery: nothing is lost when a trainer dies")
    serve.add_argument("--no-shm", action="store_true",
                       help="never use shared memory with trainers on this host")
    serve.add_argument("--shm-size", type=_positive_int, default=DEFAULT_SHM_SIZE >> 20,
                       metavar="MIB", help="the shared-memory pool for trainers on this host, "
                       f"in MiB (default {DEFAULT_SHM_SIZE >> 20})")
    serve.add_argument("--curve-secret", metavar="FILE",
                       help="the server's secret certificate: CURVE on every socket")
    serve.add_argument("--curve-clients", metavar="DIR",
                       help="only clients whose certificates are in DIR may connect")
    serve.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                       help="a streamer that raises stops the server (raise) or is skipped")
    serve.add_argument("--log-every", type=_positive_float, default=10.0,
                       help="seconds between throughput log lines (default 10)")
    serve.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="serve Prometheus metrics on http://HOST:PORT/metrics "
                            "(needs feedmux[metrics]; 0 picks a free port)")
    serve.add_argument("--metrics-host", default="127.0.0.1",
                       help="interface of the metrics endpoint (default 127.0.0.1: loopback)")
    serve.add_argument("--drain-timeout", type=_positive_float, default=30.0,
                       help="seconds a finished server waits for trainers to drain (default 30)")

    for name, text in (("stats", "print a server's statistics"),
                       ("ping", "exit 0 if a server answers, 1 otherwise"),
                       ("top", "a live view of one or more servers (q or Ctrl-C quits)")):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("address", nargs="+" if name == "top" else None,
                         help="the control endpoint, e.g. tcp://127.0.0.1:5556")
        sub.add_argument("--timeout", type=_positive_float, default=2.0,
                         help="seconds to wait for an answer (default 2)")
        sub.add_argument("--curve-server-key", metavar="KEY",
                         help="the server's public key (.key file or Z85) if it uses CURVE")
        sub.add_argument("--curve-certificate", metavar="FILE",
                         help="this client's secret certificate (default: a fresh key pair)")

        if name == "top":
            sub.add_argument("--interval", type=_positive_float, default=1.0,
                             help="seconds between refreshes (default 1)")
            sub.add_argument("--count", type=_positive_int,
                             help="stop after N refreshes (default: until q or Ctrl-C)")

    audit = commands.add_parser(
        "audit", help="check what a job's loaders handed out (exit 0 ok, 1 problems, 2 bad input)",
        description="Read the audit logs of a job's loaders (RemoteLoader(audit_log=...)), its "
                    "restarts included, and report per epoch of each server what was missing or "
                    "repeated. Exit 0: nothing wrong; 1: problems; 2: unreadable input.")
    audit.add_argument("logs", nargs="+", metavar="LOG", help="audit log files of the job")
    audit.add_argument("--reference", nargs="+", default=[], metavar="LOG",
                       help="the logs of an uninterrupted run of the same seeded job: each "
                            "rank must have handed out the same sequence")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")

    keygen = commands.add_parser("keygen", help="make a CURVE key pair (NAME.key, NAME.key_secret)")
    keygen.add_argument("directory")
    keygen.add_argument("--name", default="server", help="file name stem (default: server)")

    demo = commands.add_parser("demo", help="a server and two trainers on example data")
    demo.add_argument("--files", type=_positive_int, default=3)
    demo.add_argument("--examples", type=_positive_int, default=1000, help="examples per file")
    demo.add_argument("--epochs", type=_positive_int, default=3)
    demo.add_argument("--trainers", type=_positive_int, default=2)
    demo.add_argument("--workers", type=_positive_int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``feedmux`` command; return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "serve":
        return _serve(args)
    if args.command in ("stats", "ping"):
        return _stats(args)
    if args.command == "top":
        return _top(args)
    if args.command == "audit":
        return _audit(args)
    if args.command == "keygen":
        from feedmux._security import create_keys

        public, secret = create_keys(args.directory, args.name)
        print(f"public key: {public}\nsecret key: {secret} (keep it private)")
        return 0
    from feedmux.demo import run_demo

    return run_demo(files=args.files, examples=args.examples, epochs=args.epochs,
                    trainers=args.trainers, workers=args.workers)


def _serve(args: argparse.Namespace) -> int:
    from feedmux.errors import ConfigurationError, FactoryError
    from feedmux.server.factory import parse_factory_args
    from feedmux.server.server import Server

    try:
        kwargs = parse_factory_args(args.arg)
        server = Server(
            args.source, factory_kwargs=kwargs, bind=args.bind, control=args.control,
            workers=args.workers, epochs=args.epochs, epoch_size=args.epoch_size, hwm=args.hwm,
            samples_per_message=args.samples_per_message, on_error=args.on_error,
            log_every=args.log_every, drain_timeout=args.drain_timeout,
            min_trainers=args.min_trainers, reliable=args.reliable, zero_copy=args.zero_copy,
            uneven=args.uneven, rank_timeout=args.rank_timeout,
            group_buffer=_group_buffer(args.group_buffer), join=args.join,
            group_timeout=args.group_timeout,
            curve_secret=args.curve_secret, curve_clients=args.curve_clients,
            metrics_port=args.metrics_port, metrics_host=args.metrics_host, seed=args.seed,
            shm=not args.no_shm, shm_size=args.shm_size << 20,
        )
    except (FactoryError, ConfigurationError) as error:
        print(f"feedmux serve: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return server.run()


def _audit(args: argparse.Namespace) -> int:
    from feedmux._audit import audit, load_sessions
    from feedmux._auditlog import AuditLogError

    try:
        report = audit(load_sessions(args.logs),
                       load_sessions(args.reference) if args.reference else ())
    except AuditLogError as error:
        print(f"feedmux audit: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.text())
    return 0 if report.ok else 1


def _group_buffer(text: str | None) -> int | str | None:
    """``--group-buffer``: digits are a count of messages, anything else a size."""
    return int(text) if text is not None and text.strip().isdigit() else text


def _stats(args: argparse.Namespace) -> int:
    from feedmux.client.remote import fetch_stats
    from feedmux.errors import FeedmuxError

    try:
        stats = fetch_stats(args.address, timeout=args.timeout,
                            curve_server_key=args.curve_server_key,
                            curve_certificate=args.curve_certificate)
    except FeedmuxError as error:
        print(f"feedmux {args.command}: {error}", file=sys.stderr)
        return 1
    if args.command == "ping":
        print(f"ok: server {stats.get('server_id')} at {args.address}")
    else:
        print(json.dumps(stats, indent=2, sort_keys=True))
    return 0


def _top(args: argparse.Namespace) -> int:
    from feedmux._top import run_top
    from feedmux.client.remote import fetch_stats

    def fetch(address: str) -> dict[str, object]:
        return fetch_stats(address, timeout=args.timeout, curve_server_key=args.curve_server_key,
                           curve_certificate=args.curve_certificate)

    return run_top(args.address, fetch, interval=args.interval, count=args.count)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
