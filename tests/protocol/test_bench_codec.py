"""The codec benchmark still runs (tiny sizes; its figures mean nothing here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _bench_codec() -> ModuleType:
    # Loaded from its file: the repository root is on sys.path under `python -m pytest`
    # but not under a bare `pytest`, and the benchmark needs nothing else from it.
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_codec.py"
    spec = importlib.util.spec_from_file_location("_bench_codec_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
def test_codec_benchmark_runs_quickly() -> None:
    bench = _bench_codec()
    result = bench.run(quick=True, repeats=1, echo=False)
    rows = result["rows"]
    assert len(rows) == len(bench.CODECS) * len(bench.make_cases(quick=True))
    for row in rows:
        assert row["total_us_per_sample"] > 0
        assert row["gb_per_s"] > 0
    assert "| case | codec |" in result["markdown"]
    assert {row["time_vs_feedmux"] for row in rows if row["codec"] == "feedmux"} == {1.0}
