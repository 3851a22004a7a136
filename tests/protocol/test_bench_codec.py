"""The codec benchmark still runs (tiny sizes; its figures mean nothing here)."""

from __future__ import annotations

import pytest

from benchmarks.bench_codec import CODECS, make_cases, run


@pytest.mark.timeout(60)
def test_codec_benchmark_runs_quickly() -> None:
    result = run(quick=True, repeats=1, echo=False)
    rows = result["rows"]
    assert len(rows) == len(CODECS) * len(make_cases(quick=True))
    for row in rows:
        assert row["total_us_per_sample"] > 0
        assert row["gb_per_s"] > 0
    assert "| case | codec |" in result["markdown"]
    assert {row["time_vs_feedmux"] for row in rows if row["codec"] == "feedmux"} == {1.0}
