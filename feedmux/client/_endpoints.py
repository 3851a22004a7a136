"""The endpoints a user gives, and the one-off statistics request of ``feedmux stats``.

This module owns what a trainer or a command makes of the addresses it was
given: each checked (a missing ``tcp://`` says to add it), the control
endpoints derived where none were given (and remembered as derived, so that an
error says so instead of naming a port the user never typed), and
:func:`fetch_stats`, the request behind ``feedmux stats``, ``ping`` and ``top``,
which recognises a server's data endpoint given in place of its control one.
It never keeps a socket open beyond one request and never imports the server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import zmq

from feedmux._plumbing.curve import ClientCurve
from feedmux._plumbing.sockets import (
    CONTROL_FRAME_BYTES,
    control_address_for,
    make_socket,
    mapped_zmq_errors,
    send_message,
)
from feedmux.errors import (
    ConfigurationError,
    FeedmuxError,
    RemoteError,
    TransportTimeoutError,
)
from feedmux.protocol import (
    CONTROL_LIMITS,
    STATS_NEXT_PAGE,
    Error,
    Scale,
    Stats,
    StatsRequest,
    decode,
    stats_order,
)

__all__ = ["check_endpoint", "endpoints", "fetch_stats", "request_scale"]


def check_endpoint(address: object, what: str = "endpoint") -> str:
    """``address`` if it is a ZeroMQ endpoint a trainer can connect to, else a clear error.

    Examples
    --------
    >>> check_endpoint("tcp://127.0.0.1:5555")
    'tcp://127.0.0.1:5555'
    >>> check_endpoint("127.0.0.1:5555", "data endpoint")
    Traceback (most recent call last):
    ...
    feedmux.errors.ConfigurationError: expected a data endpoint such as tcp://HOST:PORT, got '127.0.0.1:5555': add tcp:// (tcp://127.0.0.1:5555)
    """  # noqa: E501
    if not isinstance(address, str) or not address:
        raise ConfigurationError(f"expected a {what} such as tcp://HOST:PORT, got {address!r}")
    scheme, sep, rest = address.partition("://")
    if not sep:
        raise ConfigurationError(f"expected a {what} such as tcp://HOST:PORT, got {address!r}: "
                                 f"add tcp:// (tcp://{address})")
    if scheme not in _SCHEMES:
        raise ConfigurationError(f"expected a {what} starting with tcp://, ipc:// or inproc://, "
                                 f"got {address!r}")
    if scheme == "tcp" and not rest.rpartition(":")[2].isdigit():
        raise ConfigurationError(f"expected a {what} such as tcp://HOST:PORT (with a port), "
                                 f"got {address!r}")
    return address


_SCHEMES = ("tcp", "ipc", "inproc")


def endpoints(
    address: str | Sequence[str], control: str | Sequence[str] | None
) -> tuple[list[str], list[str], list[bool]]:
    """The data endpoints, one control endpoint per data endpoint (checked), and whether
    each control endpoint was derived (the data port + 1) rather than given."""
    addresses = [address] if isinstance(address, str) else list(address)
    if not addresses:
        raise ConfigurationError(
            f"expected a data endpoint or a non-empty list of them, got {address!r}"
        )
    for each in addresses:
        check_endpoint(each, "data endpoint")
    if control is None:
        controls = [control_address_for(a) for a in addresses]
    else:
        controls = [control] if isinstance(control, str) else list(control)
        for each in controls:
            check_endpoint(each, "control endpoint")
    if len(controls) != len(addresses):
        raise ConfigurationError(
            f"expected one control endpoint per data endpoint ({len(addresses)}), "
            f"got {len(controls)}: {controls!r}"
        )
    return addresses, controls, [control is None] * len(addresses)


def fetch_stats(
    control_address: str,
    *,
    timeout: float = 2.0,
    curve_server_key: str | bytes | None = None,
    curve_certificate: str | None = None,
) -> dict[str, Any]:
    """Ask the server at ``control_address`` for its statistics.

    A server with many trainers answers in pages (each fits in one control
    frame); this asks for every page and returns them as one map (``timeout``
    bounds them all together). Raises :class:`~feedmux.errors.ConfigurationError`
    for an address that is not an endpoint (a missing ``tcp://`` says so) and
    :class:`~feedmux.errors.TransportTimeoutError` when nothing answers within
    ``timeout`` seconds; when ``control_address`` is in fact a server's data
    endpoint (its control endpoint, the port above, answers and says so), the
    error names both. The ``curve_*`` arguments are those of :class:`~feedmux.RemoteLoader`.
    """
    check_endpoint(control_address, "control endpoint")
    security = (
        None if curve_server_key is None
        else ClientCurve.create(curve_server_key, curve_certificate)
    )
    try:
        return _ask_stats(control_address, timeout, security)
    except TransportTimeoutError as error:
        raise TransportTimeoutError(
            f"{error}{_data_port_hint(control_address, timeout, security)}") from None


def request_scale(control_address: str, workers: int, *, timeout: float = 2.0,
                  curve_server_key: str | bytes | None = None,
                  curve_certificate: str | None = None) -> dict[str, Any]:
    """Ask the server at ``control_address`` to run ``workers`` sampling workers (0: back
    to ``--workers auto``); its answer. Errors as :func:`fetch_stats`; a server that
    refuses the count raises :class:`~feedmux.errors.RemoteError` saying why."""
    check_endpoint(control_address, "control endpoint")
    security = (None if curve_server_key is None
                else ClientCurve.create(curve_server_key, curve_certificate))
    context: zmq.Context[Any] = zmq.Context()
    socket = make_socket(context, zmq.DEALER, hwm=10, max_message_bytes=CONTROL_FRAME_BYTES,
                         security=security)
    socket.sndtimeo = max(1, int(timeout * 1000))
    try:
        with mapped_zmq_errors("connect to", control_address):
            socket.connect(control_address)
        try:
            send_message(socket, Scale(workers=workers, client_id=f"scale-{os.getpid()}"))
        except zmq.Again:
            raise TransportTimeoutError(
                f"no connection to {control_address} within {timeout:g} s") from None
        answer = _stats_page(socket, control_address, time.monotonic() + timeout)
        if answer is None:
            raise TransportTimeoutError(f"no answer from {control_address} within {timeout:g} s")
        return answer
    finally:
        socket.close(linger=0)
        context.term()


def _data_port_hint(address: str, timeout: float, security: ClientCurve | None) -> str:
    """': it is the data endpoint of server S (control ...)' when the control endpoint
    derived from ``address`` (the port above, or ``.control``) answers for a server that
    bound ``address`` for its data."""
    try:
        control = control_address_for(address)
    except FeedmuxError:
        return ""
    if control == address:  # port 0: nothing to derive
        return ""
    try:
        stats = _ask_stats(control, min(timeout, 1.0), security)
    except FeedmuxError:
        return ""
    bound = str(stats.get("data_address", ""))
    if not (bound == address or (address.startswith("tcp://") and bound.startswith("tcp://")
            and bound.rpartition(":")[2] == address.rpartition(":")[2])):
        return ""
    return (f": {address} is the data endpoint of server {stats.get('server_id')}; its control "
            f"endpoint is {control}: give that one to feedmux stats, ping or top")


def _ask_stats(control_address: str, timeout: float,
               security: ClientCurve | None) -> dict[str, Any]:
    context: zmq.Context[Any] = zmq.Context()
    socket = make_socket(context, zmq.DEALER, hwm=10, max_message_bytes=CONTROL_FRAME_BYTES,
                         security=security)
    # A refused handshake (CURVE) tears the connection down: a send would then wait
    # for the next one, forever; the timeout bounds the send too.
    socket.sndtimeo = max(1, int(timeout * 1000))
    deadline = time.monotonic() + timeout
    values: dict[str, Any] = {}
    after: str | None = ""
    try:
        with mapped_zmq_errors("connect to", control_address):
            socket.connect(control_address)
        while after is not None:
            try:
                send_message(socket, StatsRequest(client_id=f"stats-{os.getpid()}", after=after))
            except zmq.Again:
                raise TransportTimeoutError(
                    f"no connection to {control_address} within {timeout:g} s") from None
            page = _stats_page(socket, control_address, deadline)
            if page is None:
                raise TransportTimeoutError(
                    f"no answer from {control_address} within {timeout:g} s")
            # The key naming the next page; a server without pages has none: one answer.
            following = page.pop(STATS_NEXT_PAGE, None)
            values.update(page)
            # Each page must start further on: anything else ends the paging here.
            after = (following if isinstance(following, str)
                     and stats_order(following) > stats_order(after) else None)
        return values
    finally:
        socket.close(linger=0)
        context.term()


def _stats_page(socket: Any, control_address: str, deadline: float) -> dict[str, Any] | None:
    """The next statistics page on ``socket`` (None: none before ``deadline``)."""
    while (remaining := deadline - time.monotonic()) > 0:
        if not socket.poll(int(remaining * 1000) + 1):
            break
        message = decode(socket.recv_multipart(copy=False), limits=CONTROL_LIMITS)
        if isinstance(message, Stats):
            return dict(message.values)
        if isinstance(message, Error):
            raise RemoteError(message.type, message.message, message.traceback,
                              message.server_id or control_address)
    return None
