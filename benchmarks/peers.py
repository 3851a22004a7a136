"""The contenders: how feedmux and each peer is started and consumed.

Every contender is split in two halves. ``start_producer`` starts what runs
outside the trainer (a feedmux server, a raw PUSH process) and returns its
process ids so the harness can kill it by pid, and the endpoints it bound (tcp
producers bind port 0: nothing here picks a port by binding and releasing it);
``connect`` opens the trainer's
side and returns an iterator of samples. Peers that start their own producer
processes (pescador's ``ZMQStreamer``, a torch ``DataLoader``) do it in
``connect`` and report the pids they started. Nothing here times anything and
nothing binds beyond 127.0.0.1 or an ipc path in the run's temporary folder.

Peer workarounds, all confined to this module:

* pescador's ``ZMQStreamer`` binds ``tcp://*`` (every interface); the
  benchmark runs the same pescador worker and wire functions from an
  ``iterate`` that binds 127.0.0.1 instead.
* pescador only sends ``numpy.ndarray`` values, so numpy scalars (the ``y``
  label) are sent as 0-d arrays.

The torch ``DataLoader`` runs with ``batch_size=None`` and each worker iterates
its own copy of the generator. Large samples take the default conversion to
tensors in shared memory (its fastest path for them); small ones pass through
as numpy (``collate_fn`` returning the sample unchanged), its fastest path for
those.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.scenarios import GENERATORS, Contender, sample_nbytes

FEEDMUX_SOURCE = "benchmarks.scenarios:feedmux_source"
# pyzmq copies anything smaller than this on send anyway (zmq.COPY_THRESHOLD).
ZERO_COPY_BYTES = 64 * 1024

_FORK = multiprocessing.get_context("fork")


@dataclass(frozen=True)
class Endpoints:
    """Where a producer binds its data and control sockets."""

    data: str
    control: str


@dataclass
class Producer:
    """A running producer outside the trainer, stopped by ``stop()``."""

    endpoints: Endpoints
    pids: list[int] = field(default_factory=list)
    stop: Callable[[], None] = lambda: None
    handle: Any = None


@dataclass
class Consumer:
    """The trainer's side: an iterator of samples and how to close it."""

    samples: Iterator[Any]
    close: Callable[[], None] = lambda: None
    # Evaluated after the first sample: some peers start processes lazily.
    pids: Callable[[], list[int]] = list


