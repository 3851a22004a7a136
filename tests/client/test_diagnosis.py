"""The input-bound diagnosis, driven with a made-up clock and made-up server answers."""

from __future__ import annotations

import logging

import pytest

from feedmux.client._diagnosis import InputDiagnosis, ServerLoad, explain


def answer(uptime: float, busy: float, blocked: float, workers: int = 1) -> dict[str, float]:
    return {"uptime_s": uptime, "sampler_busy_seconds": busy, "send_blocked_seconds": blocked,
            "workers": workers}


def run_window(diagnosis: InputDiagnosis, waited_fraction: float, window: float = 10.0,
               start: float = 0.0, messages: int = 10) -> bool:
    """Messages spread over one window, each after waiting its share; the last one's answer."""
    asked = False
    for step in range(1, messages + 1):
        now = start + step * window / messages
        asked = diagnosis.message(now=now, waited_from=now - waited_fraction * window / messages,
                                  samples=4)
    return asked


def test_a_trainer_waiting_on_a_busy_server_is_told_to_add_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0, threshold=0.25)
    assert diagnosis.message(now=0.0, waited_from=-5.0, samples=4)  # the first message: ask
    assert diagnosis.server_stats(0, answer(100.0, 50.0, 0.0), now=0.0) is None
    assert run_window(diagnosis, waited_fraction=0.4)
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        verdict = diagnosis.server_stats(0, answer(110.0, 59.8, 0.0), now=10.0)
    assert verdict is not None and verdict.startswith("waited for data 40% of the last 10 s")
    assert "sampling 98% of the time: add --workers" in verdict
    assert caplog.messages == [verdict]
    stats = diagnosis.stats()
    assert stats["wait_fraction"] == pytest.approx(0.4)
    assert stats["samples_per_second"] == pytest.approx((4 + 40) / 10)  # the first one too
    assert stats["server_busy_fraction"] == pytest.approx(0.98)
    assert stats["server_blocked_fraction"] == 0.0


def test_busy_is_per_sampling_process() -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0)
    diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    diagnosis.server_stats(0, answer(0.0, 0.0, 0.0, workers=4), now=0.0)
    diagnosis.server_stats(0, answer(10.0, 20.0, 0.0, workers=4), now=10.0)
    assert diagnosis.stats()["server_busy_fraction"] == pytest.approx(0.5)


def test_a_server_blocked_on_sending_points_at_the_transport() -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0)
    diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    diagnosis.server_stats(0, answer(0.0, 0.0, 0.0), now=0.0)
    run_window(diagnosis, waited_fraction=0.7)
    verdict = diagnosis.server_stats(0, answer(10.0, 1.0, 7.0), now=10.0)
    assert verdict is not None and "blocked on sending 70%" in verdict
    assert "the network or the transport is the limit" in verdict


def test_a_trainer_that_rarely_waits_gets_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0, threshold=0.25)
    diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    diagnosis.server_stats(0, answer(0.0, 0.0, 0.0), now=0.0)
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        for window in range(3):
            assert run_window(diagnosis, waited_fraction=0.1, start=10.0 * window)
            assert diagnosis.server_stats(0, answer(10.0 * (window + 1), 1.0, 9.0),
                                          now=10.0 * (window + 1)) is None
    assert caplog.messages == []
    assert diagnosis.stats()["wait_fraction"] == pytest.approx(0.1)


def test_the_first_wait_is_not_the_training_loops() -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0)
    diagnosis.message(now=30.0, waited_from=0.0, samples=1)  # connecting took 30 s
    run_window(diagnosis, waited_fraction=0.0, start=30.0)
    assert diagnosis.stats()["wait_fraction"] == 0.0


def test_without_an_answer_the_verdict_comes_at_the_next_window_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0)
    diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    run_window(diagnosis, waited_fraction=0.9)
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        run_window(diagnosis, waited_fraction=0.0, start=10.0)
    assert len(caplog.messages) == 1
    assert "no statistics from the server" in caplog.messages[0]


