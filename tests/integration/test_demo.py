"""The README's demo, run for real, and its exactly-once checker."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from feedmux.apps.demo import check_exactly_once, check_results

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_demo_sees_every_example_once_per_epoch(spawn: Any, workers: str) -> None:
    demo = spawn("demo", "--examples", "200", "--epochs", "2", "--workers", workers)
    assert demo.wait(timeout=100) == 0, demo.stdout + demo.stderr
    assert "OK: every one of the 600 examples was seen exactly once in each of the 2 epochs" in (
        demo.stdout
    )


def test_check_exactly_once_names_what_is_wrong() -> None:
    seen = [{1: [0, 1, 1]}, {1: [3, 9]}]
    problems = check_exactly_once(seen, {0, 1, 2, 3}, epochs=1)
    assert problems == [
        "epoch 1: 1 ids seen twice, e.g. [1]",
        "epoch 1: 1 ids missing, e.g. [2]",
        "epoch 1: 1 ids unknown, e.g. [9]",
    ]
    assert check_exactly_once([{1: [0, 1]}, {1: [2, 3]}], {0, 1, 2, 3}, epochs=1) == []


def write_record(directory: Path, name: str, server: str, seen: dict[str, list[int]]) -> None:
    record = {"server_ids": [server], "host": name, "iterations": 0, "seen": seen,
              "seconds": {}}
    (directory / f"{server}.{name}.json").write_text(json.dumps(record))


def test_check_results_reads_the_latest_run(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    write_record(tmp_path, "old", "s0", {"1": [0]})
    os.utime(tmp_path / "s0.old.json", (1_000_000, 1_000_000))  # clearly the older run
    write_record(tmp_path, "a", "s1", {"1": [0, 2]})
    write_record(tmp_path, "b", "s1", {"1": [1, 3]})
    assert check_results(tmp_path, files=2, examples=2, epochs=1, trainers=2, wait=0) == 0
    assert "OK:" in capsys.readouterr().out
    write_record(tmp_path, "b", "s1", {"1": [1]})
    assert check_results(tmp_path, files=2, examples=2, epochs=1, trainers=2, wait=0) == 1
    assert "missing" in capsys.readouterr().out