def kill_pid(pid: int, grace: float = 0.0) -> None:
    """Terminate one process by pid (SIGTERM, then SIGKILL after ``grace`` s)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if grace > 0:
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, grace)
        os.kill(pid, signal.SIGKILL)


def _wait_gone(pid: int, seconds: float) -> None:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            finished = 0
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        if finished == pid:
            return
        time.sleep(0.01)


# --------------------------------------------------------------------------
# Producers


def start_producer(
    contender: Contender, kind: str, endpoints: Endpoints, timeout: float
) -> Producer:
    """Start the producer of a contender that runs one outside the trainer."""
    if contender.peer == "feedmux":
        return _start_feedmux(contender, kind, endpoints)
    if contender.peer == "pyzmq":
        return _start_raw_pyzmq(kind, endpoints, timeout)
    return Producer(endpoints)


#: The server's public key of a CURVE measurement (set by its producer, read by its
#: trainers, which are forked after it).
_curve_public_key: list[str] = []


def _curve_secret(directory: str) -> str:
    """A fresh server certificate in ``directory``; its public key kept for trainers."""
    from feedmux._plumbing.curve import create_keys

    public, secret = create_keys(directory, "server")
    _curve_public_key[:] = [str(public)]
    return str(secret)


def _start_feedmux(contender: Contender, kind: str, endpoints: Endpoints) -> Producer:
    import feedmux

    mode = contender.mode
    keys = tempfile.mkdtemp(prefix="feedmux-bench-keys-") if mode == "curve" else None
    server = feedmux.Server(
        FEEDMUX_SOURCE,
        bind=endpoints.data,
        control=endpoints.control,
        workers=contender.workers,
        seed=contender.seed,
        zero_copy=contender.zero_copy,
        factory_kwargs={"kind": kind, "shared": mode == "shared"},
        curve_secret=_curve_secret(keys) if keys else None,
        shm=mode != "noshm",
        # Groups: every one from the first message (a group joining later waits for the
        # next epoch, and the large scenario's never ends).
        min_trainers=contender.trainers if contender.groups else 0,
    )
    return started_server(
        server, after=(lambda: shutil.rmtree(keys, ignore_errors=True)) if keys else None)


def started_server(server: Any, after: Callable[[], None] | None = None) -> Producer:
    """Start a ``feedmux.Server`` and hold it as a producer: stopped (killed by pid if it
    will not stop), then ``after`` run, when the measurement ends."""
    server.start()  # returns once bound: the endpoints below are the real ones
    pids = [server.pid] if server.pid else []

    def stop() -> None:
        try:
            server.stop(timeout=5)
        finally:
            for pid in pids:
                kill_pid(pid)
            if after is not None:
                after()

    bound = Endpoints(server.data_address, server.control_address)
    return Producer(bound, pids=pids, stop=stop, handle=server)


def prebuilt_frames(kind: str) -> tuple[list[Any], bool]:
    """One sample of the scenario's generator as ready-to-send frames, and the copy flag.

    A small sample is one frame (msgpack of each array's key, dtype, shape and
    bytes), sent copied; a large one is a msgpack header frame and one frame
    per array, sent zero-copy: what pyzmq does best at each size.
    """
    import msgpack

    sample = next(GENERATORS[kind]())
    arrays = {key: np.ascontiguousarray(value) for key, value in sample.items()}
    header = [{"key": k, "dtype": a.dtype.str, "shape": list(a.shape)} for k, a in arrays.items()]
    if sum(a.nbytes for a in arrays.values()) < ZERO_COPY_BYTES:
        blob = msgpack.packb([header, [a.tobytes() for a in arrays.values()]])
        return [blob], True
    return [msgpack.packb(header), *arrays.values()], False


def _raw_pyzmq_loop(address: str, kind: str, report: Any) -> None:
    import zmq

    frames, copy = prebuilt_frames(kind)
    context = zmq.Context()
    socket = context.socket(zmq.PUSH)
    socket.bind(address)
    report.send(socket.getsockopt_string(zmq.LAST_ENDPOINT))  # the real port for port 0
    report.close()
    send = socket.send_multipart
    while True:
        send(frames, copy=copy)


def _start_raw_pyzmq(kind: str, endpoints: Endpoints, timeout: float) -> Producer:
    receiver, sender = _FORK.Pipe(duplex=False)
    process = _FORK.Process(target=_raw_pyzmq_loop, args=(endpoints.data, kind, sender),
                            daemon=True)
    process.start()
    sender.close()
    pid = process.pid
    assert pid is not None

    def stop() -> None:
        kill_pid(pid)
        process.join(5)

    try:
        if not receiver.poll(timeout):
            raise TimeoutError(f"the raw pyzmq producer did not bind within {timeout} s")
        data = receiver.recv()
    except BaseException:
        stop()
        raise
    finally:
        receiver.close()
    return Producer(Endpoints(data, endpoints.control), pids=[pid], stop=stop, handle=process)


# --------------------------------------------------------------------------
# Consumers


def connect(
    contender: Contender,
    kind: str,
    endpoints: Endpoints,
    timeout: float,
    trainers: int = 1,
    index: int = 0,
) -> Consumer:
    """Open the trainer's side of a contender (``index``: which of its trainers, from 0)."""
    openers = {
        "feedmux": _connect_feedmux,
        "pyzmq": _connect_raw_pyzmq,
        "pescador": _connect_pescador,
        "torch": _connect_torch,
        "inline": _connect_inline,
    }
    if contender.ranked:
        return _connect_feedmux(contender, kind, endpoints, timeout, trainers, rank=index)
    if contender.groups:
        return _connect_feedmux(contender, kind, endpoints, timeout, 1, group=f"g{index}")
    return openers[contender.peer](contender, kind, endpoints, timeout, trainers)


def _connect_feedmux(
    contender: Contender, kind: str, endpoints: Endpoints, timeout: float, trainers: int,
    rank: int | None = None, group: str | None = None,
) -> Consumer:
    import feedmux

    mode = contender.mode
    loader = feedmux.RemoteLoader(
        endpoints.data, control=endpoints.control, timeout=timeout, world_size=trainers,
        rank=rank, curve_server_key=_curve_public_key[0] if mode == "curve" else None,
        shm=mode != "noshm", batch_size=contender.batch_size or None, group=group,
    )
    return Consumer(samples=iter(loader), close=loader.close)


