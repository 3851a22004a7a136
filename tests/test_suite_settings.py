"""The suite's own settings (tests/conftest.py): no deadline on hypothesis examples, and
the long tests first in the run."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import INTEGRATION, start_rank


def test_a_slow_example_is_not_a_failure() -> None:
    # Over hypothesis's default deadline of 200 ms: a loaded machine's example, not a bug.
    @settings(max_examples=1, database=None)
    @given(st.just(0))
    def slow(value: int) -> None:
        time.sleep(0.3)

    slow()


@dataclass
class FakeItem:
    """What start_rank reads of a collected test."""

    path: Path
    markers: dict[str, Any] = field(default_factory=dict)
    obj: Any = None

    def get_closest_marker(self, name: str) -> Any:
        return self.markers.get(name)


def test_the_long_tests_start_first() -> None:
    def quick() -> None:
        pass

    unit = FakeItem(Path(__file__))
    integration = FakeItem(INTEGRATION / "test_x.py")
    bounded = FakeItem(Path(__file__), {"timeout": pytest.mark.timeout(300).mark})
    slow = FakeItem(Path(__file__), {"slow": pytest.mark.slow.mark})
    examples = FakeItem(Path(__file__), obj=given(st.just(0))(lambda value: None))
    plain = FakeItem(Path(__file__), obj=quick)
    items = [unit, plain, examples, integration, bounded, slow]
    assert sorted(items, key=start_rank) == [slow, bounded, examples, integration, unit, plain]
