"""The live fuzz, 30 seconds of it: random and mutated messages at a serving server."""

from __future__ import annotations

import pytest

from benchmarks import fuzz_live


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_fuzzed_server_keeps_serving_exact_samples_in_bounded_memory() -> None:
    lines: list[str] = []
    failures = fuzz_live.run(seconds=30, max_growth_mib=100, seed=13, log=lines.append)
    assert failures == [], lines
    sent = int(lines[-1].split()[0])
    assert sent >= 10_000, lines  # about 100 000 a minute on a quiet machine
