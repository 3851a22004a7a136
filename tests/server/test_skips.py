"""What --on-error skip may skip: the guard, driven with made-up errors (no sockets)."""

from __future__ import annotations

import pytest

import feedmux
from feedmux.errors import SkipLimitError
from feedmux.sampling.streamer import blamed_streamer
from feedmux.server._sources.skips import SkipGuard


def test_a_streak_stops_at_the_limit_and_names_its_first_error() -> None:
    guard = SkipGuard(max_skips=3)
    guard.skipped(OSError("a"))
    guard.skipped(OSError("b"))
    guard.sent(1)  # a sample served: the streak starts again
    guard.skipped(OSError("c"))
    guard.skipped(OSError("d"))
    with pytest.raises(SkipLimitError, match=r"skipped 3 errors in a row .* the first: "
                                             r"OSError: c$"):
        guard.skipped(ValueError("e"))


def test_an_epoch_of_nothing_but_skips_stops_the_run_even_without_a_streak_limit() -> None:
    guard = SkipGuard(max_skips=0)
    guard.skipped(OSError("a"))
    guard.sent(4)
    guard.epoch_done(1, 4)  # an epoch with samples: fine
    guard.skipped(KeyError("b"))
    with pytest.raises(SkipLimitError, match=r"every sample of epoch 2 .* the first: KeyError"):
        guard.epoch_done(2, 0)


def test_an_empty_epoch_without_skips_is_no_error_and_a_worker_counts_streaks_only() -> None:
    SkipGuard().epoch_done(1, 0)
    guard = SkipGuard(max_skips=5, whole_epochs=False)
    guard.skipped(OSError("a"))
    guard.epoch_done(1, 0)


def test_the_guards_own_error_passes_through_a_mux_unskipped() -> None:
    with pytest.raises(SkipLimitError):
        SkipGuard().skipped(SkipLimitError("stop"))


def _broken(path: str, *, fail_at: int) -> object:
    for index in range(3):
        if index == fail_at:
            raise OSError(f"bad record in {path}")
        yield index


def test_the_innermost_streamer_is_named_through_a_mux() -> None:
    mux = feedmux.ChainMux([feedmux.Streamer(_broken, "/data/b.rec", fail_at=1)])
    with pytest.raises(OSError) as caught:
        list(feedmux.Streamer(mux))
    assert blamed_streamer(caught.value) == (
        "tests.server.test_skips._broken('/data/b.rec', fail_at=1)")
