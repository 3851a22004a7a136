"""Requests to change the number of sampling workers, as they come over control.

:class:`ScaleRequests` holds the latest ``Scale`` request (``feedmux scale ADDRESS
N``) until the sampling side takes it, and answers the requester. It decides
nothing about the count: the workers' pool clamps it to what it may run, and 0
hands the count back to ``--workers auto``. Pure: no sockets, no processes.
"""

from __future__ import annotations

from feedmux.protocol import Error, Scale, Stats

__all__ = ["ScaleRequests"]


class ScaleRequests:
    """The latest requested worker count, until :meth:`take` takes it.

    Examples
    --------
    >>> requests = ScaleRequests("s1")
    >>> requests.request(Scale(workers=3))
    Stats(values={'workers_requested': 3})
    >>> requests.take(), requests.take()
    (3, None)
    >>> requests.request(Scale(workers=-1)).message
    'expected a worker count >= 0 (0: back to auto), got -1'
    """

    def __init__(self, server_id: str) -> None:
        self.server_id = server_id
        self._pending: int | None = None

    def request(self, message: Scale) -> Stats | Error:
        """Keep ``message``'s count for the sampling side; the answer to its sender."""
        if message.workers < 0:
            return Error(type="feedmux.errors.ConfigurationError",
                         message=("expected a worker count >= 0 (0: back to auto), got "
                                  f"{message.workers}"), server_id=self.server_id)
        self._pending = message.workers
        return Stats({"workers_requested": message.workers})

    def take(self) -> int | None:
        """The count asked for since the last call, or None."""
        pending, self._pending = self._pending, None
        return pending