def test_every_server_is_heard_before_the_verdict() -> None:
    diagnosis = InputDiagnosis(links=2, window=10.0)
    diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    for link in (0, 1):
        diagnosis.server_stats(link, answer(0.0, 0.0, 0.0), now=0.0)
    run_window(diagnosis, waited_fraction=0.5)
    assert diagnosis.server_stats(0, answer(10.0, 1.0, 0.0), now=10.0) is None
    verdict = diagnosis.server_stats(1, answer(10.0, 9.5, 0.0), now=10.0)
    assert verdict is not None and "sampling 95%" in verdict


def test_an_old_server_without_the_figures_is_ignored() -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0)
    diagnosis.server_stats(0, {"uptime_s": 1.0}, now=0.0)
    diagnosis.server_stats(0, {"uptime_s": 2.0}, now=1.0)
    assert diagnosis.stats()["server_busy_fraction"] is None


def test_explain_names_a_cause_for_a_server_neither_busy_nor_blocked() -> None:
    text = explain(0.3, 60, [ServerLoad(busy=0.1, blocked=0.1)])
    assert "neither sampling (10%) nor blocked (10%)" in text


def test_only_statistics_answers_are_taken_from_the_control_messages() -> None:
    from feedmux.protocol import Stats, Welcome

    diagnosis = InputDiagnosis(links=1, window=10.0)
    assert not diagnosis.answer(0, Welcome("s"), now=0.0)
    assert diagnosis.answer(0, Stats(answer(0.0, 0.0, 0.0)), now=0.0)
    assert diagnosis.answer(0, Stats(answer(10.0, 3.0, 0.0)), now=10.0)
    assert diagnosis.stats()["server_busy_fraction"] == pytest.approx(0.3)


def test_turned_off_it_asks_nothing_and_reports_none() -> None:
    diagnosis = InputDiagnosis(links=1, window=None)
    assert not diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    assert not diagnosis.message(now=100.0, waited_from=0.0, samples=1)
    assert set(diagnosis.stats().values()) == {None}


def test_figures_come_from_the_first_second_not_after_a_window() -> None:
    diagnosis = InputDiagnosis(links=1, window=60.0)
    assert diagnosis.message(now=0.0, waited_from=0.0, samples=10)
    assert diagnosis.stats(now=0.5)["samples_per_second"] is None  # too early to say
    assert not diagnosis.message(now=0.5, waited_from=0.4, samples=10)
    # A second in: the servers are asked again (their load needs two answers) ...
    assert diagnosis.message(now=1.0, waited_from=0.9, samples=10)
    assert not diagnosis.message(now=1.5, waited_from=1.4, samples=10)
    # ... and the figures so far are there (before: None until 60 s had passed).
    figures = diagnosis.stats(now=2.0)
    assert figures["samples_per_second"] == 20.0
    assert figures["wait_fraction"] == pytest.approx(0.15)
    assert figures["window_s"] == 2.0


def test_two_answers_close_together_say_nothing_of_the_servers_load() -> None:
    # A one-process server answers between two draws: the trainer's first ask and its
    # early one met in one batch, 2 ms apart, and the verdict called a server that
    # sampled all the time "neither sampling (0%) nor blocked" (seen in a CI run).
    diagnosis = InputDiagnosis(links=1, window=1.0, threshold=0.2)
    assert diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    diagnosis.server_stats(0, {"uptime_s": 5.000, "sampler_busy_seconds": 4.9,
                               "send_blocked_seconds": 0.0}, now=0.1)
    assert diagnosis.message(now=1.5, waited_from=0.0, samples=1)  # waited all the window
    assert diagnosis.server_stats(0, {"uptime_s": 5.002, "sampler_busy_seconds": 4.9,
                                      "send_blocked_seconds": 0.0}, now=1.5) is None
    verdict = diagnosis.server_stats(0, {"uptime_s": 6.5, "sampler_busy_seconds": 6.38,
                                         "send_blocked_seconds": 0.0}, now=1.6)
    assert verdict is not None and "the server is sampling 99%" in verdict


