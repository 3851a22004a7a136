"""The Prometheus endpoint of a server: its statistics as metrics on ``/metrics``.

This module owns the translation of the control core's statistics (the same
flat map ``feedmux stats`` prints) into Prometheus metric families, and the
HTTP thread that serves them. ``prometheus-client`` is an optional extra
(``feedmux[metrics]``), imported only when a server asks for metrics; without
it :func:`~feedmux.server.config.check_metrics_available` says which extra to
install. The figures are read at scrape time from the HTTP thread, through a
``stats`` callable that only reads counters and copies of the server's
containers: this module must never
change server state, block the data path or bind anything but what it was told
(loopback by default).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from feedmux.errors import ConfigurationError
from feedmux.server.config import check_metrics_available

__all__ = ["COUNTERS", "GAUGES", "MetricsEndpoint", "families"]

log = logging.getLogger("feedmux.server")

Stats = Mapping[str, Any]

#: Metric name (without ``feedmux_`` and ``_total``) → statistics key, for counters.
COUNTERS = {
    "samples_sent": ("samples_sent", "Samples sent to trainers."),
    "messages_sent": ("messages_sent", "Data messages sent to trainers."),
    "bytes_sent": ("bytes_sent", "Bytes of data messages sent to trainers."),
    "sampler_busy_seconds": (
        "sampler_busy_seconds",
        "Seconds spent sampling and encoding, summed over the sampling processes.",
    ),
    "send_blocked_seconds": (
        "send_blocked_seconds", "Seconds the data path waited because no trainer could take more.",
    ),
    "reconnects": ("reconnects", "Trainers that came back on a new connection."),
    "stray_data_messages": (
        "stray_data_messages", "Messages on the data socket that are no trainer's credit or "
        "acknowledgement (no feedmux message), read and dropped.",
    ),
    "errors_skipped": ("errors_skipped", "Streams skipped after an exception (on_error=skip)."),
    "epochs_completed": ("epochs_completed", "Epochs whose every sample has been sent."),
    "counted": ("counted", "The --count-field sum over the samples drawn (tokens, ...)."),
    "rank_messages_resent": (
        "rank_messages_resent", "Messages re-sent to a restarted rank (ranked trainers).",
    ),
    "worker_changes": (
        "worker_changes", "Changes of the number of running sampling workers (auto or asked).",
    ),
}
#: Metric name (without ``feedmux_``) → statistics key, for gauges.
GAUGES = {
    "epoch": ("epoch", "The epoch being sent (1-based; 0 before the first sample)."),
    "epoch_position": ("epoch_position", "Samples of the current epoch sent so far."),
    "epoch_size": ("epoch_size", "Samples per epoch, once known."),
    "samples_per_second": (
        "samples_per_second", "Samples sent per second over the last 10 s; absent before a rate.",
    ),
    "epoch_eta_seconds": (
        "eta_s", "Seconds to the current epoch's end at that rate; absent while unknown.",
    ),
    "counted_per_second": (
        "counted_per_second", "The --count-field unit (tokens, ...) per second over the last "
        "10 s; absent without a count field or before a rate.",
    ),
    "trainers": ("connected_trainers", "Trainers heard from recently."),
    "workers": ("workers", "Sampling processes running shards now."),
    "trainers_wait_fraction": (
        "trainers_wait_fraction", "The trainers' mean reported wait for data (0-1), over those "
        "heard in the last 3 s; absent when none reports it.",
    ),
    "uptime_seconds": ("uptime_s", "Seconds since the server started."),
    "world_size": ("world_size", "Ranks of the data-parallel job (ranked trainers)."),
    "rank_messages_kept": (
        "rank_messages_kept", "Messages kept for a restarted rank (sent, not yet handed out).",
    ),
}


def families(stats: Stats) -> Iterator[Any]:
    """The Prometheus metric families for one statistics snapshot.

    Per-worker liveness comes from the ``worker.<i>.alive`` keys, per-trainer
    messages from ``trainer.<id>.received_messages`` (as labels), and each trainer's
    compression from ``trainer.<id>.compress``.

    Examples
    --------
    >>> stats = {"trainer.t1.compress": "lz4", "trainer.t2.compress": "off"}
    >>> [family] = [f for f in families(stats) if f.name == "feedmux_trainer_compressed"]
    >>> [(sample.labels["trainer"], sample.labels["codec"], sample.value)
    ...  for sample in family.samples]
    [('t1', 'lz4', 1), ('t2', 'off', 0)]
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for name, (key, text) in COUNTERS.items():
        value = stats.get(key)
        if isinstance(value, (int, float)):
            yield CounterMetricFamily(f"feedmux_{name}", text, value=value)
    for name, (key, text) in GAUGES.items():
        value = stats.get(key)
        if isinstance(value, (int, float)):
            yield GaugeMetricFamily(f"feedmux_{name}", text, value=value)
    workers = GaugeMetricFamily("feedmux_worker_up", "1 while a sampling worker process runs.",
                                labels=["worker"])
    trainers = CounterMetricFamily(
        "feedmux_trainer_received_messages", "Data messages a trainer said it received.",
        labels=["trainer"],
    )
    compressed = GaugeMetricFamily(
        "feedmux_trainer_compressed",
        "1 while a trainer's link is compressed (--compress), by codec.",
        labels=["trainer", "codec"])
    for key, value in stats.items():
        parts = key.split(".")
        if len(parts) >= 3 and parts[0] == "trainer" and parts[-1] == "compress":
            compressed.add_metric([".".join(parts[1:-1]), str(value)], int(value != "off"))
        if len(parts) < 3 or not isinstance(value, (int, float)):
            continue
        if parts[0] == "worker" and parts[-1] == "alive":
            workers.add_metric([parts[1]], value)
        elif parts[0] == "trainer" and parts[-1] == "received_messages":
            trainers.add_metric([".".join(parts[1:-1])], value)
    if "workers" in stats and not workers.samples:  # one process: the server itself samples
        workers.add_metric(["0"], 1)
    yield workers
    yield trainers
    yield compressed


class MetricsEndpoint:
    """An HTTP server thread answering ``/metrics`` from a ``stats`` callable.

    Parameters
    ----------
    stats : callable
        Returns the current statistics; called from the HTTP thread at each scrape.
    port : int
        The TCP port; 0 picks a free one (see :attr:`address`).
    host : str
        The interface to bind; loopback unless told otherwise.
    """

    def __init__(self, stats: Callable[[], Stats], port: int, host: str = "127.0.0.1") -> None:
        check_metrics_available()
        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry

        class _Collector:
            def collect(self) -> Iterator[Any]:
                return families(stats())

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector())
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as error:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {error}"
            ) from error
        bound_host, bound_port = self._httpd.server_address[:2]
        if isinstance(bound_host, bytes):
            bound_host = bound_host.decode()
        #: Where the metrics are served, e.g. ``http://127.0.0.1:9100/metrics``.
        self.address = f"http://{bound_host}:{bound_port}/metrics"

    def close(self) -> None:
        """Stop serving and join the HTTP thread (bounded)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)
        if self._thread.is_alive():
            log.warning("the metrics thread did not stop within 5 s")
