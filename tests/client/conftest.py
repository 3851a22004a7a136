"""Fixtures of the client tests: a control endpoint that stands for a server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq


@pytest.fixture
def control_router(tmp_path: Path) -> Iterator[tuple[zmq.Socket[Any], str]]:
    """A ROUTER bound on an ipc path in the test's folder, and that address (closed after)."""
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    address = f"ipc://{tmp_path}/control"
    router.bind(address)
    try:
        yield router, address
    finally:
        router.close()
        context.term()
