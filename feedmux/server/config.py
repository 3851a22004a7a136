"""The server's settings as one frozen, validated record.

This module owns :class:`ServerConfig`: every option of a server, checked once
at construction, as plain data that crosses into forked worker processes. It
must never open a socket or start anything; the server and its workers only
read it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from feedmux._plumbing.shm import DEFAULT_SHM_SIZE
from feedmux._plumbing.sockets import DEFAULT_BIND, DEFAULT_HWM, control_address_for
from feedmux.errors import ConfigurationError
from feedmux.server._delivery.groups import JOIN_MODES, parse_group_buffer
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server.factory import Source

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "ServerConfig"]

#: A server process's exit codes: done, failed, a bad command line or source.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class ServerConfig:
    """Everything a server needs, as plain data (it crosses into worker processes)."""

    source: Source
    factory_kwargs: Mapping[str, Any] = field(default_factory=dict)
    bind: str = DEFAULT_BIND
    control: str | None = None
    workers: int = 1
    epochs: int | None = None
    epoch_size: int | None = None
    hwm: int = DEFAULT_HWM
    samples_per_message: int | None = None
    max_delay: float = 0.005
    on_error: str = "raise"
    log_every: float = 10.0
    drain_timeout: float = 30.0
    drain_idle: float = 3.0
    min_trainers: int = 0
    reliable: bool = False
    uneven: str = "pad"
    rank_timeout: float = 60.0
    group_buffer: int | str | None = None
    join: str = "epoch"
    group_timeout: float = 10.0
    curve_secret: str | None = None
    curve_clients: str | None = None
    server_id: str = ""
    zero_copy: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # The run's seed (reseeds every sampling process per epoch); None: the mux's, or fresh.
    seed: int | None = None
    # The same-host shared-memory pool (docs/server.md): off with --no-shm.
    shm: bool = True
    shm_size: int = DEFAULT_SHM_SIZE

    def __post_init__(self) -> None:
        def require(ok: bool, what: str, value: object) -> None:
            if not ok:
                raise ConfigurationError(f"expected {what}, got {value!r}")

        require(self.workers >= 1, "workers >= 1", self.workers)
        require(self.epochs is None or self.epochs >= 1, "epochs None or >= 1", self.epochs)
        require(self.epoch_size is None or self.epoch_size >= 1, "epoch_size >= 1", self.epoch_size)
        require(self.hwm >= 1, "hwm >= 1", self.hwm)
        require(
            self.samples_per_message is None or self.samples_per_message >= 1,
            "samples_per_message None or >= 1",
            self.samples_per_message,
        )
        require(self.on_error in ("raise", "skip"), "on_error 'raise' or 'skip'", self.on_error)
        require(self.log_every > 0, "log_every > 0 seconds", self.log_every)
        require(self.max_delay >= 0, "max_delay >= 0 seconds", self.max_delay)
        require(self.min_trainers >= 0, "min_trainers >= 0", self.min_trainers)
        require(self.uneven in ("pad", "drop"), "uneven 'pad' or 'drop'", self.uneven)
        require(self.rank_timeout > 0, "rank_timeout > 0 seconds", self.rank_timeout)
        require(self.join in JOIN_MODES, "join 'epoch' or 'now'", self.join)
        require(self.group_timeout > 0, "group_timeout > 0 seconds", self.group_timeout)
        if self.group_buffer is not None:
            parse_group_buffer(self.group_buffer)  # raises a clear error on a bad limit
            require(not self.reliable, "reliable=False with group_buffer (consumer groups "
                    "use plain delivery)", self.reliable)
        require(self.metrics_port is None or 0 <= self.metrics_port <= 65535,
                "metrics_port None or a TCP port 0-65535", self.metrics_port)
        require(
            self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                                  and self.seed >= 0),
            "seed None or an int >= 0", self.seed,
        )
        require(self.shm_size >= 1 << 20, "shm_size >= 1 MiB", self.shm_size)
        if self.metrics_port is not None:
            from feedmux.server._control.metrics import check_available

            check_available()
        if not self.server_id:
            object.__setattr__(self, "server_id", uuid.uuid4().hex[:12])

    def options(self) -> dict[str, Any]:
        """Every setting but the source, as keyword arguments of :class:`Server`."""
        return {item.name: getattr(self, item.name) for item in fields(self)
                if item.name != "source"}

    @property
    def control_address(self) -> str:
        """The control endpoint: explicit, or derived from the data endpoint."""
        return self.control or control_address_for(self.bind)

    @property
    def grouped(self) -> bool:
        """Whether the server sends its stream to consumer groups (``group_buffer`` set)."""
        return self.group_buffer is not None

    @property
    def policy(self) -> BatchPolicy:
        return BatchPolicy(self.samples_per_message, self.max_delay, not self.zero_copy)
