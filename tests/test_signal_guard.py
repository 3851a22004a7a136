"""The suite's signal guard (tests/conftest.py) sees a handler or a mask left behind."""

from __future__ import annotations

import signal

from tests.conftest import restore_signal_state, signal_changes, signal_state


def test_a_handler_left_installed_is_named_and_restored() -> None:
    before = signal_state()
    # A handler of its own: whatever SIGINT's handler was (SIG_IGN in a process started
    # with SIGINT ignored), this one differs from it.
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        changes = signal_changes(before, signal_state())
        assert len(changes) == 1 and changes[0].startswith("SIGINT handler")
    finally:
        restore_signal_state(before)
    assert signal.getsignal(signal.SIGINT) is previous
    assert signal_changes(before, signal_state()) == []


def test_a_signal_left_blocked_is_named_and_unblocked() -> None:
    before = signal_state()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        assert signal_changes(before, signal_state()) == [
            f"blocked signals {sorted(before[1])} -> {sorted(before[1] | {int(signal.SIGTERM)})}"]
    finally:
        restore_signal_state(before)
    assert signal_changes(before, signal_state()) == []
