"""The multi-host tests' fixtures: two hosts per test (:mod:`tests.multihost.hosts`).

Every test here is marked ``multihost``. Without root or network namespaces they skip with
the reason; with ``FEEDMUX_MULTIHOST=require`` in the environment (``.ci/run``) that is a
failure instead: there they must run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.multihost.hosts import REQUIRE_ENV, TwoHosts, unavailable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.multihost)


@pytest.fixture(scope="session")
def hosts_reason() -> str | None:
    return unavailable()


@pytest.fixture
def hosts(hosts_reason: str | None) -> Iterator[TwoHosts]:
    """Host A and host B joined by a veth link (unshaped), closed after the test whatever
    happened (every process in them killed, namespaces and mounts removed)."""
    if hosts_reason is not None:
        if os.environ.get(REQUIRE_ENV) == "require":
            pytest.fail(f"{REQUIRE_ENV}=require but two hosts cannot be made: {hosts_reason}")
        pytest.skip(hosts_reason)
    with TwoHosts() as made:
        yield made
