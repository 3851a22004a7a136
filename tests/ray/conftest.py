"""A real two-node Ray cluster on this machine, for the fleet tests (marker ``ray``).

This module owns the cluster: a head node and a second node, each on a loopback
address of its own (127.0.0.2 and 127.0.0.3: Ray would otherwise use the
machine's interface address, and tests talk to loopback only), CPU resources
only and few of them, started once for the module that asks and shut down in a
``finally`` whatever happens. It also owns the samples the fleet serves and
the trainer task that reads them. It must never start anything on another
address, and never wait without a bound.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from ray import cloudpickle
from ray.cluster_utils import Cluster

from feedmux import StochasticMux, Streamer

# The test modules are not importable on the nodes: their functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Logical CPUs per node: enough for two servers, two trainers and Ray Train's workers;
#: the machine's two real cores are shared, so the tests keep the real work small.
NODE_CPUS = 3
#: Seconds the cluster may take to start (about 4 s on an idle machine).
CLUSTER_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head on 127.0.0.2, a second node on 127.0.0.3, the driver connected to them."""
    started = time.monotonic()
    nodes = Cluster(initialize_head=True, head_node_args={
        "num_cpus": NODE_CPUS, "node_ip_address": "127.0.0.2", "include_dashboard": False,
    })
    try:
        nodes.add_node(num_cpus=NODE_CPUS, node_ip_address="127.0.0.3")
        ray.init(address=nodes.address, include_dashboard=False, log_to_driver=True)
        nodes.wait_for_nodes(timeout=CLUSTER_TIMEOUT)
        print(f"two-node Ray cluster up in {time.monotonic() - started:.1f} s")
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


def exhaustive_source(streamers: int, items: int, seed: int = 7,
                      payload_bytes: int = 0) -> StochasticMux:
    """Values ``0 .. streamers * items - 1``, every one once per epoch (exhaustive mode).

    With ``payload_bytes``, each sample is ``{"value": v, "payload": array}``: large
    enough that the sockets' buffers fill and the server waits for its trainers.
    """
    def sample(value: int) -> Any:
        return {"value": value, "payload": np.zeros(payload_bytes, np.uint8)} if payload_bytes \
            else value

    return StochasticMux(
        [Streamer([sample(value) for value in range(index * items, (index + 1) * items)])
         for index in range(streamers)],
        n_active=2, rate=None, mode="exhaustive", random_state=seed,
    )


@ray.remote(num_cpus=0.25)
def read_all(loader: Any, step_seconds: float = 0.0) -> list[tuple[str, int, int, int]]:
    """A trainer as a Ray task: every (server id, epoch, position, value) to the stream's end.

    ``step_seconds`` stands for the trainer's own work per sample (it paces the
    reading so that a test can act in the middle of an epoch).
    """
    seen = []
    with loader:
        for meta, value in loader:
            value = value["value"] if isinstance(value, dict) else value
            seen.append((meta.server_id, meta.epoch, meta.position, int(value)))
            if step_seconds:
                time.sleep(step_seconds)
    return seen
