"""Acknowledged delivery (every free trainer's): a trainer that stops reading for a while
(a long step, a validation pass) keeps its connection and its samples while the server
goes on beating and summing up the hand-outs to it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ROOT, kill_remaining, wait_until
from tests.integration.test_reliable import assert_each_once, read_record

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

SAMPLER = "tests.integration.samplers"
#: Seconds the paused trainer reads nothing: long enough for the heartbeats and summaries
#: the server sends meanwhile (about five a second with a trainer consuming) to pass the
#: few messages of room a data queue kept beyond credit, and for a queue that stopped
#: libzmq reading to miss three ZMTP heartbeats.
PAUSE = 20.0
EPOCHS, PER_STREAM = 2, 50
PER_EPOCH = 4 * PER_STREAM  # the sampler's four streams


def test_a_trainer_that_stops_reading_keeps_its_connection_and_samples(
    serve: Any, tmp_path: Path
) -> None:
    server = serve(f"{SAMPLER}:numbered", "--arg", f"per_stream={PER_STREAM}", "--epochs",
                   str(EPOCHS), "--samples-per-message", "10", "--min-trainers", "2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "tests.integration.trainers", server.data, server.control]
    go = tmp_path / "go"
    paused = subprocess.Popen([*common, str(tmp_path / "paused"),
                               "--hold-after", "5", "--go-file", str(go)], env=env, cwd=ROOT)
    # The other one consumes throughout the pause, so the summary changes all along.
    busy = subprocess.Popen([*common, str(tmp_path / "busy"), "--step-ms", "80"],
                            env=env, cwd=ROOT)
    try:
        record = tmp_path / "paused"
        wait_until(lambda: record.exists() and len(record.read_text().splitlines()) >= 5,
                   timeout=60, what="the paused trainer's first samples")
        time.sleep(PAUSE)  # the scenario: a trainer that reads nothing for this long
        assert paused.poll() is None, f"the paused trainer ended ({paused.returncode})"
        assert busy.poll() is None, "the busy trainer ended during the pause: make it slower"
        go.touch()
        assert paused.wait(timeout=60) == 0, "the paused trainer failed (-6: libzmq aborted)"
        assert busy.wait(timeout=60) == 0
        assert server.wait(timeout=30) == 0
    finally:
        kill_remaining([paused, busy])
    assert "went away" not in server.stderr, f"the server lost a trainer:\n{server.stderr}"
    rows = read_record(tmp_path / "paused") + read_record(tmp_path / "busy")
    assert_each_once(rows, EPOCHS, PER_EPOCH)
    assert len(rows) == EPOCHS * PER_EPOCH
