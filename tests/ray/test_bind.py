"""Where a fleet's servers listen, on a real one-node Ray cluster (marker ``ray``).

A one-node cluster's trainers are on its node: its servers bind loopback by
default, not the node's address (``ray.init()`` on a laptop or a cloud VM gives
its network address, and the servers listened there, unencrypted). ``bind=``
puts them where the user says, and serving unencrypted off loopback is a warning.
The node is on 127.0.0.2, so that "the node's address" and loopback differ while
everything stays on this host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from feedmux.errors import ConfigurationError
from feedmux.ray import SamplerFleet
from tests.ray.conftest import CLUSTER_TIMEOUT, NODE_CPUS, exhaustive_source, read_all

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NODE = "127.0.0.2"


@pytest.fixture(scope="module")
def one_node() -> Iterator[Cluster]:
    """A one-node cluster on 127.0.0.2, the driver connected to it."""
    started = time.monotonic()
    nodes = Cluster(initialize_head=True, head_node_args={
        "num_cpus": NODE_CPUS, "node_ip_address": NODE, "include_dashboard": False,
    })
    try:
        ray.init(address=nodes.address, include_dashboard=False, log_to_driver=True)
        nodes.wait_for_nodes(timeout=CLUSTER_TIMEOUT)
        print(f"one-node Ray cluster up in {time.monotonic() - started:.1f} s")
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


def hosts(fleet: SamplerFleet) -> set[str]:
    return {address.split("//")[1].rsplit(":", 1)[0]
            for pair in fleet.endpoints for address in pair}


def values_read(fleet: SamplerFleet) -> list[int]:
    seen = ray.get(read_all.remote(fleet.loader(with_meta=True, timeout=60)), timeout=120)
    return sorted(value for *_, value in seen)


def test_a_one_node_cluster_serves_on_loopback_by_default_without_a_warning(
    one_node: Cluster, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="feedmux.ray"), SamplerFleet(
            exhaustive_source(2, 3), num_servers=1, epochs=1, num_cpus=0.25) as fleet:
        assert fleet.bind == "127.0.0.1"
        assert hosts(fleet) == {"127.0.0.1"}, fleet.endpoints  # not the node's 127.0.0.2
        assert values_read(fleet) == list(range(6))
    assert "unencrypted" not in caplog.text


def test_bind_puts_the_servers_where_the_user_says(one_node: Cluster) -> None:
    with SamplerFleet(exhaustive_source(2, 3), num_servers=1, epochs=1, num_cpus=0.25,
                      bind=NODE) as fleet:
        assert hosts(fleet) == {NODE}
        assert values_read(fleet) == list(range(6))


def test_every_interface_unencrypted_is_a_warning_and_loaders_get_the_node_address(
    one_node: Cluster, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="feedmux.ray"), SamplerFleet(
            exhaustive_source(2, 3), num_servers=1, epochs=1, num_cpus=0.25,
            bind="0.0.0.0") as fleet:
        assert hosts(fleet) == {NODE}, fleet.endpoints  # reached at the node's address
        assert values_read(fleet) == list(range(6))
    [warning] = [r for r in caplog.records if "unencrypted" in r.getMessage()]
    assert warning.levelno == logging.WARNING and "0.0.0.0" in warning.getMessage()


def test_a_bind_that_is_not_an_interface_address_is_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigurationError, match=r"expected bind an interface address.*"
                                                 r"got 'tcp://0.0.0.0:5555'"):
        SamplerFleet(exhaustive_source(2, 3), bind="tcp://0.0.0.0:5555")
