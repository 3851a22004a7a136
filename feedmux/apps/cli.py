"""The ``feedmux`` command line: argument parsing only.

Each sub-command parses its arguments and calls the library; no sampling,
socket or protocol logic lives here. This module owns what a user sees of a
mistake on the command line: a parse error names what was expected and what
came, a library error is one line on stderr with the exit code, never a raw
traceback, and a closed output pipe (``feedmux top | head``) ends quietly.
A sub-command is one ``_command(...)`` call and one handler; ``--log-level``
is accepted before or after any of them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable, Sequence

from feedmux._plumbing.shm import DEFAULT_SHM_SIZE
from feedmux._plumbing.sockets import DEFAULT_BIND, DEFAULT_HWM
from feedmux._stderrlog import install as install_logging
from feedmux._version import __version__

EXIT_FAILED, EXIT_USAGE = 1, 2
#: Exit code after Ctrl-C (128 + SIGINT), as a shell reports it.
EXIT_INTERRUPTED = 130
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

Handler = Callable[[argparse.Namespace], int]


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
_non_negative_int = _int_at_least(0, "an integer >= 0")


def _workers(text: str) -> int | str:
    """An argparse type: ``N``, ``auto``, ``auto:MAX`` or ``auto:MIN-MAX``."""
    from feedmux.server.config import parse_workers

    try:
        parsed = parse_workers(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text if parsed.auto else parsed.minimum
_count = _int_at_least(0, "an integer >= 0")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _edges(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated, strictly ascending lengths >= 1.

    Examples
    --------
    >>> _edges("16,64,256")
    (16, 64, 256)
    """
    try:
        edges = tuple(int(part) for part in text.split(","))
    except ValueError:
        edges = ()
    if not edges or any(edge < 1 for edge in edges) or any(
            b <= a for a, b in itertools.pairwise(edges)):
        raise argparse.ArgumentTypeError(
            f"expected strictly ascending lengths >= 1 separated by commas, got {text!r}")
    return edges


def _log_level(text: str) -> str:
    """An argparse type: a logging level name, in any case.

    Examples
    --------
    >>> _log_level("debug")
    'DEBUG'
    """
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return text.upper()


def _add_log_level(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                   default: str | None) -> None:
    # A sub-command's copy has no default, so it never undoes one given before the command.
    parser.add_argument("--log-level", type=_log_level, metavar="LEVEL",
                        default=argparse.SUPPRESS if default is None else default,
                        help="how much to log: DEBUG, INFO, WARNING, ERROR or CRITICAL "
                             "(default INFO)")


