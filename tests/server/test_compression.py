"""Compression per trainer link, driven with made-up clocks and byte counts: no sockets."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable

import numpy as np
import pytest

from feedmux.protocol import Codec, Data, compress_frames, decode, encode
from feedmux.protocol import packed as packed_header
from feedmux.server._delivery.compression import (
    GAIN,
    HOLD,
    SETTLE,
    SPEEDS_KEPT,
    WINDOW,
    LinkCompression,
)
from feedmux.server._sources.packing import SharedCodec

T = b"trainer-1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fast_cpu() -> Callable[[], float]:
    """A timer by which every compression takes 0.1 ms: the CPU is never the limit, so a
    test's link decides (the real timer made a loaded machine's slow measurement pass a
    27% rise for a gain in CI)."""
    ticks = itertools.count()
    return lambda: next(ticks) * 5e-5


def message(compressible: bool) -> list[object]:
    rng = np.random.default_rng(0)
    x = (np.tile(np.arange(256, dtype=np.uint8), 1024) if compressible
         else rng.integers(0, 256, 1 << 18, dtype=np.uint8))
    return encode(Data(np.array([[1, 0]]), [{"x": x}]))


def run(compression: LinkCompression, clock: Clock, frames: list[object], seconds: float,
        rate_off: float, rate_on: float) -> None:
    """Offer ``frames`` to T every 10 ms for ``seconds``; the link takes ``rate_off`` raw
    bytes/s uncompressed and ``rate_on`` compressed (what a shaped link would do)."""
    raw = sum(memoryview(frame).nbytes for frame in frames)  # type: ignore[arg-type]
    owed = 0.0
    end = clock.now + seconds
    while clock.now < end:
        wire = compression.wire(T, frames)
        owed += (rate_on if wire is not frames else rate_off) * 0.01
        while owed >= raw:
            compression.delivered(T, wire)
            owed -= raw
        clock.now += 0.01


def test_off_and_a_fixed_codec_do_what_they_say() -> None:
    frames = message(True)
    assert LinkCompression(None, lambda t: False).wire(T, frames) is frames
    wire = LinkCompression(Codec("lz4"), lambda t: False).wire(T, frames)
    assert sum(map(len, wire)) < 10_000  # type: ignore[arg-type]
    decoded = decode(wire)
    assert isinstance(decoded, Data) and (decoded.samples[0]["x"][:256] == np.arange(256)).all()


def test_auto_never_compresses_a_same_host_link() -> None:
    clock = Clock()
    compression = LinkCompression("auto", lambda target: True, clock, fast_cpu())
    run(compression, clock, message(True), 3 * WINDOW, 1e6, 1e8)
    assert compression.wire(T, message(True)) is not None
    stats = compression.stats()
    assert stats[f"trainer.{T.decode()}.compress"] == "off"
    assert stats[f"trainer.{T.decode()}.compress_reason"] == "same host (shared memory)"


def test_auto_turns_on_when_the_link_is_the_limit_and_compressing_pays() -> None:
    clock = Clock()
    compression = LinkCompression("auto", lambda target: False, clock, fast_cpu())
    run(compression, clock, message(True), 3 * WINDOW, rate_off=20e6, rate_on=200e6)
    stats = compression.stats()
    assert stats[f"trainer.{T.decode()}.compress"] in ("lz4", "zstd:1"), stats
    assert str(stats[f"trainer.{T.decode()}.compress_reason"]).startswith("link is the limit")
    assert float(stats[f"trainer.{T.decode()}.compress_ratio"]) < 0.1  # type: ignore[arg-type]


def test_a_trial_does_not_count_what_was_queued_before_the_switch() -> None:
    # The link leaves each message 0.2 s after it was handed over (a full queue): after the
    # switch, the raw messages queued still go at the raw rate for 0.2 s. The stream
    # compresses ~1000x, so 2x the raw rate is asked; the link gives 2.2x once the queue
    # holds compressed messages, 1.96x over a window that would count the queue's drain.
    lag = 0.2
    assert lag < SETTLE
    clock = Clock()
    compression = LinkCompression("auto", lambda target: False, clock, fast_cpu())
    frames = message(True)
    raw = sum(memoryview(frame).nbytes for frame in frames)  # type: ignore[arg-type]
    handed: list[bool] = []  # per 10 ms step, whether the message handed over was compressed
    owed = 0.0
    while clock.now < 3 * WINDOW:
        wire = compression.wire(T, frames)
        handed.append(wire is not frames)
        leaving = handed[max(0, len(handed) - 1 - round(lag / 0.01))]
        owed += (44e6 if leaving else 20e6) * 0.01
        while owed >= raw:
            compression.delivered(T, wire)
            owed -= raw
        clock.now += 0.01
    reason = str(compression.stats()[f"trainer.{T.decode()}.compress_reason"])
    assert reason.startswith("link is the limit"), reason


def test_auto_goes_off_again_when_compressing_gains_nothing_and_tries_again_later() -> None:
    # The CPU (or the trainer) is the limit: the rate is the same either way.
    clock = Clock()
    compression = LinkCompression("auto", lambda target: False, clock, fast_cpu())
    run(compression, clock, message(True), 3 * WINDOW, rate_off=20e6, rate_on=20e6 * GAIN * 0.9)
    key = f"trainer.{T.decode()}"
    assert compression.stats()[f"{key}.compress"] == "off"
    assert str(compression.stats()[f"{key}.compress_reason"]).startswith("no gain")
    # After the hold it tries again; now the link is the limit.
    run(compression, clock, message(True), HOLD + 3 * WINDOW, rate_off=20e6, rate_on=200e6)
    assert compression.stats()[f"{key}.compress"] != "off"


def test_auto_never_tries_an_incompressible_stream() -> None:
    clock = Clock()
    compression = LinkCompression("auto", lambda target: False, clock, fast_cpu())
    frames = message(False)
    tried = []
    end = 3 * WINDOW
    while clock.now < end:
        wire = compression.wire(T, frames)
        tried.append(wire is not frames)
        compression.delivered(T, wire)
        clock.now += 0.01
    assert not any(tried)
    assert str(compression.stats()[f"trainer.{T.decode()}.compress_reason"]).startswith(
        "incompressible")


def test_auto_does_not_take_noise_for_a_gain() -> None:
    # Half noise, half zeros: a ratio of about 0.5, so a full link would nearly double its
    # rate compressed. A rise of 27% (what a loaded machine's noise gave on a fast veth
    # link, where the CPU was the limit) is not enough.
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.integers(0, 256, 1 << 17, dtype=np.uint8),
                        np.zeros(1 << 17, dtype=np.uint8)])
    frames = encode(Data(np.array([[1, 0]]), [{"x": x}]))
    clock = Clock()
    compression = LinkCompression("auto", lambda target: False, clock, fast_cpu())
    run(compression, clock, frames, 3 * WINDOW, rate_off=15e6, rate_on=19e6)
    key = f"trainer.{T.decode()}"
    assert 0.4 < float(compression.stats()[f"{key}.compress_ratio"]) < 0.6  # type: ignore[arg-type]
    assert compression.stats()[f"{key}.compress"] == "off"
    assert str(compression.stats()[f"{key}.compress_reason"]).startswith("no gain")


def test_a_workers_compressed_message_goes_as_it_is_or_inflated_per_link_under_auto() -> None:
    # The stream as the sampling workers send it: compressed with lz4. Three links: one
    # maps the pool, one is not the limit (no gain), one is (link is the limit).
    clock = Clock()
    local, fast, slow = b"local", b"fast", b"slow"
    compression = LinkCompression("auto", lambda target: target == local, clock, fast_cpu())
    raw = message(True)
    size = sum(memoryview(frame).nbytes for frame in raw)  # type: ignore[arg-type]
    packed = compress_frames(raw, Codec("lz4"), seq=0)
    rates = {local: (1e9, 1e9), fast: (20e6, 20e6), slow: (20e6, 200e6)}
    owed = dict.fromkeys(rates, 0.0)
    wires: dict[bytes, object] = {}
    while clock.now < 3 * WINDOW:
        for target, (rate_off, rate_on) in rates.items():
            wire = wires[target] = compression.wire(target, packed)
            owed[target] += (rate_on if packed_header(wire) else rate_off) * 0.01
            while owed[target] >= size:
                compression.delivered(target, wire)
                owed[target] -= size
        clock.now += 0.01
    stats = compression.stats()
    assert stats["trainer.local.compress_reason"] == "same host (shared memory)"
    assert str(stats["trainer.fast.compress_reason"]).startswith("no gain"), stats
    assert str(stats["trainer.slow.compress_reason"]).startswith("link is the limit"), stats
    # The links that want the message raw get it inflated (once per message, whatever the
    # number of links).
    for target in (local, fast):
        decoded = decode(wires[target])  # type: ignore[arg-type]
        assert packed_header(wires[target]) is None and isinstance(decoded, Data)
        assert (decoded.samples[0]["x"][:256] == np.arange(256)).all()
    assert 0 < int(stats["inflated_by_server"]) <= 3 * WINDOW / 0.01  # type: ignore[arg-type]
    # The workers are asked for the codec the compressing link uses (lz4 or zstd:1, as
    # measured); compressed with it, the message goes to that link as it is.
    codec = compression.worker_codec()
    assert codec is not None and codec.label == stats["trainer.slow.compress"]
    by_server = compression.stats()["compressed_by_server"]
    followed = compress_frames(raw, codec, seq=1)
    assert compression.wire(slow, followed) is followed
    assert packed_header(compression.wire(fast, followed)) is None
    assert compression.stats()["compressed_by_server"] == by_server


def test_the_workers_codec_is_the_fixed_one_or_none() -> None:
    assert LinkCompression(Codec("zstd", 3), lambda t: False).worker_codec() == Codec("zstd", 3)
    assert LinkCompression(None, lambda t: False).worker_codec() is None
    assert LinkCompression("auto", lambda t: False).worker_codec() is None  # none on yet


def photographs() -> list[object]:
    """A batch of smooth RGB images with a little noise: what the delta filter is for
    (zstd alone keeps most of the noisy bytes, after the filter about half)."""
    rng = np.random.default_rng(2)
    ramp = np.indices((8, 64, 96, 3)).sum(axis=0) * 3
    images = (ramp + rng.integers(0, 8, ramp.shape)).astype(np.uint8)
    return encode(Data(np.array([[1, 0]]), [{"images": images}]))


def test_auto_measures_the_delta_filter_on_images_and_picks_it_when_the_link_is_the_limit() -> None:
    clock = Clock()
    compression = LinkCompression("auto", lambda target: False, clock, fast_cpu())
    run(compression, clock, photographs(), 3 * WINDOW, rate_off=20e6, rate_on=60e6)
    ratios = compression.stream.ratio
    assert ratios["zstd:1+delta"] < 0.8 * ratios["zstd:1"], ratios
    key = f"trainer.{T.decode()}"
    stats = compression.stats()
    assert stats[f"{key}.compress"] == "zstd:1+delta", stats
    assert str(stats[f"{key}.compress_reason"]).startswith("link is the limit"), stats
    assert "with zstd:1+delta" in str(stats[f"{key}.compress_reason"])
    wire = compression.wire(T, photographs())
    header = packed_header(wire)
    assert header is not None and header["f"][2] == [3, 288]
    assert compression.worker_codec() == Codec("zstd", 1, delta=True)


def test_auto_measures_the_filter_only_while_the_stream_has_images() -> None:
    clock = Clock()
    compression = LinkCompression("auto", lambda target: False, clock, fast_cpu())
    run(compression, clock, photographs(), 2 * WINDOW, rate_off=20e6, rate_on=60e6)
    assert set(compression.stream.ratio) == {"lz4", "zstd:1", "zstd:1+delta"}
    # The stream turns to one-dimensional arrays (no frame the filter suits): its
    # measurement is forgotten, the next decision is between lz4 and zstd alone.
    run(compression, clock, message(True), HOLD + 3 * WINDOW, rate_off=20e6, rate_on=200e6)
    assert set(compression.stream.ratio) == {"lz4", "zstd:1"}
    assert compression.stats()[f"trainer.{T.decode()}.compress"] in ("lz4", "zstd:1")


def test_a_workers_filtered_message_goes_as_it_is_only_to_a_link_that_wants_the_filter() -> None:
    raw = photographs()
    filtered = compress_frames(raw, Codec("zstd", 1, delta=True), seq=0)
    assert packed_header(filtered)["c"][2] == 3  # type: ignore[index]
    with_filter = LinkCompression(Codec("zstd", 1, delta=True), lambda target: False)
    assert with_filter.wire(T, filtered) is filtered
    # A link under plain zstd gets zstd's own form: older trainers know no filter.
    without = LinkCompression(Codec("zstd", 1), lambda target: False)
    wire = without.wire(T, filtered)
    header = packed_header(wire)
    assert header is not None and 3 not in header["c"] and "f" not in header
    assert without.stats()["inflated_by_server"] == 1
    assert without.stats()["compressed_by_server"] == 1
    for form in (filtered, wire):
        decoded = decode(form)  # type: ignore[arg-type]
        assert isinstance(decoded, Data)
        original = decode(raw).samples[0]["images"]  # type: ignore[union-attr]
        assert np.array_equal(decoded.samples[0]["images"], original)
    # A plain zstd form (no frame filtered) serves a link that wants the filter as it is.
    plain = compress_frames(raw, Codec("zstd", 1), seq=0)
    assert with_filter.wire(T, plain) is plain


def test_the_workers_are_told_the_filter_through_the_shared_codec() -> None:
    shared = SharedCodec(multiprocessing.get_context("fork").RawValue)
    for codec in (Codec("lz4"), Codec("zstd", -7), Codec("zstd", 22),
                  Codec("zstd", -7, delta=True), Codec("zstd", 1, delta=True),
                  Codec("zstd", 22, delta=True), None):
        shared.publish(codec)
        assert shared.read() == codec


def test_a_preempted_speed_measurement_does_not_count_against_a_codec() -> None:
    # Each candidate's compression is timed; the scripted clock makes zstd:1+delta take
    # 1 ms in the first sample and 1 s in the next ones (the thread preempted).
    frames = photographs()
    durations = iter([0.001, 0.001, 0.001] + [0.001, 0.001, 1.0] * (SPEEDS_KEPT - 1)
                     + [0.001, 0.001, 1.0])
    ticks: list[float] = []

    def perf_counter() -> float:
        if len(ticks) % 2:  # the end of a timing: its start plus the scripted duration
            ticks.append(ticks[-1] + next(durations))
        else:
            ticks.append(float(len(ticks)))
        return ticks[-1]

    compression = LinkCompression("auto", lambda target: False, Clock(), perf_counter)
    raw = sum(memoryview(frame).nbytes for frame in frames)  # type: ignore[arg-type]
    for sample in range(SPEEDS_KEPT):
        compression._sample(frames, float(sample))
    assert compression.stream.speed["zstd:1+delta"] == pytest.approx(raw / 0.001)
    compression._sample(frames, float(SPEEDS_KEPT))  # the fast one is forgotten now
    assert compression.stream.speed["zstd:1+delta"] == pytest.approx(raw / 1.0)


def test_a_trainer_gets_only_the_codecs_it_says_it_inflates() -> None:
    # A trainer tells its codecs in its hello: one that cannot undo the filter gets zstd
    # alone of a fixed zstd:1+delta, one older than compression (it names none) gets raw.
    raw = photographs()
    for inflates, expected in ((frozenset({1, 2, 3}), "filtered"), (frozenset({1, 2}), "zstd"),
                               (frozenset(), None)):
        compression = LinkCompression(Codec("zstd", 1, delta=True), lambda target: False,
                                      inflates=lambda target, inflates=inflates: inflates)
        wire = compression.wire(T, raw)
        header = packed_header(wire)
        form = None if header is None else "filtered" if 3 in header["c"] else "zstd"
        assert form == expected, (inflates, header)
        decoded = decode(wire)  # type: ignore[arg-type]
        assert isinstance(decoded, Data)
        original = decode(raw).samples[0]["images"]  # type: ignore[union-attr]
        assert np.array_equal(decoded.samples[0]["images"], original)
        stats = compression.stats()
        if expected == "filtered":
            assert stats[f"trainer.{T.decode()}.compress"] == "zstd:1+delta", stats
            assert stats[f"trainer.{T.decode()}.compress_reason"] == "set by --compress"
        else:
            assert stats[f"trainer.{T.decode()}.compress"] == ("zstd:1" if expected else "off")
            assert stats[f"trainer.{T.decode()}.compress_reason"] == (
                f"the trainer inflates codecs {sorted(inflates)}, not zstd:1+delta")


def test_auto_picks_among_the_codecs_the_trainer_inflates() -> None:
    for inflates in (frozenset({1, 2}), frozenset()):
        clock = Clock()
        compression = LinkCompression("auto", lambda target: False, clock, fast_cpu(),
                                      inflates=lambda target, inflates=inflates: inflates)
        run(compression, clock, photographs(), 3 * WINDOW, rate_off=20e6, rate_on=60e6)
        stats = compression.stats()
        chosen = stats[f"trainer.{T.decode()}.compress"]
        reason = str(stats[f"trainer.{T.decode()}.compress_reason"])
        assert chosen == "off", stats
        assert packed_header(compression.wire(T, photographs())) is None
        if inflates:  # the filter would halve them (the test above); without it they stay
            assert reason == "incompressible (ratio 1.00)", stats
            assert stats[f"trainer.{T.decode()}.compress_ratio"] == 1.0, stats
        else:
            assert "inflates none of auto's codecs" in reason, stats
