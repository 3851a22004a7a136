"""What ``--on-error skip`` may skip: the guard that stops a run that serves nothing.

This module owns the accounting of skipped errors in one sampling process (the
server's own, or a worker): each error a stream raised (or a sample the codec
refused) that was skipped, each sample sent, and each epoch's end. A run that
skips ``max_skips`` errors in a row without serving one sample, or skips every
sample of an epoch, is stopped with :class:`~feedmux.errors.SkipLimitError`
naming the first error of the streak, its type and the streamer that raised it:
skipping is for the odd bad file, and a run whose every sample fails would
otherwise serve empty epochs for ever. It never logs, sends or decides what is
skipped (the producer does), and never reads a clock.
"""

from __future__ import annotations

from feedmux.errors import SkipLimitError
from feedmux.sampling.streamer import blamed_streamer

__all__ = ["DEFAULT_MAX_SKIPS", "SkipGuard", "describe_error"]

#: Errors skipped in a row (no sample served in between) that stop a run by default.
DEFAULT_MAX_SKIPS = 1000
#: Characters of the first error's message kept in the guard's error.
MAX_FIRST_ERROR = 2000


def describe_error(error: BaseException) -> str:
    """``Type: message``, and the streamer that raised it when known.

    Examples
    --------
    >>> describe_error(ValueError("bad row"))
    'ValueError: bad row'
    """
    text = f"{type(error).__name__}: {error}"[:MAX_FIRST_ERROR]
    streamer = blamed_streamer(error)
    return text if streamer is None else f"{text} (raised by streamer {streamer})"


class SkipGuard:
    """Counts the errors ``--on-error skip`` skipped; raises when they are all there is.

    Parameters
    ----------
    max_skips : int
        Errors skipped in a row, with no sample served in between, that stop
        the run (0: no limit on the streak; an epoch wholly skipped still stops it).
    whole_epochs : bool
        Whether an epoch with no sample and at least one skip stops the run (a
        worker sees only its shards' part of an epoch: it counts streaks only).

    Examples
    --------
    >>> guard = SkipGuard(max_skips=3)
    >>> guard.skipped(OSError("cannot read a.npz")); guard.sent(5); guard.epoch_done(1, 5)
    >>> guard.skipped(OSError("cannot read b.npz")); guard.skipped(OSError("c.npz"))
    >>> guard.skipped(OSError("d.npz"))
    Traceback (most recent call last):
    ...
    feedmux.errors.SkipLimitError: --on-error skip skipped 3 errors in a row without serving a \
sample (the limit: --max-skips 3); the first: OSError: cannot read b.npz
    """

    def __init__(self, max_skips: int = DEFAULT_MAX_SKIPS, *, whole_epochs: bool = True) -> None:
        self.max_skips = max_skips
        self.whole_epochs = whole_epochs
        self._streak = 0
        self._first: BaseException | None = None  # the first error of the streak
        self._epoch_skips = 0

    def skipped(self, error: BaseException) -> None:
        """``error`` was skipped; raises :class:`SkipLimitError` at the limit."""
        if isinstance(error, SkipLimitError):
            raise error  # from a mux inside another: stop, do not skip it
        if self._streak == 0:
            self._first = error
        self._streak += 1
        self._epoch_skips += 1
        if self.max_skips and self._streak >= self.max_skips:
            raise SkipLimitError(
                f"--on-error skip skipped {self._streak} errors in a row without serving a "
                f"sample (the limit: --max-skips {self.max_skips}); the first: "
                f"{describe_error(error if self._first is None else self._first)}")

    def sent(self, samples: int) -> None:
        """``samples`` samples were served: the streak is over."""
        if samples:
            self._streak, self._first = 0, None

    def epoch_done(self, epoch: int, count: int) -> None:
        """Epoch ``epoch`` ended with ``count`` samples served; raises if it had none and
        skipped errors."""
        skips, self._epoch_skips = self._epoch_skips, 0
        if self.whole_epochs and not count and skips and self._first is not None:
            raise SkipLimitError(
                f"--on-error skip skipped every sample of epoch {epoch} ({skips} error(s), "
                f"no sample served); the first: {describe_error(self._first)}")