def test_a_window_that_ends_before_an_answer_far_enough_apart_waits_for_one(
        caplog: pytest.LogCaptureFixture) -> None:
    # Seen in a CI run: the answers to the trainer's first two asks came too close together
    # to give a load, the next window ended, and the trainer said "no statistics from the
    # server yet" of a server that had answered twice and sampled all the time.
    diagnosis = InputDiagnosis(links=1, window=1.0, threshold=0.2)
    assert diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    assert diagnosis.message(now=1.5, waited_from=0.0, samples=1)  # waited all the window
    for uptime in (5.000, 5.002):  # both answers in one batch
        assert diagnosis.server_stats(0, {"uptime_s": uptime, "sampler_busy_seconds": 4.9,
                                          "send_blocked_seconds": 0.0}, now=1.6) is None
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        assert diagnosis.message(now=3.0, waited_from=1.5, samples=1)  # the next window
        verdict = diagnosis.server_stats(0, {"uptime_s": 6.5, "sampler_busy_seconds": 6.38,
                                             "send_blocked_seconds": 0.0}, now=3.1)
    assert verdict is not None and "the server is sampling 99%" in verdict
    assert caplog.messages == [verdict]


def test_a_server_that_never_answers_is_named_at_the_next_window(
        caplog: pytest.LogCaptureFixture) -> None:
    diagnosis = InputDiagnosis(links=1, window=1.0, threshold=0.2)
    assert diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    assert diagnosis.message(now=1.5, waited_from=0.0, samples=1)
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        diagnosis.message(now=3.0, waited_from=1.5, samples=1)
    assert len(caplog.messages) == 1 and "no statistics from the server yet" in caplog.messages[0]


def test_the_heartbeats_share_counts_each_wait_once_and_a_wait_under_way() -> None:
    diagnosis = InputDiagnosis(links=1, window=None)  # the share works with the diagnosis off
    share = diagnosis.share
    assert share.report(now=0.0) is None  # nothing yet: no data
    diagnosis.message(now=5.0, waited_from=0.0, samples=1)  # connecting: not the loop's wait
    assert share.report(now=5.1) is None  # too short a span: it goes on
    for step in range(10):  # 0.1 s apart, each after a wait of 0.03 s
        now = 5.1 + 0.1 * step
        diagnosis.message(now=now, waited_from=now - 0.03, samples=1)
    assert share.report(now=6.0) == pytest.approx(0.3)
    # A wait under way at the report: counted up to it, and the rest after it next time.
    assert share.report(now=7.0, waiting_from=6.5) == pytest.approx(0.5)
    diagnosis.message(now=7.5, waited_from=6.5, samples=1)
    assert share.report(now=8.0) == pytest.approx(0.5)
    # A loop that computes and never waits says 0, one that only waits 1.
    assert share.report(now=9.0) == 0.0
    assert share.report(now=10.0, waiting_from=9.0) == 1.0


def test_the_share_between_two_heartbeats_is_apart_from_the_diagnosis_window() -> None:
    diagnosis = InputDiagnosis(links=1, window=10.0)
    diagnosis.message(now=0.0, waited_from=0.0, samples=1)
    run_window(diagnosis, 0.2, start=0.0)
    assert diagnosis.share.report(now=10.0) == pytest.approx(0.2)
    assert diagnosis.stats()["wait_fraction"] == pytest.approx(0.2)  # its window unchanged


def test_the_first_verdict_comes_after_ten_seconds_then_every_window(
        caplog: pytest.LogCaptureFixture) -> None:
    # Before: a trainer starved from its start heard "add --workers" only after 60 s.
    diagnosis = InputDiagnosis(links=1, window=60.0, threshold=0.25)
    assert diagnosis.message(now=0.0, waited_from=0.0, samples=4)
    diagnosis.server_stats(0, answer(100.0, 50.0, 0.0), now=0.0)
    assert run_window(diagnosis, waited_fraction=0.9, window=10.0)
    with caplog.at_level(logging.WARNING, logger="feedmux.client"):
        verdict = diagnosis.server_stats(0, answer(110.0, 59.9, 0.0), now=10.0)
    assert verdict is not None and verdict.startswith("waited for data 90% of the last 10 s")
    assert "add --workers" in verdict
    # The next windows last diagnose_window: nothing is asked again before 60 s more.
    assert not diagnosis.message(now=40.0, waited_from=39.0, samples=4)
    assert diagnosis.message(now=70.0, waited_from=69.0, samples=4)
    assert diagnosis.stats()["window_s"] == 60.0
