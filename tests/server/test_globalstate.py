"""The process-wide generators' state copied in place: checked once, invisible to the draws."""

from __future__ import annotations

import platform
import random
from collections.abc import Iterator

import numpy as np
import pytest

from feedmux.server._sources import globalstate
from feedmux.server._sources.globalstate import GlobalRandomState


@pytest.fixture
def kept_gaussians() -> Iterator[None]:
    """Both generators seeded and each holding a Gaussian for its next call, as mid-run."""
    np.random.seed(9)
    np.random.randn(1)
    random.seed(9)
    random.gauss(0.0, 1.0)
    assert np.random.get_state()[3] == 1 and random.getstate()[2] is not None
    yield


def _states() -> tuple[object, ...]:
    numpy = np.random.get_state()
    return random.getstate(), numpy[0], numpy[1].tolist(), *numpy[2:]


@pytest.mark.skipif(platform.python_implementation() != "CPython", reason="CPython's layout")
def test_this_interpreter_and_numpy_switch_in_place(kept_gaussians: None) -> None:
    # Not a rule of correctness (the fallback draws the same), but of speed: if a new
    # numpy or Python fails a check, switches cost 80-100 µs again.
    python, numpy = globalstate._check_python(), globalstate._check_numpy()
    assert not isinstance(python, str), f"random switches via getstate/setstate: {python}"
    assert not isinstance(numpy, str), f"numpy {np.__version__} switches via get_state: {numpy}"


def test_the_checks_leave_every_state_as_it_was(kept_gaussians: None) -> None:
    before = _states()
    globalstate._check_python()
    globalstate._check_numpy()
    assert _states() == before


@pytest.mark.parametrize("fast", [True, False])
def test_a_restore_puts_back_the_kept_gaussians_too(kept_gaussians: None, fast: bool) -> None:
    saved = GlobalRandomState(fast)
    saved.save()
    before = _states()
    first = np.random.randn(3).tolist(), random.gauss(0.0, 1.0), random.random()
    np.random.seed(1)  # drops numpy's kept value
    random.seed(1)
    saved.restore()
    assert _states() == before
    assert (np.random.randn(3).tolist(), random.gauss(0.0, 1.0), random.random()) == first


def test_a_copy_in_place_goes_back_the_public_way_into_a_replaced_bit_generator(
        kept_gaussians: None) -> None:
    original = np.random.get_bit_generator()
    saved = GlobalRandomState()
    saved.save()
    before = _states()
    try:
        np.random.set_bit_generator(np.random.MT19937(5))
        saved.restore()
        assert _states() == before
    finally:
        np.random.set_bit_generator(original)
