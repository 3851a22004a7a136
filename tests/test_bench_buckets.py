"""The coordinated-steps benchmark still runs (a short round; its figures mean nothing)."""

from __future__ import annotations

import pytest


@pytest.mark.timeout(180)
def test_the_buckets_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psutil")  # the bench extra (make bench installs it)
    from benchmarks import bench_buckets

    assert bench_buckets.main(["--quick"]) == 0
    table = capsys.readouterr().out
    assert "| today | " in table and "| coordinated | " in table
    assert "today / coordinated, mean job step time:" in table
    assert "| 1.0 | 16 | " in table