def _command(commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
             handler: Handler, text: str, description: str = "",
             log_level: bool = True) -> argparse.ArgumentParser:
    """A sub-command named ``name`` that runs ``handler(args)`` (``--log-level`` added
    unless it places it in a group of its own: ``log_level=False``)."""
    parser = commands.add_parser(name, help=text, description=description or text)
    parser.set_defaults(handler=handler)
    if log_level:
        _add_log_level(parser, None)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="feedmux",
        description="A ZeroMQ data server for machine-learning training.",
    )
    parser.add_argument("--version", action="version", version=f"feedmux {__version__}")
    _add_log_level(parser, "INFO")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(_command(
        commands, "serve", _serve, "run a sampler server",
        "Serve the samples of a streamer, a mux, or a factory returning one, to trainers "
        "that read them with feedmux.RemoteLoader.", log_level=False))
    scale = _command(commands, "scale", _scale,
                     "set the number of sampling workers of a running server")
    _add_inspect(scale, "scale")
    scale.add_argument("workers", type=_non_negative_int, metavar="N",
                       help="workers to run from now on (0: back to --workers auto)")
    for name, text in (("stats", "print a server's statistics"),
                       ("ping", "exit 0 if a server answers, 1 otherwise"),
                       ("top", "a live view of one or more servers (q or Ctrl-C quits)")):
        _add_inspect(_command(commands, name, _top if name == "top" else _stats, text), name)
    audit = _command(
        commands, "audit", _audit,
        "check what a job's loaders handed out (exit 0 ok, 1 problems, 2 bad input)",
        "Read the audit logs of a job's loaders (RemoteLoader(audit_log=...)), its "
        "restarts included, and report per epoch of each server what was missing or "
        "repeated. Exit 0: nothing wrong; 1: problems; 2: unreadable input.")
    audit.add_argument("logs", nargs="+", metavar="LOG", help="audit log files of the job")
    audit.add_argument("--reference", nargs="+", default=[], metavar="LOG",
                       help="the logs of an uninterrupted run of the same seeded job: each "
                            "rank must have handed out the same sequence")
    audit.add_argument("--epochs", type=_positive_int, metavar="N",
                       help="the server served N epochs (serve --epochs N) and the job is over: "
                            "each must have been handed out whole (default: the epochs "
                            "seen, and any gap between them)")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    keygen = _command(commands, "keygen", _keygen,
                      "make a CURVE key pair (NAME.key, NAME.key_secret)")
    keygen.add_argument("directory", help="where to write the two files (made if missing)")
    keygen.add_argument("--name", default="server", help="file name stem (default server)")
    demo = _command(commands, "demo", _demo, "a server and two trainers on example data")
    demo.add_argument("--files", type=_positive_int, default=3,
                      help="example data files, one streamer each (default 3)")
    demo.add_argument("--examples", type=_positive_int, default=1000,
                      help="examples per file (default 1000)")
    demo.add_argument("--epochs", type=_positive_int, default=3, help="epochs (default 3)")
    demo.add_argument("--trainers", type=_positive_int, default=2,
                      help="trainer processes (default 2)")
    demo.add_argument("--workers", type=_positive_int, default=1,
                      help="sampling processes (default 1)")
    return parser


