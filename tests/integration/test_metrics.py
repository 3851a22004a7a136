"""The Prometheus endpoint scraped over HTTP while a real server feeds a real trainer."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from feedmux.client.remote import RemoteLoader
from feedmux.errors import ConfigurationError
from feedmux.server.server import Server
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.timeout(60)

prometheus_parser = pytest.importorskip("prometheus_client.parser")

MIB = 1 << 20
#: Messages that may be between the server's counter and the trainer: both queues (hwm 4
#: each) plus what the kernel's socket buffers hold of 1 MiB messages, with room to spare.
IN_FLIGHT = 40


def scrape(address: str) -> dict[str, float]:
    """Every sample on the metrics page, by name with its labels: ``name{label="v"}``."""
    with urllib.request.urlopen(address, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    values = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


@pytest.fixture
def server() -> Iterator[Server]:
    # 80 samples of 1 MiB per epoch: few fit in the kernel's buffers, so what is in
    # flight stays far below an epoch and the gauges can be checked exactly.
    server = Server(
        "tests.integration.samplers:numbered", factory_kwargs={"per_stream": 20, "width": MIB // 4},
        bind="tcp://127.0.0.1:0", samples_per_message=1, hwm=4, metrics_port=0,
    ).start()
    yield server
    assert server.stop() is not None


def test_counters_match_what_the_trainer_received_and_the_epoch_gauge_follows(
    server: Server,
) -> None:
    address = server.metrics_address
    assert address is not None and address.startswith("http://127.0.0.1:")
    received = 0
    with RemoteLoader(server.data_address, control=server.control_address, hwm=4, timeout=20,
                      with_meta=True) as loader:
        for epoch in (1, 2, 3):
            for meta, _ in loader:
                received += 1
                if meta.epoch == epoch:
                    break
            # The server counts a message just after handing it to ZeroMQ: under load the
            # trainer can hold it before the count does, so wait (bounded) for the count.
            def counted(count: int = received) -> bool:
                return scrape(address)["feedmux_samples_sent_total"] >= count

            wait_until(counted, 10, "the sent counter to count what the trainer received")
            metrics = scrape(address)
            sent = metrics["feedmux_samples_sent_total"]
            assert received <= sent <= received + IN_FLIGHT, (received, sent)
            assert metrics["feedmux_messages_sent_total"] == sent  # one sample per message
            assert metrics["feedmux_bytes_sent_total"] >= sent * MIB
            assert metrics["feedmux_epoch"] == epoch
            assert metrics["feedmux_epochs_completed_total"] == epoch - 1
            assert metrics["feedmux_trainers"] == 1
            assert metrics['feedmux_worker_up{worker="0"}'] == 1
            if epoch > 1:
                assert metrics["feedmux_epoch_size"] == 80
        assert metrics["feedmux_sampler_busy_seconds_total"] > 0
        assert metrics["feedmux_errors_skipped_total"] == 0
        assert f'feedmux_trainer_received_messages_total{{trainer="{loader.client_id}"}}' \
            in metrics


def test_worker_liveness_is_one_gauge_per_worker() -> None:
    server = Server("tests.integration.samplers:numbered", bind="tcp://127.0.0.1:0", workers=2,
                    metrics_port=0).start()
    try:
        assert server.metrics_address is not None
        metrics = scrape(server.metrics_address)
        assert metrics['feedmux_worker_up{worker="0"}'] == 1
        assert metrics['feedmux_worker_up{worker="1"}'] == 1
        assert metrics["feedmux_workers"] == 2
    finally:
        assert server.stop() is not None


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "prometheus_client" else real(name, *a))
    with pytest.raises(ConfigurationError, match=r"feedmux\[metrics\]"):
        Server("tests.integration.samplers:numbered", metrics_port=0)


def test_a_bad_metrics_port_is_refused_with_what_was_expected() -> None:
    with pytest.raises(ConfigurationError, match=r"expected metrics_port .* got 70000"):
        Server("tests.integration.samplers:numbered", metrics_port=70000)
