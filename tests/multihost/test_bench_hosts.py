"""``python -m benchmarks.bench_hosts --quick`` runs across the two hosts and reports."""

from __future__ import annotations

import pytest

from tests.multihost.hosts import TwoHosts

pytestmark = pytest.mark.timeout(180)


def test_the_two_host_benchmark_runs(hosts: TwoHosts, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_hosts

    # hosts: the fixture skips (or fails under FEEDMUX_MULTIHOST=require) where the
    # benchmark's own hosts cannot be made; the benchmark makes a pair of its own.
    assert bench_hosts.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "veth   small   raw" in out and "veth   small   free" in out
    assert "vs raw" in out and "decompression / copy" in out
