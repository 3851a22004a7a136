"""What a trainer and the server's log say when a streamer raises or a sample cannot be
sent, and what ``--on-error skip`` skips (real ``feedmux serve`` processes)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from feedmux import RemoteLoader
from feedmux.errors import RemoteError
from tests.integration.conftest import CheckedThread, Spawned

pytestmark = pytest.mark.timeout(120)

SAMPLERS = "tests.integration.error_samplers"
BAD_FILE = "tests.integration.error_samplers._records('/data/shard-0.rec', 20, 5, 'raise')"


def drain(server: Spawned, **options: Any) -> list[int]:
    """Every sample's id until the stream ends (or raises)."""
    with RemoteLoader(server.data, control=server.control, timeout=30, **options) as loader:
        return [int(sample["id"]) for sample in loader]


def test_a_streamers_exception_names_the_streamer_and_how_to_skip_it(
        serve: Callable[..., Spawned]) -> None:
    server = serve(f"{SAMPLERS}:files", "--arg", "files=2", "--epochs", "1")
    # Before: "OSError: cannot read record 5 of /data/shard-0.rec", nothing on which streamer.
    with pytest.raises(RemoteError) as caught:
        drain(server)
    said = str(caught.value)
    assert f"raised by streamer {BAD_FILE}" in said
    assert "--on-error skip" in said and "skip the rest of that stream" in said
    assert server.wait(timeout=30) == 1
    assert f"raised by streamer {BAD_FILE}" in server.stderr


def test_skip_names_the_streamer_in_the_log_and_goes_on(serve: Callable[..., Spawned]) -> None:
    server = serve(f"{SAMPLERS}:files", "--arg", "files=2", "--epochs", "2",
                   "--on-error", "skip")
    ids = drain(server)
    assert sorted(ids) == sorted([*range(5), *range(20)] * 2)  # the bad file's rest: skipped
    assert server.wait(timeout=30) == 0
    assert f"streamer {BAD_FILE} raised OSError" in server.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_skip_stops_a_run_that_skips_every_sample_of_an_epoch(
        serve: Callable[..., Spawned], workers: str) -> None:
    server = serve(f"{SAMPLERS}:all_failing", "--epochs", "3", "--on-error", "skip",
                   "--workers", workers)
    # Before: three empty epochs served, and a trainer that got nothing, without an error.
    with pytest.raises(RemoteError, match="SkipLimitError") as caught:
        drain(server)
    said = str(caught.value)
    assert "skipped every sample of epoch 1" in said
    if workers == "1":
        assert re.search(r"the first: OSError: cannot open /data/missing-\d.rec \(raised by "
                         r"streamer tests.integration.error_samplers._always_failing", said)
    assert server.wait(timeout=30) == 1


def test_skip_stops_a_run_at_max_skips_errors_in_a_row(serve: Callable[..., Spawned]) -> None:
    server = serve(f"{SAMPLERS}:all_failing", "--arg", "files=8", "--on-error", "skip",
                   "--max-skips", "5")
    with pytest.raises(RemoteError, match="skipped 5 errors in a row") as caught:
        drain(server)
    assert "the first: OSError: cannot open /data/missing-" in str(caught.value)
    assert server.wait(timeout=30) == 1


@pytest.mark.parametrize("kind", ["picture", "object"])
def test_a_sample_the_codec_refuses_is_named_with_its_epoch_position(
        serve: Callable[..., Spawned], kind: str) -> None:
    server = serve(f"{SAMPLERS}:files", "--arg", "files=2", "--arg", f"kind={kind}",
                   "--epochs", "1")
    # Before: "cannot encode sample['x']: ... (sample 2 of 3)", a position in one message.
    with pytest.raises(RemoteError, match=r"sample \d+ of epoch 1 from StochasticMux of 2 "
                                          r"streamers cannot be sent: cannot encode") as caught:
        drain(server)
    assert "--on-error skip" in str(caught.value)
    assert server.wait(timeout=30) == 1


@pytest.mark.parametrize("workers", ["1", "2"], ids=["workers1", "workers2"])
@pytest.mark.parametrize("options", [{}, {"batch_size": 3}], ids=["samples", "batches"])
def test_skip_skips_and_counts_a_sample_the_codec_refuses(
        serve: Callable[..., Spawned], options: dict[str, Any], workers: str) -> None:
    # With 2 workers, before: 1 run in 4 stopped with "expected shard 0's samples from
    # epoch 1 position 5, got epoch 1 position 6" (the skipped sample's hole).
    server = serve(f"{SAMPLERS}:files", "--arg", "files=2", "--arg", "kind=picture",
                   "--epochs", "2", "--on-error", "skip", "--workers", workers)
    # Before, with batches: the server stopped at the first refused sample (exit 1).
    with RemoteLoader(server.data, control=server.control, timeout=30, **options) as loader:
        ids: list[int] = []
        for item in loader:
            ids.extend(int(value) for value in (item["id"] if options else [item["id"]]))
    assert sorted(ids) == sorted([*range(5), *range(6, 20), *range(20)] * 2)
    assert server.wait(timeout=30) == 0
    assert "skipping sample" in server.stderr
    assert "unsupported type tests.integration.error_samplers.Picture" in server.stderr


def test_a_batch_that_cannot_be_built_is_one_trainers_error_not_the_servers(
        serve: Callable[..., Spawned]) -> None:
    server = serve(f"{SAMPLERS}:lengths", "--epochs", "1")
    # Before: "ProtocolError: expected the samples of one batch to share one structure ..."
    # and the server exited with code 1.
    with pytest.raises(RemoteError, match="DataError: cannot build a batch of batch_size=16") \
            as caught:
        drain(server, batch_size=16)
    assert "bucket_by=" in str(caught.value) and "pad=True" in str(caught.value)
    assert server.returncode is None, "the server exited"


def test_the_other_trainers_keep_being_served(serve: Callable[..., Spawned]) -> None:
    # One sample of 64 does not stack: the trainer its batch was for gets the error; the
    # other trainer gets every other batch and the end of the stream.
    server = serve(f"{SAMPLERS}:one_odd", "--epochs", "1", "--min-trainers", "2",
                   "--samples-per-message", "4")
    outcomes: list[Any] = [None, None]

    def trainer(slot: int) -> None:
        try:
            with RemoteLoader(server.data, control=server.control, timeout=30,
                              batch_size=4) as loader:
                outcomes[slot] = [int(i) for batch in loader for i in batch["id"]]
        except RemoteError as error:
            outcomes[slot] = error

    threads = [CheckedThread(trainer, slot) for slot in (0, 1)]
    for thread in threads:
        thread.join(timeout=60)
    errors = [outcome for outcome in outcomes if isinstance(outcome, RemoteError)]
    served = [outcome for outcome in outcomes if isinstance(outcome, list)]
    assert len(errors) == 1 and "cannot build a batch of batch_size=4" in str(errors[0])
    assert len(served) == 1 and served[0] and 13 not in served[0]
    assert server.wait(timeout=30) == 0


def test_a_ranked_jobs_batch_that_cannot_be_built_says_what_to_do(
        serve: Callable[..., Spawned]) -> None:
    server = serve(f"{SAMPLERS}:lengths", "--epochs", "1")
    # Before: the bare ProtocolError ("expected the samples of one batch to share one
    # structure ..."). The ranks step together: the run stops, saying what to do.
    with pytest.raises(RemoteError, match="DataError: cannot build a batch of batch_size=8") \
            as caught:
        drain(server, batch_size=8, rank=0)
    assert "bucket_by=" in str(caught.value) and "the run stops" in str(caught.value)
    assert server.wait(timeout=30) == 1