def _add_serve(serve: argparse.ArgumentParser) -> None:
    basics = serve.add_argument_group("the basics")
    basics.add_argument(
        "source", metavar="MODULE:ATTR",
        help="what to serve: a streamer, a mux, or a function returning one, e.g. "
             "mydata:make_mux (imported from the current directory first, as python -m does)")
    basics.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword argument for the function, repeatable; the value is "
                             "read as JSON (3, 0.5, true, [1,2]), else taken as a string "
                             "(default: none)")
    basics.add_argument("--bind", default=DEFAULT_BIND, metavar="ENDPOINT",
                        help=f"where trainers connect for data (default {DEFAULT_BIND}: this "
                             "host only; tcp://0.0.0.0:5555 listens on every interface)")
    basics.add_argument("--control", metavar="ENDPOINT",
                        help="where trainers and feedmux stats/ping/top talk to the server "
                             "(default: the data port + 1; port 0 if the data port is 0)")
    basics.add_argument("--epochs", type=_positive_int, metavar="N",
                        help="stop after N epochs; trainers then see the end of the stream "
                             "(default: serve forever)")
    basics.add_argument("--epoch-size", type=_positive_int, metavar="N",
                        help="how many samples an epoch has, so that len(loader) works from "
                             "the start (default: counted during the first epoch)")
    basics.add_argument("--seed", type=_count, metavar="N",
                        help="reseed every sampling process at each epoch from (seed, worker, "
                             "epoch), so that a run can be repeated (default: the mux's "
                             "integer random_state, else fresh each run, and logged)")
    basics.add_argument("--no-shuffle", action="store_true",
                        help="a served map-style dataset (a torch Dataset, a list, an array): "
                             "its indices in order every epoch (default: a permutation of "
                             "them drawn from (seed, epoch))")
    basics.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                        help="a streamer that raises (or a sample that cannot be sent) stops "
                             "the server and the trainers get the error, naming the streamer "
                             "(raise), or only that stream (sample) is dropped, counted and "
                             "logged (skip) (default raise)")
    basics.add_argument("--max-skips", type=_count, default=1000, metavar="N",
                        help="with --on-error skip: stop the run when N errors in a row were "
                             "skipped without a sample sent, or every sample of an epoch "
                             "(0: only the latter) (default 1000)")

    ranks = serve.add_argument_group("several trainers and DDP")
    ranks.add_argument("--min-trainers", type=_count, default=1, metavar="N",
                       help="start sampling once N trainers are connected, so that a short "
                            "run is split among all of them (default 1: at the first trainer; "
                            "0 means the same)")
    ranks.add_argument("--uneven", choices=("pad", "drop"), default="pad",
                       help="ranked trainers (RemoteLoader(rank=, world_size=)): when the epoch "
                            "does not divide by the ranks, pad the last round with repeats so "
                            "every rank gets ceil(E/n) samples, or drop it so each gets E//n "
                            "(default pad)")
    ranks.add_argument("--bucket-by", default="", metavar="KEY",
                       help="ranked trainers with batch_size=: deal each step's batches from "
                            "samples of similar length, read from the sample's field KEY (an "
                            "int, or an array's first dimension), for ranks that name no "
                            "bucket_by= themselves (default: only ranks that ask)")
    ranks.add_argument("--bucket-window", type=_count, default=0, metavar="N",
                       help="with bucket_by: hold up to N drawn samples to group by length "
                            "(default 0: 16 steps of world_size x batch_size)")
    ranks.add_argument("--bucket-edges", type=_edges, default=(), metavar="L1,L2,...",
                       help="with bucket_by: deal a step as soon as one bucket of lengths "
                            "[L(i-1), Li) holds one (default: none, the runs of similar "
                            "lengths in the window)")
    ranks.add_argument("--rank-timeout", type=_positive_float, default=60.0, metavar="S",
                       help="ranked trainers: stop with an error if not every rank has "
                            "connected S seconds after the first (default 60)")

    reliable = serve.add_argument_group("reliability and resume")
    reliable.add_argument("--reliable", action="store_true",
                          help="deprecated, does nothing: every free trainer gets credit and "
                               "acknowledges its hand-outs by default, so what a trainer that "
                               "dies had not handed out goes to the others")
    reliable.add_argument("--drain-timeout", type=_positive_float, default=30.0, metavar="S",
                          help="at the end of the stream, wait up to S seconds for the trainers "
                               "to receive what was sent to them (default 30)")

    groups = serve.add_argument_group("consumer groups")
    groups.add_argument("--group-buffer", metavar="N|SIZE",
                        help="the consumer groups' buffer (RemoteLoader(group=...): each group "
                             "gets the whole stream, sampled once): keep N messages or SIZE "
                             "bytes (e.g. 64MiB) for the slowest group, and serve groups from "
                             "the start (default 64MiB, groups from the first that asks)")
    groups.add_argument("--join", choices=("epoch", "now"), default="epoch",
                        help="a group that joins mid-stream starts at the next epoch boundary "
                             "(epoch) or at once (now) (default epoch)")
    groups.add_argument("--group-timeout", type=_positive_float, default=10.0, metavar="S",
                        help="forget a group S seconds after its last trainer left, so it no "
                             "longer holds the others back (default 10)")

    speed = serve.add_argument_group("performance")
    speed.add_argument("--workers", type=_workers, default=1, metavar="N|auto[:[MIN-]MAX]",
                       help="sampling processes; the source's shards are split among them "
                            "(default 1: sampling in the server process). auto: start with "
                            "MIN (default 1) and add or remove workers while serving, up to "
                            "MAX (default 16); feedmux scale sets the count live")
    speed.add_argument("--shards", type=_positive_int, metavar="N",
                       help="split the source into N shards (default: from the source, "
                            "logged); a seeded run's order depends on the shards only, "
                            "never on the workers")
    speed.add_argument("--hwm", type=_positive_int, default=DEFAULT_HWM, metavar="N",
                       help="data messages queued per trainer before sampling waits for it: "
                            f"bounds the server's memory (default {DEFAULT_HWM})")
    speed.add_argument("--samples-per-message", type=_positive_int, metavar="N",
                       help="samples sent together in one message (default: sized from the "
                            "first sample, more for small ones)")
    speed.add_argument("--zero-copy", action="store_true",
                       help="send arrays without copying them first: only for a streamer that "
                            "never reuses an array it yielded (default off: one copy each)")
    speed.add_argument("--no-shm", action="store_true",
                       help="never use shared memory with trainers on this host (default: "
                            "large arrays go through a shared-memory pool)")
    speed.add_argument("--compress", default="auto",
                       metavar="auto|off|lz4|zstd[:LEVEL][+delta]",
                       help="compress the messages to trainers on other hosts: auto decides "
                            "per trainer from the stream's ratio and whether the link or the "
                            "CPU is the limit; never to a trainer on this host that reads "
                            "shared memory; +delta filters integer images before zstd "
                            "(default auto)")
    speed.add_argument("--shm-size", type=_positive_int, default=DEFAULT_SHM_SIZE >> 20,
                       metavar="MIB", help="size of that pool, in MiB "
                       f"(default {DEFAULT_SHM_SIZE >> 20})")

    security = serve.add_argument_group("security")
    security.add_argument("--curve-secret", metavar="FILE",
                          help="the server's secret certificate (feedmux keygen): CURVE "
                               "encryption on every socket (default: none)")
    security.add_argument("--curve-clients", metavar="DIR",
                          help="let in only the clients whose public certificates are in DIR "
                               "(default: any client that knows the server's public key)")

    observe = serve.add_argument_group("observability")
    _add_log_level(observe, None)
    observe.add_argument("--log-every", type=_positive_float, default=10.0, metavar="S",
                         help="seconds between throughput log lines (default 10)")
    observe.add_argument("--count-field", default="", metavar="FIELD",
                         help="also report FIELD of the samples per second (its length, "
                              "e.g. tokens, or its value) in the log, the stats and top "
                              "(default: samples only)")
    observe.add_argument("--metrics-port", type=int, metavar="PORT",
                         help="serve Prometheus metrics on http://HOST:PORT/metrics (needs "
                              "feedmux[metrics]; 0 picks a free port) (default: off)")
    observe.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                         help="interface of the metrics endpoint (default 127.0.0.1: this "
                              "host only)")


