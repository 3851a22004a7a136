"""SamplerFleet: feedmux servers as Ray actors, spread over a cluster, one shard each.

This module owns the driver's side of a fleet: it places ``num_servers``
:class:`~feedmux.ray._actors.SamplerServer` actors with a placement group
(``SPREAD`` by default: one per node where there are enough nodes), lets Ray
restart a dead one (``max_restarts``), reads where each listens from the
fleet's registry, hands out picklable :class:`~feedmux.client.remote.RemoteLoader`
objects over every server (which follow a restarted server to its new
address), gathers statistics and stops everything. Ray does the placement,
the restarts and the discovery; feedmux does the sampling, the exact epochs
and the transport. It must never carry samples itself (they go from the
servers to the trainers over ZeroMQ, never through Ray's object store).
"""

from __future__ import annotations

import logging
import uuid
import weakref
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from feedmux.client.remote import RemoteLoader, deprecated_loader_reliable
from feedmux.errors import ConfigurationError, TransportError
from feedmux.ray._actors import FleetRegistry, SamplerServer
from feedmux.server.config import deprecated_reliable
from feedmux.server.factory import Source

__all__ = ["FleetEndpoints", "SamplerFleet"]

log = logging.getLogger("feedmux.ray")

#: Seconds the fleet waits for its placement group and for every server to bind.
START_TIMEOUT = 120.0
#: Seconds a question to the registry or a server may take.
ASK_TIMEOUT = 10.0
#: Where a one-node cluster's servers bind by default: its trainers are on that node.
LOOPBACK = "127.0.0.1"

_ServerActor = ray.remote(SamplerServer)
_RegistryActor = ray.remote(FleetRegistry)


class FleetEndpoints:
    """Where the servers of a fleet listen now: a loader's ``resolve``, picklable anywhere.

    It holds the registry's name, not a handle, so it unpickles in any process;
    it answers in a process connected to the Ray cluster (a Ray task, actor or
    Ray Train worker, or the driver) and returns None elsewhere, where the
    loader keeps the endpoints it was given.
    """

    def __init__(self, registry_name: str, namespace: str) -> None:
        self.registry_name = registry_name
        self.namespace = namespace

    def __call__(self) -> list[tuple[str, str]] | None:
        if not ray.is_initialized():
            return None
        registry = ray.get_actor(self.registry_name, namespace=self.namespace)
        answer: list[tuple[str, str]] | None = ray.get(registry.endpoints.remote(),
                                                       timeout=ASK_TIMEOUT)
        return answer

    def __repr__(self) -> str:
        return f"FleetEndpoints({self.registry_name!r}, namespace={self.namespace!r})"


