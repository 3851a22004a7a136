"""The mux benchmark runs (tiny) and reports every configuration."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

# Every test here is fast: a hang is a bug, so fail it early.
pytestmark = pytest.mark.timeout(30)


BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_mux.py"


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_mux", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)  # 2.4 s alone; over 60 s in a loaded parallel run
def test_quick_benchmark_reports_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark()
    result = bench.run(quick=True)
    configs = {(row["mode"], row["n_active"]) for row in result["rows"]}
    assert configs == {
        (mode, n_active) for mode in ("with_replacement", "exhaustive") for n_active in (1, 32)
    }
    for row in result["rows"]:
        assert row["feedmux_us"] > 0 and row["feedmux_overhead_us"] > 0
        if result["pescador"]:
            assert row["ratio"] > 0
    assert result["markdown"].startswith("| mode | n_active |")
    assert len(result["markdown"].splitlines()) == 2 + 4
    bench.main(["--quick"])
    assert "| exhaustive | 32 |" in capsys.readouterr().out
