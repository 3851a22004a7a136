"""The Ray actors of a fleet: one sampler server each, and the fleet's address registry.

This module owns what runs inside Ray: :class:`SamplerServer`, an actor whose
process *is* one feedmux server (``Server.run()`` in a thread of the actor, so
the server dies with the actor and its sampling workers die with it), serving
shard ``index`` of ``count`` of the source on its node's address and ports it
binds itself; and :class:`FleetRegistry`, where each server writes where it
listens every time it starts (Ray re-runs the constructor of a restarted
actor), so that loaders can follow a server to its new address. It must never
hold trainer state or decide anything about delivery: that is the server's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import ray

from feedmux.client.remote import fetch_stats
from feedmux.errors import TransportTimeoutError
from feedmux.sampling.epochs import shard
from feedmux.server.factory import resolve_source
from feedmux.server.server import Server

__all__ = ["FleetRegistry", "SamplerServer"]

log = logging.getLogger("feedmux.ray")

#: Seconds between two looks at a starting server (it binds within milliseconds).
_BIND_POLL = 0.01


#: Hosts that bind every interface: a server bound there is reached at its node's address.
WILDCARDS = ("0.0.0.0", "*", "::", "[::]")


def _reachable(endpoint: str, node: str) -> str:
    """``endpoint`` as loaders on other nodes reach it: a wildcard host is the node's.

    >>> _reachable("tcp://0.0.0.0:5555", "10.0.0.7"), _reachable("tcp://127.0.0.1:9", "x")
    ('tcp://10.0.0.7:5555', 'tcp://127.0.0.1:9')
    """
    scheme, rest = endpoint.split("://", 1)
    host, port = rest.rsplit(":", 1)
    return f"{scheme}://{node}:{port}" if host in WILDCARDS else endpoint


class FleetRegistry:
    """Where each server of one fleet listens now, and how often it started."""

    def __init__(self, count: int) -> None:
        self._endpoints: list[tuple[str, str] | None] = [None] * count
        self._starts = [0] * count

    def register(self, index: int, data: str, control: str) -> int:
        """Server ``index`` listens on these endpoints now; returns its start count."""
        self._endpoints[index] = (data, control)
        self._starts[index] += 1
        return self._starts[index]

    def endpoints(self) -> list[tuple[str, str]] | None:
        """Each server's (data, control) endpoints, or None until every one has started."""
        if any(pair is None for pair in self._endpoints):
            return None
        return [pair for pair in self._endpoints if pair is not None]

    def starts(self) -> list[int]:
        """How many times each server has started (1 before any restart)."""
        return list(self._starts)


class SamplerServer:
    """One feedmux server serving shard ``index`` of ``count`` of ``source``, in this actor.

    Raises (out of the constructor, so Ray reports it where the fleet waits) when
    the source cannot be resolved or sharded, or the server does not bind within
    ``start_timeout`` seconds.
    """

    def __init__(self, source_box: list[Any], index: int, count: int, registry_name: str,
                 options: Mapping[str, Any], start_timeout: float,
                 bind: str | None = None) -> None:
        options = dict(options)
        source = ray.get(source_box[0])  # the fleet keeps the source in the object store
        streamer = resolve_source(source, options.pop("factory_kwargs", None))
        node = ray.util.get_node_ip_address()
        host = bind or node  # the fleet's choice (docs/scale-out.md), else the node's address
        self.index = index
        self.node = node
        where = f"tcp://[{host}]:0" if ":" in host else f"tcp://{host}:0"
        self.server = Server(shard(streamer, index, count), bind=where, control=where,
                             **options)
        self.exit_code: int | None = None
        self._thread = threading.Thread(target=self._run, name=f"feedmux-fleet-server-{index}",
                                        daemon=True)
        self._thread.start()
        # Bound on every interface: the loaders reach it at the node's address.
        self.data_address, self.control_address = (
            _reachable(address, node) for address in self._await_bound(start_timeout))
        registry = ray.get_actor(registry_name)
        self.starts = ray.get(registry.register.remote(index, self.data_address,
                                                       self.control_address))
        log.info("fleet server %d of %d on %s (start %d): data %s, control %s", index, count,
                 host, self.starts, self.data_address, self.control_address)

    def _run(self) -> None:
        self.exit_code = self.server.run()

    def _await_bound(self, timeout: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self.server.data_address, self.server.control_address
            except RuntimeError:  # not bound yet
                if not self._thread.is_alive():
                    break
                time.sleep(_BIND_POLL)
        raise RuntimeError(f"fleet server {self.index} on {self.node} did not bind within "
                           f"{timeout:g} s (exit code {self.exit_code})")

    def endpoints(self) -> tuple[str, str]:
        """The (data, control) endpoints this server bound."""
        return self.data_address, self.control_address

    def stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """The server's statistics, with where it runs and how often it started."""
        values: dict[str, Any] = {
            "index": self.index, "node": self.node, "starts": self.starts,
            "data_address": self.data_address, "control_address": self.control_address,
            "server_id": self.server.config.server_id, "exit_code": self.exit_code,
        }
        if self._thread.is_alive():
            try:
                values.update(fetch_stats(self.control_address, timeout=timeout))
                return values
            except TransportTimeoutError:
                # It may have ended (its last epoch done) while we asked: then its last
                # figures are here; a server still serving that does not answer is an error.
                self._thread.join(timeout)
                if self._thread.is_alive():
                    raise
        values["exit_code"] = self.exit_code
        values.update(self.server.final_stats or {})
        return values

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the server as on SIGTERM; its exit code (None if it did not stop in time)."""
        self.server.request_stop()
        self._thread.join(timeout)
        return self.exit_code
