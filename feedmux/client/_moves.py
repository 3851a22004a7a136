"""Servers that move: asking where a loader's servers listen now, and following them.

This module owns what a :class:`~feedmux.client.remote.RemoteLoader` given a
``resolve`` callable does about servers that come back on other endpoints (a
sampler restarted by a cluster manager on another node or port): when to ask
the callable (every :data:`RESOLVE_INTERVAL` seconds, never per sample), which
links moved, and how a socket is pointed at the new endpoint. It must never
decide anything else about the servers (that is the link state's) and never
block the loader for longer than the callable takes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import zmq

if TYPE_CHECKING:
    from feedmux.client._acks import HandOutAcks
    from feedmux.client._link import Action, ServerLinks

__all__ = ["RESOLVE_INTERVAL", "AddressBook", "Resolve", "reconnect"]

log = logging.getLogger("feedmux.client")

#: Seconds between two questions to the resolver.
RESOLVE_INTERVAL = 1.0

#: ``() -> [(data endpoint, control endpoint), ...]``, one pair per server in the loader's
#: order, or None when the answer is not known right now.
Resolve = Callable[[], "Sequence[tuple[str, str]] | None"]


class AddressBook:
    """When to ask ``resolve`` where the servers are, and which of them moved.

    Examples
    --------
    >>> book = AddressBook(lambda: [("tcp://h:3", "tcp://h:4")], interval=1.0)
    >>> book.due(0.5), book.moved(1.0, [("tcp://h:1", "tcp://h:2")]), book.due(1.5)
    (False, [(0, 'tcp://h:3', 'tcp://h:4')], False)
    """

    def __init__(self, resolve: Resolve, *, interval: float = RESOLVE_INTERVAL) -> None:
        self.resolve = resolve
        self.interval = interval
        self.next_at = interval
        self._failed = False

    def due(self, now: float) -> bool:
        """Whether it is time to ask again."""
        return now >= self.next_at

    def moved(self, now: float, current: Sequence[tuple[str, str]]) -> list[tuple[int, str, str]]:
        """Ask the resolver; ``(link number, data, control)`` of each server that moved."""
        self.next_at = now + self.interval
        try:
            answer = self.resolve()
        except Exception as error:  # the resolver's own failure must not stop the training
            if not self._failed:
                log.warning("cannot ask where the servers are (%s: %s); keeping %s",
                            type(error).__name__, error, list(current))
            self._failed = True
            return []
        self._failed = False
        if answer is None:
            return []
        if len(answer) != len(current):
            log.warning("expected %d server endpoint pairs from the resolver, got %d: %r",
                        len(current), len(answer), answer)
            return []
        return [(index, data, control)
                for index, ((data, control), before) in enumerate(zip(answer, current, strict=True))
                if (data, control) != tuple(before)]


    def follow(self, now: float, links: ServerLinks, data_sockets: Sequence[Any],
               control_sockets: Sequence[Any], acks: HandOutAcks | None) -> list[Action]:
        """Ask, and point the sockets of every server that moved at its new endpoints.

        Returns the link state's actions for them (a hello to each moved server).
        """
        pairs = [(link.data_address, link.control_address) for link in links.links]
        actions: list[Action] = []
        for index, data, control in self.moved(now, pairs):
            reconnect(data_sockets[index], pairs[index][0], data)
            reconnect(control_sockets[index], pairs[index][1], control)
            if acks is not None:
                acks.move(index, control)
            actions.extend(links.move(index, data, control))
        return actions


def reconnect(socket: Any, old: str, new: str) -> None:
    """Point ``socket`` at ``new`` instead of ``old`` (what was queued for ``old`` is dropped)."""
    try:
        socket.disconnect(old)
    except zmq.ZMQError:  # never connected there (or already gone): nothing to undo
        pass
    socket.connect(new)
