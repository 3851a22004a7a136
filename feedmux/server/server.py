"""The sampler server: runs a streamer in cycle mode and pushes its samples.

This module owns the server's life: resolving the source, running it here or
in a background process (reporting the bound endpoints to the parent),
signals, exit codes and, with ``workers > 1``, forwarding the worker
processes' messages while numbering the positions of each epoch across all
shards. It must never decide anything about trainers or the end of the
stream: the sockets are :mod:`feedmux.server._shell`'s and the decisions
:mod:`feedmux.server._control.core`'s.

The data socket is a ROUTER in every mode (each trainer's data DEALER is named
by its client id, so the server picks the trainer of every message). Free
trainers are dealt by credit and acknowledge what they handed out: what a
trainer that leaves or dies had not handed out is dealt to the others (a
rank's successor gets a rank's).
A finite run (``epochs=N``) ends with a handshake: the server asks the
trainers how many data messages they received and sends ``EndOfStream`` once
every message it sent is accounted for (or nobody's count has moved for a
while), so a trainer never mistakes a pause for the end and never stops early.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util  # noqa: F401  (registers its exit handler first)
import signal
import tempfile
import weakref
from dataclasses import replace
from types import FrameType
from typing import Any

from feedmux._plumbing.sockets import keep_freed_memory
from feedmux._stderrlog import write_stderr
from feedmux.errors import (
    ConfigurationError,
    FactoryError,
    SamplingError,
    TransportError,
)
from feedmux.protocol import EndOfStream, Error
from feedmux.sampling.datasets import dataset_of
from feedmux.sampling.epochs import EpochIterator
from feedmux.sampling.mux import restart_passes
from feedmux.server._delivery.pool import close_pool, open_pool
from feedmux.server._forward import forward, ranked_dealer
from feedmux.server._launch import (
    ChildReport,
    ServerProcess,
    check_not_nested,
    launch,
    watch_parent,
)
from feedmux.server._shell import SocketShell
from feedmux.server._sources.autoscale import usable_cpus
from feedmux.server._sources.merge import merge_block
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import failure_text, produce
from feedmux.server._sources.seeding import FRESH_ENTROPY, EpochSeeder, resolve_seed
from feedmux.server._sources.shards import MergedShards, choose_shards
from feedmux.server._sources.workers import WorkerPool
from feedmux.server._standin import ControlStandIn
from feedmux.server.config import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ServerConfig,
    deprecated_reliable,
)
from feedmux.server.factory import Source, resolve_source

__all__ = ["Server", "ServerConfig", "serve"]

log = logging.getLogger("feedmux.server")

#: Seconds ``Server.start()`` waits for the background server to bind.
START_TIMEOUT = 30.0


class _Interrupted(BaseException):
    """Raised by a second SIGINT / SIGTERM: stop now, wherever the main thread is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopFlag:
    """Set by SIGTERM / SIGINT; checked by every loop of the server.

    The handler never logs (a signal may arrive inside the logging machinery,
    which is not re-entrant): the first loop that sees the flag set does. It
    writes one line to stderr itself (a bare ``os.write``), so that whoever
    signalled a server stuck in user code knows the signal was taken. A second
    signal raises :class:`_Interrupted` in the main thread, so that a streamer
    stuck in user code, which never returns to the server's loops, still stops;
    later ones are ignored, so that they cannot cut that stop short.
    """

    def __init__(self) -> None:
        self.stopped = False
        self.signum = 0
        self.interrupted = False
        self._announced = False

    def __bool__(self) -> bool:
        if self.stopped and self.signum and not self._announced:
            self._announced = True
            log.info("received %s, shutting down", signal.Signals(self.signum).name)
        return self.stopped

    def set(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.stopped = True
        if not signum or self.interrupted:
            return
        if self.signum:
            self.interrupted = True
            raise _Interrupted(signum)
        self.signum = signum
        name = signal.Signals(signum).name
        write_stderr(f"feedmux: {name} received, stopping (another {name} stops at once)\n")


class Server:
    """A sampler server: ``run()`` it here, or ``start()`` it in a background process.

    Parameters
    ----------
    source : str, streamer or callable
        ``"module:attr"``, a Streamer / mux, or a callable returning one.
    bind : str
        The data endpoint (a ROUTER). Default ``tcp://127.0.0.1:5555``: loopback only.
    control : str, optional
        The control endpoint (ROUTER); default: the data port + 1 (port 0 when
        the data port is 0). Once bound, :attr:`data_address` and
        :attr:`control_address` give the real shell.
    workers : int
        Sampling processes; the streamers are sharded across them.
    epochs : int, optional
        Stop after this many epochs (default: serve forever).
    epoch_size : int, optional
        Declare the epoch size up front (otherwise measured after one epoch).
    hwm : int
        Messages queued per trainer before sampling blocks (bounds memory).
    samples_per_message : int, optional
        Fixed transport batch; None sizes each message from its first sample.
    reliable : bool
        Deprecated, a no-op with a DeprecationWarning: every free trainer is
        dealt by credit and acknowledges its hand-outs (what ``reliable=True``
        did), so what a trainer that dies had not handed out goes to the others.
    curve_secret : str, optional
        The server's secret certificate (``feedmux keygen``): CURVE encryption
        on the data and control sockets.
    curve_clients : str, optional
        A directory of the client certificates allowed to connect; without it,
        any client that knows the server's public key may.
    min_trainers : int
        Start sampling only once this many trainers have connected (default 0),
        so that a short run is split among all of them from its first sample
        (with consumer groups: trainers of all groups together).
    group_buffer : int or str, optional
        The consumer groups' buffer (``RemoteLoader(..., group="name")``: every
        group gets the whole stream, sampled once; any server serves them): the
        encoded messages wait in a buffer of this many messages (an int, or a
        string of digits) or bytes (``"64MiB"``); when it is full the slowest
        group holds sampling back. Given, the server serves groups from its
        start (its trainers without ``group=`` are the group ``default``, a
        ranked job too). None (default): 64 MiB; the free trainers without
        ``group=`` are the group ``default`` all the same, and a ranked job
        without ``group=`` has the server to itself.
    join : {"epoch", "now"}
        With groups: a group that joins mid-stream starts at the next epoch
        boundary (default, so it sees whole epochs only) or with the next message.
    group_timeout : float
        With groups: seconds after a group's last member left before the group
        is dropped and no longer holds sampling back (default 10).
    zero_copy : bool
        Send arrays as views of the streamer's own arrays (no copy). Only for a
        streamer that never reuses an array it yielded: by default each array is
        copied once, so that one reused for every sample cannot change a sample
        already queued (or kept for re-sending).
    on_error : {"raise", "skip"}
        A streamer that raises (or a sample the codec refuses) ends the server
        (trainers get ``RemoteError`` naming the streamer and its arguments) or
        is skipped: counted (``errors_skipped``) and logged naming the streamer.
    max_skips : int
        With ``on_error="skip"``: errors skipped in a row, with no sample sent
        in between, that stop the run with :class:`~feedmux.errors.SkipLimitError`
        naming the first (default 1000; 0: no limit). An epoch whose every
        sample was skipped stops it too, instead of serving empty epochs.
    factory_kwargs : mapping, optional
        Keyword arguments for a factory source.
    seed : int, optional
        Every sampling process reseeds ``random``, numpy's global state and
        torch's (if imported) from (seed, worker index, epoch) at each epoch
        start (docs/sampling.md). Default: the mux's integer ``random_state``,
        else fresh entropy each run (logged, so the run can be repeated).
    """

    def __init__(self, source: Source, **options: Any) -> None:
        deprecated_reliable(options)
        self.config = ServerConfig(source=source, **options)
        self._process: ServerProcess | None = None
        #: How :meth:`start` made the server process: "interpreter" (a fresh one) or
        #: "fork" (a source defined in the main script, or one that does not pickle).
        self.start_method = ""
        self._stop = _StopFlag()
        self._bound: tuple[str, str] | None = None
        self._metrics_address = ""
        # In a process started by start(): where to tell the parent what was bound.
        self._report: ChildReport | None = None
        # Why it ends, for the last log line: what stopped it from starting, who asked it
        # to stop, the endpoints whose last word says how the stream ended.
        self._failure = ""
        self._stop_reason = "asked to stop (request_stop)"
        self._endpoints: SocketShell | None = None

    @property
    def data_address(self) -> str:
        """The data endpoint as bound (a real port where ``bind`` said port 0)."""
        return self._addresses()[0]

    @property
    def control_address(self) -> str:
        """The control endpoint as bound (a real port where it said, or defaulted to, 0)."""
        return self._addresses()[1]

    @property
    def metrics_address(self) -> str | None:
        """Where the Prometheus metrics are served once bound (None without ``metrics_port``)."""
        self._addresses()
        return self._metrics_address or None

    @property
    def final_stats(self) -> dict[str, Any] | None:
        """The server's statistics as it stopped serving, in the process that ran it.

        None while it serves, and when it never opened its sockets. A server that
        ended on its own (the last epoch done) no longer answers ``fetch_stats``;
        this is what it would have said last.
        """
        return None if self._endpoints is None else self._endpoints.last_stats

    def _addresses(self) -> tuple[str, str]:
        if self._bound is None:
            raise RuntimeError("this server has not bound its endpoints yet: start() or run() it")
        return self._bound

    def _tell_parent(self, *report: str) -> None:
        if report[0] == "failed":
            self._failure = f"it could not start: {report[1]}"
        if self._report is not None:
            self._report.send(*report)
            self._report = None

    # -- running here -------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until done, failed or signalled; return the process exit code.

        The last log line says why it exits, whatever the reason.
        """
        code = self._serve()
        log.log(logging.INFO if code == EXIT_OK else logging.ERROR,
                "server %s exits with code %d: %s", self.config.server_id, code,
                self._exit_reason(code))
        return code

    def _exit_reason(self, code: int) -> str:
        if self._failure:
            return self._failure
        if code > 128:
            return f"stopped at once by a second {signal.Signals(code - 128).name}"
        if self._stop.signum:
            return f"stopped by {signal.Signals(self._stop.signum).name}"
        if self._stop.stopped:
            return self._stop_reason
        final = None if self._endpoints is None else self._endpoints.core.final_message
        if isinstance(final, Error):
            return f"{final.type.rsplit('.', 1)[-1]}: {final.message}"
        if isinstance(final, EndOfStream):
            return f"the stream ended after {final.epochs} epoch(s)"
        return "sampling failed (see above)" if code else "done"

    def _serve(self) -> int:
        config = self.config
        try:
            streamer = resolve_source(config.source, config.factory_kwargs, config.shuffle)
        except FactoryError as error:
            # The traceback of what failed inside the user's code (an import, the factory).
            log.error("%s", error, exc_info=error if error.__cause__ is not None else None)
            self._tell_parent("failed", str(error))
            return EXIT_USAGE
        # Samplers allocate large arrays (and the forwarding process receives every
        # worker message) into fresh memory: let this process and its workers reuse
        # freed buffers instead of faulting in new pages for each sample.
        keep_freed_memory()
        seed, origin = resolve_seed(config.seed, streamer)
        dataset = dataset_of(streamer)
        if dataset is not None:
            # Every process draws the epoch's permutation from the run's seed; the epoch size
            # is the dataset's (ranks know their share before the first epoch ends).
            streamer = dataset.seeded(seed)
            config = replace(config, epoch_size=config.epoch_size or len(streamer) or None)
        # Determinism is paid for only when asked for: a fixed merge order of the workers
        # (a dataset's indices in order, too).
        repeatable = origin != FRESH_ENTROPY or (dataset is not None and not dataset.shuffle)
        workers = config.worker_range
        merged = ("" if workers.maximum == 1 else
                  "; workers merged in a fixed order" if repeatable else
                  "; workers merged in arrival order: pass --seed for a repeatable order")
        log.info("seed %d (%s)%s", seed, origin, merged)
        block = merge_block(config.samples_per_message, config.hwm)
        self.config = config = replace(config, seed=seed)
        try:
            # A source that splits only by items: a shard per worker it may run (auto: at
            # most the usable CPUs, since every such shard draws the whole source).
            item_split = min(workers.maximum, usable_cpus()) if workers.auto else workers.maximum
            parts, why = choose_shards(streamer, config.shards, item_split, block)
        except SamplingError as error:
            problem = f"cannot shard the streamer: {error}"
            log.error("%s", problem)
            self._tell_parent("failed", problem)
            return EXIT_USAGE
        if workers.maximum != 1 or repeatable:
            log.info("%d shard(s) (%s), %d samples per shard per turn", len(parts), why, block)
        previous = _install_signal_handlers(self._stop)
        try:
            if workers.maximum == 1:
                # A seeded run gives the sequence of any number of workers: the shards merged.
                local = MergedShards(parts, block, seed) if repeatable and len(parts) > 1 else None
                return self._run_local(streamer if local is None else local)
            return self._run_workers(parts, block, repeatable)
        except _Interrupted as interrupt:
            log.warning("stopped at once by a second %s", signal.Signals(interrupt.signum).name)
            return 128 + interrupt.signum
        finally:
            _restore_signal_handlers(previous)
            bool(self._stop)  # says which signal stopped it, if one did and nobody said yet

    def _open(self, pool: WorkerPool | None = None) -> SocketShell | None:
        try:
            if pool is None:
                shell = SocketShell(self.config, self._stop)
            else:  # the shared-memory pool was opened before the workers forked
                shell = SocketShell(self.config, self._stop, lambda _: pool.shm)
        except (TransportError, ConfigurationError) as error:
            log.error("%s", error)
            self._tell_parent("failed", str(error))
            return None
        if pool is not None:  # before the parent hears "bound": a scrape may follow at once
            shell.meters = pool.meters
            shell.extra_stats.append(pool.liveness)
        config = self.config
        self._endpoints = shell
        self._bound = (shell.data_address, shell.control_address)
        source = config.source if isinstance(config.source, str) else type(config.source).__name__
        # A stable, documented line (docs/server.md): tests and scripts read the bound
        # endpoints from it when they asked for port 0.
        log.info(
            "serving %s: data %s, control %s, %d worker(s), epoch size %s, server id %s",
            source, shell.data_address, shell.control_address,
            pool.target if pool is not None else 1,
            config.epoch_size or "measured after the first epoch", config.server_id,
        )
        if shell.metrics is not None:
            self._metrics_address = shell.metrics.address
            log.info("metrics on %s", self._metrics_address)
        self._tell_parent("bound", *self._bound, self._metrics_address)
        return shell

    def _run_local(self, streamer: Any) -> int:
        shell = self._open()
        if shell is None:
            return EXIT_USAGE
        config = self.config
        # Control is answered from another thread while this one is in the streamer.
        stand_in = ControlStandIn(shell.control, shell.answer_control, shell.follow_control)
        try:
            if not shell.wait_for_trainers():
                return EXIT_FAILED if shell.failed else EXIT_OK
            assert config.seed is not None  # resolved by run()
            seeder = (streamer.start_epoch if isinstance(streamer, MergedShards) else
                      EpochSeeder(config.seed, worker=0, num_workers=1))

            def epoch_done(epoch: int, count: int) -> bool:
                shell.epoch_done(epoch, count)
                return not (self._stop or shell.core.restarting)

            while True:
                produce(
                    EpochIterator(streamer, max_epochs=config.epochs, on_epoch_start=seeder),
                    shell.send_data,
                    policy=BatchPolicy.of(config), server_id=config.server_id,
                    skip_errors=config.on_error == "skip", epoch_done=epoch_done,
                    dealer=ranked_dealer(shell, config), meter=shell.meters[0],
                    start=shell.core.start_at, fresh=shell.core.handed.fresh,
                    batches=shell.core.tables.batches.assemblers(config.buckets), shm=shell.pool,
                    max_skips=config.max_skips,
                    meanwhile=stand_in.drawing, batch_hint=shell.core.batch_hint,
                )
                if not (self._stop or shell.core.restarting):
                    shell.finish()
                if self._stop or not shell.core.restarting:
                    return EXIT_OK
                # A ranked job resumed from a checkpoint: sample again, from where it says.
                for part in (streamer.streamers if isinstance(streamer, MergedShards)
                             else [streamer]):
                    restart_passes(part)
                shell.core.restarted()
                if not shell.wait_for_trainers():  # the new job's ranks
                    return EXIT_FAILED if shell.failed else EXIT_OK
        except Exception as error:
            log.error("sampling failed: %s: %s", type(error).__name__, failure_text(error),
                      exc_info=error)
            shell.fail(error)
            return EXIT_FAILED
        finally:
            stand_in.close()
            EpochSeeder.clear()
            shell.close()

    def _run_workers(self, parts: list[Any], block: int, repeatable: bool) -> int:
        config = self.config
        with tempfile.TemporaryDirectory(prefix="feedmux-") as scratch:
            workers = config.worker_range
            # auto samples in this process at a count of one (no worker process then).
            pool = WorkerPool(parts, config, f"ipc://{scratch}/workers", block,
                              open_pool(config), slots=workers.maximum, active=workers.minimum,
                              home=workers.auto)
            if pool.slots < workers.maximum:
                log.warning("%d worker(s) asked for, %d run: one shard runs in one worker at "
                            "a time (shards=N for more)", workers.maximum, pool.slots)
            pool.start()  # fork before this process creates its ZeroMQ context
            try:
                shell = self._open(pool)
                if shell is None:
                    return EXIT_USAGE
                try:
                    return forward(pool, shell, config, self._stop,
                                   block if repeatable else None)
                finally:
                    shell.close()
            except _Interrupted:
                pool.stop(timeout=0)  # a second signal: no grace for a worker stuck in user code
                raise
            finally:
                pool.stop()
                close_pool(pool.shm)  # also when the server's sockets never opened

    def request_stop(self, reason: str = "") -> None:
        """Ask a server that ``run()`` serves in another thread of this process to stop.

        It stops as on SIGTERM: its loops see the request within a poll period.
        ``reason`` goes into its last log line.
        """
        self._stop_reason = reason or self._stop_reason
        self._stop.set()

    # -- running in the background ------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT) -> Server:
        """Run the server in a background process; return self once it has bound.

        The process is a fresh Python interpreter that gets the configuration as
        data (the source must pickle without referring to the main script: a
        ``"module:attr"`` string always does), so ``start()`` works from any
        script, guarded by ``if __name__ == "__main__":`` or not, whatever
        threads run: the script is never run again. A source defined in the
        script itself (or one that does not pickle) is forked with this process
        instead. :attr:`start_method` says which it was.

        The server stops by itself within a few seconds when this process is
        gone (exited, or killed however), its workers and shared-memory pool
        with it; a normal exit of this process stops it too. Afterwards
        :attr:`data_address` and :attr:`control_address` give the bound
        shell. Raises :class:`TransportError` if the server could not bind
        or resolve its source, died (its error, exit code or signal is named),
        or had not bound within ``timeout`` s (the process is stopped then).
        """
        if self._process is not None:
            raise RuntimeError("this server was already started")
        check_not_nested()
        process = self._process = launch(self.config, serve_started)
        self.start_method = process.method
        _running.add(self)
        report = process.read_report(timeout)
        if report[0] == "bound":
            self._bound = (report[1], report[2])
            self._metrics_address = report[3] if len(report) > 3 else ""
            return self
        self.stop()
        raise TransportError(f"cannot start server {self.config.server_id}: {report[1]}")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode if self._process else None

    def join(self, timeout: float | None = None) -> int | None:
        """Wait for the background server to exit; return its exit code (None if still up)."""
        if self._process is None:
            raise RuntimeError("this server was not started")
        self._process.join(timeout)
        return self._process.exitcode

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the background server, wait up to ``timeout`` s, then SIGKILL it.

        Only the process that started it does: in a forked copy of that process
        (a DataLoader worker, say) this does nothing and returns None.
        """
        process = self._process
        if process is not None and not process.ours:
            return None
        if process is None or process.exitcode is not None:
            _running.discard(self)
            return self.exitcode
        _running.discard(self)
        process.terminate()
        process.join(timeout)
        if process.exitcode is None:
            log.warning("server pid %s ignored SIGTERM for %.1f s; killing it",
                        process.pid, timeout)
            process.kill()
            process.join(timeout)
        return process.exitcode

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(source: Source, **options: Any) -> int:
    """Run a sampler server in this process until it ends; return the exit code.

    Takes the same arguments as :class:`Server`.
    """
    deprecated_reliable(options)  # warned here: the caller's line, not this module's
    return Server(source, **options).run()


def serve_started(config: ServerConfig, report: ChildReport, parent: int) -> int:
    """Serve ``config`` in a process that ``Server.start()`` made; ``report`` the binding.

    The server stops by itself once ``parent`` (the starter) is gone.
    """
    server = Server(config.source, **config.options())
    server._report = report
    watch_parent(parent, lambda: server.request_stop(
        f"the process that started it (pid {parent}) is gone"))
    return server.run()


def _stop_started_servers() -> None:
    """At the exit of the process that started them: stop its servers (none outlives it)."""
    for server in list(_running):
        server.stop()


#: The servers this process started and has not stopped.
_running: weakref.WeakSet[Server] = weakref.WeakSet()
# After multiprocessing's own exit handler (imported above), which joins forked
# children: handlers run last-in first-out, so the servers stop before that join.
atexit.register(_stop_started_servers)


def _install_signal_handlers(stop: _StopFlag) -> dict[int, Any]:
    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[signum] = signal.signal(signum, stop.set)
        except ValueError:  # not the main thread: the caller handles signals
            break
    return previous


def _restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