class SamplerFleet:
    """``num_servers`` feedmux servers on a Ray cluster, server ``i`` serving shard ``i``.

    The shards split the source as ``--workers`` does (a mux by its streamers,
    anything else by items), so in exhaustive mode the servers' epochs together
    are one epoch of the source, each sample once. Each server binds ``bind`` (by
    default loopback on a one-node cluster, its node's address on a larger one) on
    ports it picks; :attr:`addresses` gives them.

    Parameters
    ----------
    source : str, streamer or callable
        ``"module:attr"`` (importable on every node), a Streamer / mux, or a
        callable returning one (both pickled to the servers by Ray).
    num_servers : int
        Servers (Ray actors) in the fleet; shard ``i`` of ``num_servers`` each.
    workers_per_server : int or str
        Sampling processes per server (``--workers``): shard ``i`` is split again.
        ``"auto"`` (``"auto:MAX"``, ``"auto:MIN-MAX"``) sizes each server's workers
        while it serves (docs/autoscale.md).
    epochs : int, optional
        Stop each server after this many epochs of its shard (default: forever).
    num_cpus : float
        Ray CPUs reserved per server (its placement-group bundle).
    max_restarts : int
        How often Ray restarts a server actor that dies (-1: without limit).
    strategy : str
        The placement group's strategy: ``SPREAD`` (default), ``STRICT_SPREAD``,
        ``PACK`` or ``STRICT_PACK``.
    start_timeout : float
        Seconds to wait for the placement and for every server to bind.
    bind : str, optional
        The interface address every server binds: ``"127.0.0.1"`` (this host only),
        ``"0.0.0.0"`` (every interface; loaders are given the node's address) or an
        address of the node. Default: ``127.0.0.1`` when the cluster has one node
        (trainers on it reach loopback: nothing is exposed), each node's own address
        when it has several. Serving unencrypted (no ``curve_secret``) on an address
        that is not loopback is logged as a warning: anyone who reaches the port reads
        the samples.
    **server_options
        The rest of :class:`~feedmux.server.Server`'s options (``hwm``,
        ``uneven``, ``rank_timeout``, ``epoch_size`` of each shard,
        ``factory_kwargs``, ``curve_secret``, ...); ``control`` is the fleet's.
        ``reliable`` is a deprecated no-op, warned about here once.

    Notes
    -----
    Ray must be initialised (``ray.init``) or is initialised as Ray does by
    default. The fleet is stopped by :meth:`shutdown`, on leaving a ``with``
    block, when it is garbage-collected and when the driver exits (its actors
    belong to the driver, so Ray ends them with it).
    """

    def __init__(
        self,
        source: Source,
        num_servers: int = 2,
        workers_per_server: int | str = 1,
        epochs: int | None = None,
        *,
        num_cpus: float = 1.0,
        max_restarts: int = 3,
        strategy: str = "SPREAD",
        start_timeout: float = START_TIMEOUT,
        bind: str | None = None,
        **server_options: Any,
    ) -> None:
        deprecated_reliable(server_options)  # here, not in every server actor's process
        _check_fleet(num_servers, num_cpus, server_options, bind)
        self.num_servers = num_servers
        namespace = ray.get_runtime_context().namespace if ray.is_initialized() else None
        if namespace is None:
            ray.init()
            namespace = ray.get_runtime_context().namespace
        nodes = sorted({node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]})
        #: The interface the servers bind (None: each its node's address).
        self.bind = bind if bind is not None else (LOOPBACK if len(nodes) <= 1 else None)
        _warn_if_exposed([self.bind] if self.bind is not None else nodes,
                         secured=server_options.get("curve_secret") is not None)
        self.registry_name = f"feedmux-fleet-{uuid.uuid4().hex[:12]}"
        self.namespace = namespace
        self._registry = _RegistryActor.options(name=self.registry_name, num_cpus=0).remote(
            num_servers)
        self._group = placement_group([{"CPU": num_cpus}] * num_servers, strategy=strategy)
        self._servers: list[Any] = []
        self._finalizer = weakref.finalize(self, _stop_fleet, self._servers, self._registry,
                                           self._group)
        options = {"workers": workers_per_server, "epochs": epochs, **server_options}
        # Held here for the fleet's life: Ray re-reads a restarted actor's arguments, so the
        # source must not leave the object store (passed boxed, so the actor gets the ref).
        self._source = ray.put(source)
        try:
            ray.get(self._group.ready(), timeout=start_timeout)
            for index in range(num_servers):
                strategy_of = PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=index)
                self._servers.append(_ServerActor.options(
                    num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=1,
                    scheduling_strategy=strategy_of,
                ).remote([self._source], index, num_servers, self.registry_name, options,
                         start_timeout, self.bind))
            ray.get([server.endpoints.remote() for server in self._servers],
                    timeout=start_timeout)
        except BaseException:
            self.shutdown()
            raise

    # -- where the servers are ----------------------------------------------------------
    @property
    def endpoints(self) -> list[tuple[str, str]]:
        """Each server's (data, control) endpoints, as it listens now."""
        answer = FleetEndpoints(self.registry_name, self.namespace)()
        if answer is None:
            raise TransportError(f"the fleet {self.registry_name} has no server endpoints yet")
        return answer

    @property
    def addresses(self) -> list[str]:
        """Each server's data endpoint (its control endpoint is in :attr:`endpoints`)."""
        return [data for data, _ in self.endpoints]

    @property
    def servers(self) -> list[Any]:
        """The server actors' handles, in shard order."""
        return list(self._servers)

    def starts(self) -> list[int]:
        """How many times each server has started (1 until Ray restarts it)."""
        starts: list[int] = ray.get(self._registry.starts.remote(), timeout=ASK_TIMEOUT)
        return starts

    # -- trainers -----------------------------------------------------------------------
    def loader(self, rank: int | None = None, world_size: int = 1,
               **loader_options: Any) -> RemoteLoader:
        """A :class:`RemoteLoader` over every server of the fleet.

        It is picklable (into Ray tasks and Ray Train workers) and connects in the
        process that iterates it; it asks the fleet's registry once a second where
        the servers listen, so a server restarted elsewhere is followed there.
        ``rank`` / ``world_size`` and the other options are RemoteLoader's.
        """
        deprecated_loader_reliable(loader_options)
        pairs = self.endpoints
        return RemoteLoader(
            [data for data, _ in pairs], control=[control for _, control in pairs],
            rank=rank, world_size=world_size,
            resolve=FleetEndpoints(self.registry_name, self.namespace), **loader_options,
        )

    # -- the fleet ----------------------------------------------------------------------
    def stats(self, timeout: float = ASK_TIMEOUT) -> list[dict[str, Any]]:
        """Every server's statistics (``index``, ``node``, ``starts``, endpoints and the
        server's own figures), in shard order."""
        stats: list[dict[str, Any]] = ray.get(
            [server.stats.remote() for server in self._servers], timeout=timeout)
        return stats

    def shutdown(self) -> None:
        """Stop every server, the registry and the placement group (idempotent)."""
        self._finalizer()

    def __enter__(self) -> SamplerFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __reduce__(self) -> Any:
        raise TypeError("a SamplerFleet stays in its driver: hand trainers fleet.loader(...) "
                        "objects, which pickle")

    def __repr__(self) -> str:
        return f"SamplerFleet({self.registry_name!r}, num_servers={self.num_servers})"


