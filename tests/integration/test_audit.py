"""feedmux audit on real trainers: a ranked job killed after a checkpoint and resumed from it.

Three ranks (``python -m benchmarks.chaos rank``: each writes an audit log with
the sample ids, rank 0 checkpoints every 10 steps once every rank got there)
run against a seeded server; the test freezes them at a moment when some rank
handed out samples after the last checkpoint, SIGKILLs them all (a crash and
torchrun tearing the job down), and starts the job again from the checkpoint,
up to a fixed step. A reference run of the same seeded job, never interrupted,
gives what each rank must have trained on: ``feedmux audit`` passes with it,
and counts the hand-outs after the checkpoint as not consumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from feedmux.apps import cli
from feedmux.apps.audit import audit, load_sessions
from tests.integration.conftest import ROOT, wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

SOURCE = "benchmarks.chaos:source"
RANKS = 3
LAST_STEP = 300


def _ranks(server: Any, folder: Path, generation: int,
           *flags: str) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [subprocess.Popen(
        [sys.executable, "-m", "benchmarks.chaos", "rank", server.data, server.control,
         "--rank", str(rank), "--generation", str(generation), "--dir", str(folder), *flags],
        env=env, cwd=ROOT) for rank in range(RANKS)]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _frozen_past_checkpoint(ranks: list[subprocess.Popen[bytes]], folder: Path) -> bool:
    """Freeze every rank; True if some rank published a step after the last checkpoint
    (else let them go on)."""
    for process in ranks:
        process.send_signal(signal.SIGSTOP)
    checkpoint = _json(folder / "checkpoint.json")
    steps = [_json(folder / f"rank{rank}.step") for rank in range(RANKS)]
    if checkpoint is not None and checkpoint["step"] >= 30 and any(
            step is not None and step["step"] > checkpoint["step"] for step in steps):
        return True
    for process in ranks:
        process.send_signal(signal.SIGCONT)
    return False


def test_a_job_killed_after_a_checkpoint_and_resumed_from_it_passes_the_audit(
        serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = serve(SOURCE, "--seed", "7", "--hwm", "4")
    job, reference = tmp_path / "job", tmp_path / "reference"
    job.mkdir()
    reference.mkdir()
    started = first = _ranks(server, job, 1, "--step-ms", "1")
    try:
        wait_until(lambda: _frozen_past_checkpoint(first, job), 90,
                   "a rank past the job's checkpoint")
        for process in first:
            process.kill()
            assert process.wait(timeout=30) == -signal.SIGKILL
        second = _ranks(server, job, 2, "--stop-at", str(LAST_STEP))
        started = [*started, *second]
        assert [process.wait(timeout=120) for process in second] == [0] * RANKS
        clean = serve(SOURCE, "--seed", "7", "--hwm", "4")
        uninterrupted = _ranks(clean, reference, 1, "--reference", "--stop-at", str(LAST_STEP))
        started = [*started, *uninterrupted]
        assert [process.wait(timeout=120) for process in uninterrupted] == [0] * RANKS
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    logs = [str(job / f"rank{rank}.log") for rank in range(RANKS)]
    references = [str(reference / f"rank{rank}.log") for rank in range(RANKS)]
    assert cli.main(["audit", *logs, "--reference", *references]) == 0, capsys.readouterr().out
    report = audit(load_sessions(logs), load_sessions(references))
    assert {len(sequence) for sequence in report.sequences.values()} == {LAST_STEP}
    assert sum(not epoch.open for epoch in report.epochs) >= 2
    assert any("after a checkpoint the next session resumed from" in note
               for note in report.notes), report.text()
    # Without the cut at the checkpoint, what was handed out after it would be repeats:
    # the same logs as if every session had started afresh are not clean.
    afresh = load_sessions(logs)
    for session in afresh:
        session.resumed = None
    assert not audit(afresh).ok


#: A rank (world size 1) that hands out ``HANDED`` samples, writes their ids (one write each,
#: the test's oracle) and SIGKILLs itself at once: between two writes of its audit log.
_KILLED_RANK = """
import os, signal, sys
import feedmux
loader = feedmux.RemoteLoader(sys.argv[1], control=sys.argv[2], rank=0, world_size=1, hwm=4,
                              timeout=60, audit_log=sys.argv[3], audit_key="id")
handed = os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
for step, sample in zip(range(int(sys.argv[5])), loader):
    os.write(handed, b"%d\\n" % int(sample["id"]))
os.kill(os.getpid(), signal.SIGKILL)
"""
HANDED = 25


@pytest.mark.timeout(120)
def test_a_rank_killed_right_after_a_hand_out_has_its_sample_in_its_log(
        serve: Any, tmp_path: Path) -> None:
    """A rank writes how far it got in a message lazily: killed right after handing out,
    its log may lack that H record, never the D record of the message that held it."""
    from feedmux._auditlog import read_log

    server = serve(SOURCE, "--seed", "7", "--hwm", "4")
    log, handed = tmp_path / "rank0.log", tmp_path / "handed.txt"
    rank = subprocess.Popen([sys.executable, "-c", _KILLED_RANK, server.data, server.control,
                             str(log), str(handed), str(HANDED)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert rank.wait(timeout=90) == -signal.SIGKILL
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait(timeout=30)
    ids = [int(line) for line in handed.read_text().split()]
    assert len(ids) == HANDED
    session, = read_log(log)
    written = [key for record in session.handouts for key in record.keys or []]
    held = [key for record in session.dealt for key in record.keys or []]
    assert written == ids[:len(written)]  # what it wrote it handed out, in order
    assert set(ids) <= set(held), (ids, held)  # and it held every sample it handed out