def _connect_raw_pyzmq(
    contender: Contender, kind: str, endpoints: Endpoints, timeout: float, trainers: int
) -> Consumer:
    import zmq

    copy = sample_nbytes(kind) < ZERO_COPY_BYTES
    context = zmq.Context()
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    socket.connect(endpoints.data)

    def frames() -> Iterator[list[Any]]:
        recv = socket.recv_multipart
        while True:
            yield recv(copy=copy)

    def close() -> None:
        socket.close(linger=0)
        context.term()

    return Consumer(samples=frames(), close=close)


def _as_arrays(kind: str, seed: int) -> Iterator[dict[str, np.ndarray]]:
    # pescador's wire format carries ndarrays only: send scalars as 0-d arrays.
    for sample in GENERATORS[kind](seed):
        yield {key: np.asarray(value) for key, value in sample.items()}


def _loopback_zmq_streamer(streamer: Any, timeout: float) -> Any:
    """pescador's ZMQStreamer, bound to 127.0.0.1 instead of every interface."""
    import pescador
    import zmq
    from pescador.zmq_stream import zmq_recv_data, zmq_worker

    class LoopbackZMQStreamer(pescador.ZMQStreamer):  # type: ignore[misc]
        worker_pids: list[int]

        def iterate(self, max_iter: int | None = None) -> Iterator[dict[str, np.ndarray]]:
            context = zmq.Context()
            socket = context.socket(zmq.PAIR)
            socket.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
            port = socket.bind_to_random_port(
                "tcp://127.0.0.1", min_port=self.min_port, max_port=self.max_port
            )
            terminate = _FORK.Event()
            worker = _FORK.Process(
                target=zmq_worker,
                args=(port, self.streamer, terminate),
                kwargs={"copy": self.copy, "max_iter": max_iter},
                daemon=True,
            )
            worker.start()
            assert worker.pid is not None
            self.worker_pids.append(worker.pid)
            try:
                while True:
                    try:
                        data = zmq_recv_data(socket)
                    except StopIteration:
                        return
                    yield data
            finally:
                terminate.set()
                worker.join(self.timeout)
                if worker.is_alive():
                    worker.terminate()
                    worker.join(self.timeout)
                socket.close(linger=0)
                context.term()

    zmq_streamer = LoopbackZMQStreamer(streamer, timeout=2)
    zmq_streamer.worker_pids = []
    return zmq_streamer


def _connect_pescador(
    contender: Contender, kind: str, endpoints: Endpoints, timeout: float, trainers: int
) -> Consumer:
    import pescador

    streamer = _loopback_zmq_streamer(pescador.Streamer(_as_arrays, kind, 0), timeout)
    samples = streamer.iterate()

    def close() -> None:
        samples.close()
        for pid in streamer.worker_pids:
            kill_pid(pid)

    return Consumer(samples=samples, close=close, pids=lambda: list(streamer.worker_pids))


def _connect_torch(
    contender: Contender, kind: str, endpoints: Endpoints, timeout: float, trainers: int
) -> Consumer:
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class GeneratorDataset(IterableDataset):  # type: ignore[misc,type-arg]
        """The scenario's generator, one independent stream per worker."""

        def __iter__(self) -> Iterator[Any]:
            info = get_worker_info()
            return GENERATORS[kind](info.id if info is not None else 0)

    options: dict[str, Any] = {}
    if contender.batch_size:
        # A training step's batch as torch users take it: collated (stacked into tensors) by
        # the worker that drew it, sent over the DataLoader's queue in shared memory.
        options["batch_size"] = contender.batch_size
    elif sample_nbytes(kind) < ZERO_COPY_BYTES:
        # The DataLoader's best for small samples: pass the worker's numpy samples
        # through (pickled over its pipe) instead of converting each array to a
        # tensor in shared memory, which costs about 10x more per sample.
        options["collate_fn"] = _unchanged
    loader = DataLoader(
        GeneratorDataset(),
        batch_size=options.pop("batch_size", None),
        num_workers=contender.workers,
        timeout=timeout if contender.workers else 0,
        **options,
    )
    iterator = iter(loader)
    workers = getattr(iterator, "_workers", [])
    pids = [worker.pid for worker in workers if worker.pid]

    def close() -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        for pid in pids:
            kill_pid(pid)

    return Consumer(samples=iterator, close=close, pids=lambda: pids)


def _unchanged(sample: Any) -> Any:
    return sample


def _connect_inline(
    contender: Contender, kind: str, endpoints: Endpoints, timeout: float, trainers: int
) -> Consumer:
    return Consumer(samples=GENERATORS[kind](0))