def _check_fleet(num_servers: int, num_cpus: float, server_options: dict[str, Any],
                 bind: str | None = None) -> None:
    if not (isinstance(num_servers, int) and num_servers >= 1):
        raise ConfigurationError(f"expected num_servers an int >= 1, got {num_servers!r}")
    if not num_cpus > 0:
        raise ConfigurationError(f"expected num_cpus > 0 (a placement bundle), got {num_cpus!r}")
    if bind is not None and (not isinstance(bind, str) or not bind
                             or any(c in bind for c in "/ ") or bind.count(":") == 1):
        raise ConfigurationError(
            f"expected bind an interface address such as '127.0.0.1' or '0.0.0.0' (each "
            f"server picks its ports), got {bind!r}")
    taken = sorted({"control", "workers"} & set(server_options))
    if taken:
        raise ConfigurationError(
            f"expected no {taken} among the server options: the fleet binds each server's "
            "control port beside its data port, and sets workers from workers_per_server"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reached from this host only.

    >>> [is_loopback(h) for h in ("127.0.0.1", "127.0.0.3", "::1", "0.0.0.0", "10.0.0.2")]
    [True, True, True, False, False]
    """
    return host.startswith("127.") or host in ("::1", "localhost")


def _warn_if_exposed(hosts: list[str], secured: bool) -> None:
    """Warn when the servers serve unencrypted where other hosts reach them."""
    exposed = [host for host in hosts if not is_loopback(host)]
    if exposed and not secured:
        log.warning(
            "the fleet's servers serve unencrypted on %s (not loopback): anyone who reaches "
            "these ports can read the samples and join as a trainer; pass curve_secret= and "
            "curve_clients= (docs/security.md), or bind='127.0.0.1' on a one-node cluster",
            ", ".join(exposed))


def _stop_fleet(servers: list[Any], registry: Any, group: Any) -> None:
    """Stop the servers (gracefully, then for good), the registry and the placement group."""
    if not ray.is_initialized():
        return  # Ray is gone, and with it every actor of this driver
    try:
        ray.get([server.stop.remote() for server in servers], timeout=ASK_TIMEOUT)
    except Exception as error:  # a dead or stuck server is killed below all the same
        log.warning("fleet servers did not all stop gracefully: %s", error)
    for actor in [*servers, registry]:
        try:
            ray.kill(actor, no_restart=True)
        except Exception as error:
            log.warning("cannot kill fleet actor %s: %s", actor, error)
    servers.clear()
    try:
        remove_placement_group(group)
    except Exception as error:
        log.warning("cannot remove the fleet's placement group: %s", error)