def _add_inspect(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("address", nargs="+" if name == "top" else None, metavar="CONTROL",
                        help="the server's control endpoint, e.g. tcp://127.0.0.1:5556 "
                             "(by default the data port + 1)")
    parser.add_argument("--timeout", type=_positive_float, default=2.0, metavar="S",
                        help="seconds to wait for an answer (default 2)")
    parser.add_argument("--curve-server-key", metavar="KEY",
                        help="the server's public key (.key file or Z85) if it uses CURVE")
    parser.add_argument("--curve-certificate", metavar="FILE",
                        help="this client's secret certificate (default: a fresh key pair)")
    if name == "top":
        parser.add_argument("--interval", type=_positive_float, default=1.0, metavar="S",
                            help="seconds between refreshes (default 1)")
        parser.add_argument("--count", type=_positive_int, metavar="N",
                            help="stop after N refreshes (default: until q or Ctrl-C)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``feedmux`` command; return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    install_logging(args.log_level)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        return handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (feedmux top | head): nothing more to say, and nothing to
        # flush at exit either (that flush would raise again).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


def _serve(args: argparse.Namespace) -> int:
    from feedmux.errors import ConfigurationError, FactoryError
    from feedmux.server.config import RELIABLE_IS_DEFAULT
    from feedmux.server.factory import parse_factory_args
    from feedmux.server.server import Server

    if args.reliable:
        print(f"feedmux serve: warning: --{RELIABLE_IS_DEFAULT[0].lower()}"
              f"{RELIABLE_IS_DEFAULT[1:]}", file=sys.stderr)
    # As python -m does: a module in the current directory is found first.
    if sys.path[:1] not in ([""], [os.getcwd()]):
        sys.path.insert(0, os.getcwd())
    try:
        kwargs = parse_factory_args(args.arg)
        server = Server(
            args.source, factory_kwargs=kwargs, bind=args.bind, control=args.control,
            workers=args.workers, shards=args.shards, epochs=args.epochs,
            epoch_size=args.epoch_size, hwm=args.hwm,
            samples_per_message=args.samples_per_message, on_error=args.on_error,
            max_skips=args.max_skips,
            log_every=args.log_every, count_field=args.count_field,
            drain_timeout=args.drain_timeout,
            min_trainers=args.min_trainers, zero_copy=args.zero_copy,
            uneven=args.uneven, rank_timeout=args.rank_timeout, bucket_by=args.bucket_by,
            bucket_window=args.bucket_window, bucket_edges=args.bucket_edges,
            group_buffer=_group_buffer(args.group_buffer), join=args.join,
            group_timeout=args.group_timeout,
            curve_secret=args.curve_secret, curve_clients=args.curve_clients,
            metrics_port=args.metrics_port, metrics_host=args.metrics_host, seed=args.seed,
            shuffle=not args.no_shuffle,
            shm=not args.no_shm, shm_size=args.shm_size << 20, compress=args.compress,
        )
    except (FactoryError, ConfigurationError) as error:
        print(f"feedmux serve: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return server.run()


def _audit(args: argparse.Namespace) -> int:
    from feedmux._auditlog import AuditLogError
    from feedmux.apps.audit import audit, load_sessions

    try:
        report = audit(load_sessions(args.logs),
                       load_sessions(args.reference) if args.reference else (),
                       epochs=args.epochs)
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
    from feedmux.errors import ConfigurationError, FeedmuxError

    try:
        stats = fetch_stats(args.address, timeout=args.timeout,
                            curve_server_key=args.curve_server_key,
                            curve_certificate=args.curve_certificate)
    except (FeedmuxError, OSError) as error:
        print(f"feedmux {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE if isinstance(error, ConfigurationError) else EXIT_FAILED
    if args.command == "ping":
        print(f"ok: server {stats.get('server_id')} at {args.address}")
    else:
        print(json.dumps(stats, indent=2, sort_keys=True))
    return 0


def _scale(args: argparse.Namespace) -> int:
    from feedmux.client._endpoints import request_scale
    from feedmux.errors import ConfigurationError, FeedmuxError

    try:
        answer = request_scale(args.address, args.workers, timeout=args.timeout,
                               curve_server_key=args.curve_server_key,
                               curve_certificate=args.curve_certificate)
    except (FeedmuxError, OSError) as error:
        print(f"feedmux scale: error: {error}", file=sys.stderr)
        return EXIT_USAGE if isinstance(error, ConfigurationError) else EXIT_FAILED
    print(f"ok: {args.address} asked to run {answer.get('workers_requested')} worker(s)")
    return 0


def _top(args: argparse.Namespace) -> int:
    from feedmux.apps.top import run_top
    from feedmux.client.remote import check_endpoint, fetch_stats
    from feedmux.errors import FeedmuxError

    try:
        for address in args.address:
            check_endpoint(address, "control endpoint")
    except FeedmuxError as error:
        print(f"feedmux top: error: {error}", file=sys.stderr)
        return EXIT_USAGE

    def fetch(address: str) -> dict[str, object]:
        return fetch_stats(address, timeout=args.timeout, curve_server_key=args.curve_server_key,
                           curve_certificate=args.curve_certificate)

    return run_top(args.address, fetch, interval=args.interval, count=args.count)


def _keygen(args: argparse.Namespace) -> int:
    from feedmux._plumbing.curve import create_keys
    from feedmux.errors import FeedmuxError

    try:
        public, secret = create_keys(args.directory, args.name)
    except (FeedmuxError, OSError) as error:
        print(f"feedmux keygen: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from feedmux.apps.demo import run_demo

    return run_demo(files=args.files, examples=args.examples, epochs=args.epochs,
                    trainers=args.trainers, workers=args.workers)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
