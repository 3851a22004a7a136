"""feedmux audit: the record format, the writer, and the checks, on hand-made logs."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedmux._auditlog import (
    AuditLog,
    AuditLogError,
    open_audit,
    read_log,
    record_line,
    stride_runs,
)
from feedmux.apps import cli
from feedmux.apps.audit import audit, load_sessions
from feedmux.errors import FeedmuxError

ADDRESS = "tcp://127.0.0.1:5555"


class Log:
    """A hand-made audit log: sessions and their records, as a loader would write them."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.messages = 0
        self._started = time.time()

    def session(self, *, rank: int | None = None, world_size: int = 1, reliable: bool = False,
                hwm: int = 1, size: int | None = 10, uneven: str = "pad",
                server: str = "s1", start: float | None = None) -> Log:
        self._started += 1
        header = {"client_id": f"c{self._started}", "rank": rank, "world_size": world_size,
                  "group": None, "reliable": reliable, "hwm": hwm, "addresses": [ADDRESS],
                  "key": "id", "pid": 1, "time": self._started if start is None else start}
        self._write(f"feedmux-audit 1 {json.dumps(header)}")
        ranked = rank is not None
        self._write(f"S 0 {server} {'-' if size is None else size} "
                    f"{world_size if ranked else 0} {uneven if ranked else '-'}")
        return self

    def hand(self, epoch: int, positions: list[int], keys: list[Any] | None = None) -> Log:
        self.messages += 1
        runs = ",".join(f"{p}:1:1" for p in positions)
        keys = [epoch * 1000 + p for p in positions] if keys is None else keys
        self._write(f"H {self.messages} 0 {epoch} {runs} {json.dumps(keys)}")
        return self

    def deal(self, epoch: int, positions: list[int]) -> Log:
        """A rank's next message becomes current (its D record); :meth:`hand` it out after."""
        runs = ",".join(f"{p}:1:1" for p in positions)
        keys = [epoch * 1000 + p for p in positions]
        self._write(f"D {self.messages + 1} 0 {epoch} {runs} {json.dumps(keys)}")
        return self

    def checkpoint(self, epoch: int, position: int, world_size: int) -> Log:
        saved = {"resume": [[epoch, position, world_size]], "last": [epoch, position - 1, "s1"]}
        self._write(f"C {self.messages} {json.dumps(saved)}")
        return self

    def resume(self, epoch: int, position: int, world_size: int) -> Log:
        saved = {"resume": [[epoch, position, world_size]], "last": [epoch, position - 1, "s1"]}
        self._write(f"R {json.dumps(saved)}")
        return self

    def predecessor(self, epoch: int, position: int, server: str = "s1") -> Log:
        """The P record of a rank restarted alone: its predecessor's mark file said this."""
        self._write(f"P 0 {server} {epoch} {position}")
        return self

    def close(self, ended: bool = False) -> Log:
        self._write(f"Q {int(ended)}")
        return self

    def raw(self, data: bytes) -> Log:
        with open(self.path, "ab") as file:
            file.write(data)
        return self

    def _write(self, text: str) -> None:
        self.raw(record_line(text))


def _report(*paths: Path, reference: tuple[Path, ...] = ()) -> Any:
    return audit(load_sessions(map(str, paths)),
                 load_sessions(map(str, reference)) if reference else ())


# -- free trainers ---------------------------------------------------------------------------------
def test_two_free_trainers_that_split_every_epoch_are_clean(tmp_path: Path) -> None:
    first, second = Log(tmp_path / "a.log"), Log(tmp_path / "b.log")
    first.session()
    second.session()
    for epoch in (1, 2, 3):
        first.hand(epoch, [0, 1, 2, 3, 4])
        second.hand(epoch, [5, 6, 7, 8, 9])
    first.close()
    second.close()
    report = _report(first.path, second.path)
    assert report.ok, report.text()
    # Epoch 1 is complete (two later epochs came); 2 and 3 may still have samples in flight.
    assert [(e.epoch, e.open) for e in report.epochs] == [(1, False), (2, True), (3, True)]
    assert report.checked == 10
    assert cli.main(["audit", str(first.path), str(second.path)]) == 0


def test_a_missing_and_a_repeated_sample_are_problems(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    log = Log(tmp_path / "a.log").session()
    log.hand(1, [0, 1, 2, 3, 5, 6, 7, 8, 9]).hand(1, [2])  # 4 missing, 2 twice
    log.hand(2, list(range(10))).hand(3, [0]).close()
    report = _report(log.path)
    first = report.epochs[0]
    assert first.missing == [4] and first.repeated == {2: 2} and not first.ok
    assert not report.ok
    assert cli.main(["audit", str(log.path)]) == 1
    out = capsys.readouterr().out
    assert "1 missing [4]" in out and "1 repeated [2 x2]" in out and "PROBLEMS" in out


def test_what_the_last_trainers_may_have_held_when_they_closed_is_not_checked(
        tmp_path: Path) -> None:
    log = Log(tmp_path / "a.log").session(hwm=2)  # up to 2 messages of 5 not handed out
    for epoch in (1, 2, 3, 4):
        log.hand(epoch, [0, 1, 2, 3, 4]).hand(epoch, [5, 6, 7, 8, 9])
    log.hand(5, [0, 1, 2]).close()  # 42 handed out: the last 10 before it may be in flight
    assert [(e.epoch, e.open) for e in _report(log.path).epochs] == [
        (1, False), (2, False), (3, False), (4, True), (5, True)]


def test_a_finished_stream_checks_its_last_epochs_too(tmp_path: Path) -> None:
    log = Log(tmp_path / "a.log").session()
    log.hand(1, list(range(10))).hand(2, list(range(9))).close(ended=True)
    report = _report(log.path)
    assert [(e.epoch, e.open, e.missing) for e in report.epochs] == [(1, False, []),
                                                                     (2, False, [9])]
    assert not report.ok


def test_repeats_in_the_unacknowledged_tail_of_a_dead_reliable_trainer_are_re_dealt(
        tmp_path: Path) -> None:
    dead, survivor = Log(tmp_path / "dead.log"), Log(tmp_path / "survivor.log")
    dead.session(reliable=True, hwm=2)
    dead.hand(1, [0, 1]).hand(1, [2, 3]).hand(1, [4, 5])  # killed: no close record
    survivor.session(reliable=True, hwm=2)
    # The server had not heard of the dead trainer's last two messages: it deals them again.
    survivor.hand(1, [2, 3, 4, 5, 6, 7, 8, 9]).hand(2, list(range(10))).hand(3, [0]).close()
    report = _report(dead.path, survivor.path)
    assert report.ok, report.text()
    assert report.epochs[0].redealt == 4 and not report.epochs[0].repeated
    # Older than the credit the server could hold for it: a real repeat.
    survivor.session(reliable=True, hwm=2).hand(1, [0]).close()
    assert _report(dead.path, survivor.path).epochs[0].repeated == {0: 2}


# -- ranks and checkpoints -------------------------------------------------------------------------
def _ranked_job(tmp_path: Path, *, resumed: bool) -> list[Path]:
    """Two ranks, epochs of 10; the job dies after rank 0 checkpointed at position 4 and
    both ranks handed out two more rounds; it restarts (from the checkpoint if ``resumed``)."""
    paths = []
    for rank in (0, 1):
        log = Log(tmp_path / f"rank{rank}.log")
        log.session(rank=rank, world_size=2)
        log.hand(1, [rank]).hand(1, [2 + rank])
        if rank == 0:
            log.checkpoint(1, 4, 2)
        log.hand(1, [4 + rank]).hand(1, [6 + rank])  # after the checkpoint, then killed
        log.session(rank=rank, world_size=2)
        if resumed:
            log.resume(1, 4, 2)
        log.hand(1, [4 + rank, 6 + rank, 8 + rank]).hand(2, [rank, 2 + rank]).close()
        paths.append(log.path)
    return paths


def test_a_job_resumed_from_its_checkpoint_repeats_nothing(tmp_path: Path) -> None:
    paths = _ranked_job(tmp_path, resumed=True)
    report = _report(*paths)
    assert report.ok, report.text()
    epoch = report.epochs[0]
    assert epoch.hand_outs == 10 and not epoch.missing and not epoch.repeated and not epoch.open
    assert report.sequences[(ADDRESS, 1)][:5] == [(1, 1, 1001), (1, 3, 1003), (1, 5, 1005),
                                                  (1, 7, 1007), (1, 9, 1009)]
    assert any("2 handed out after a checkpoint" in note for note in report.notes)


def test_a_restart_without_the_checkpoint_is_seen_as_repeats(tmp_path: Path) -> None:
    report = _report(*_ranked_job(tmp_path, resumed=False))
    assert report.epochs[0].repeated == {4: 2, 5: 2, 6: 2, 7: 2}
    assert cli.main(["audit", *map(str, _ranked_job(tmp_path / "again", resumed=False))]) == 1


def test_a_rank_behind_the_checkpoint_it_resumed_from_lost_its_share(tmp_path: Path) -> None:
    log = Log(tmp_path / "rank1.log").session(rank=1, world_size=2)
    log.hand(1, [1])  # rank 1 got only its first sample before the job died
    log.session(rank=1, world_size=2).resume(1, 4, 2).hand(1, [5, 7, 9]).hand(2, [1]).close()
    zero = Log(tmp_path / "rank0.log").session(rank=0, world_size=2)
    zero.hand(1, [0, 2]).checkpoint(1, 4, 2)
    zero.session(rank=0, world_size=2).resume(1, 4, 2).hand(1, [4, 6, 8]).hand(2, [0]).close()
    assert _report(log.path, zero.path).epochs[0].missing == [3]


def test_only_a_killed_rank_s_last_message_below_the_checkpoint_counts_unwritten(
        tmp_path: Path) -> None:
    """A rank's log may lack its last hand-outs (written lazily) but says which samples its
    last message held: those below the checkpoint the next session resumed from count."""
    zero = Log(tmp_path / "rank0.log").session(rank=0, world_size=2)
    zero.deal(1, [0, 2]).hand(1, [0, 2]).checkpoint(1, 4, 2)
    zero.session(rank=0, world_size=2).resume(1, 4, 2).hand(1, [4, 6, 8]).hand(2, [0]).close()
    one = Log(tmp_path / "rank1.log").session(rank=1, world_size=2)
    one.deal(1, [1, 3]).hand(1, [1])  # killed after handing out 3, before writing it
    one.session(rank=1, world_size=2).resume(1, 4, 2).hand(1, [5, 7, 9]).hand(2, [1]).close()
    report = _report(zero.path, one.path)
    assert report.ok, report.text()
    assert [step[1] for step in report.sequences[(ADDRESS, 1)]] == [1, 3, 5, 7, 9, 1]
    assert any("wrote that it handed out 1 sample(s) of its last message" in note
               for note in report.notes)
    # An earlier message's rows never count unwritten: that rank lost position 3.
    early = Log(tmp_path / "early" / "rank1.log").session(rank=1, world_size=2)
    early.deal(1, [1, 3]).hand(1, [1]).deal(1, [5]).hand(1, [5])
    early.session(rank=1, world_size=2).resume(1, 4, 2).hand(1, [5, 7, 9]).hand(2, [1]).close()
    assert _report(zero.path, early.path).epochs[0].missing == [3]
    # Nor do they in a session that closed (its close wrote how far it got) ...
    closed = Log(tmp_path / "closed" / "rank1.log").session(rank=1, world_size=2)
    closed.deal(1, [1, 3]).hand(1, [1]).close()
    closed.session(rank=1, world_size=2).resume(1, 4, 2).hand(1, [5, 7, 9]).hand(2, [1]).close()
    assert _report(zero.path, closed.path).epochs[0].missing == [3]
    # ... nor past the checkpoint (the resumed job hands them out again).
    past = Log(tmp_path / "past" / "rank1.log").session(rank=1, world_size=2)
    past.deal(1, [1, 3]).hand(1, [1, 3]).deal(1, [5, 7])
    past.session(rank=1, world_size=2).resume(1, 4, 2).hand(1, [5, 7, 9]).hand(2, [1]).close()
    report = _report(zero.path, past.path)
    assert report.ok and report.epochs[0].hand_outs == 10, report.text()


def test_a_rank_restarted_alone_counts_what_its_predecessor_s_mark_file_said(
        tmp_path: Path) -> None:
    """A rank killed before it wrote its last hand-outs, restarted alone on its host: its
    successor's P record (the predecessor's mark file) says how far it got."""
    zero = Log(tmp_path / "rank0.log").session(rank=0, world_size=2)
    zero.hand(1, [0, 2, 4, 6, 8]).hand(2, [0]).close()
    one = Log(tmp_path / "rank1.log").session(rank=1, world_size=2)
    one.deal(1, [1, 3, 5]).hand(1, [1])  # killed after handing out 3, before writing it
    one.session(rank=1, world_size=2).predecessor(1, 3).hand(1, [5, 7, 9]).hand(2, [1]).close()
    report = _report(zero.path, one.path)
    assert report.ok, report.text()
    assert [step[1] for step in report.sequences[(ADDRESS, 1)]] == [1, 3, 5, 7, 9, 1]
    assert any("which its mark file said" in note for note in report.notes)
    # Without the P record position 3 is missing; a successor past the mark leaves a gap.
    for name, said, first in (("none", None, 5), ("gap", (1, 3), 7)):
        other = Log(tmp_path / name / "rank1.log").session(rank=1, world_size=2)
        other.deal(1, [1, 3, 5]).hand(1, [1])
        other.session(rank=1, world_size=2)
        if said is not None:
            other.predecessor(*said)
        other.hand(1, list(range(first, 10, 2))).hand(2, [1]).close()
        assert not _report(zero.path, other.path).ok, name
    # Another server's mark says nothing of this server's message.
    moved = Log(tmp_path / "moved" / "rank1.log").session(rank=1, world_size=2)
    moved.deal(1, [1, 3, 5]).hand(1, [1])
    moved.session(rank=1, world_size=2).predecessor(1, 3, server="s0")
    moved.hand(1, [5, 7, 9]).hand(2, [1]).close()
    assert _report(zero.path, moved.path).epochs[0].missing == [3]


def test_a_resumed_run_that_gives_other_samples_is_a_problem(tmp_path: Path) -> None:
    log = Log(tmp_path / "rank0.log").session(rank=0, world_size=1, size=4)
    log.hand(1, [0, 1]).checkpoint(1, 2, 1).hand(1, [2])
    log.session(rank=0, world_size=1, size=4).resume(1, 2, 1)
    log.hand(1, [2, 3], keys=[77, 1003]).hand(2, [0]).close()
    report = _report(log.path)
    assert any("different keys" in problem and "1002" in problem and "77" in problem
               for problem in report.problems), report.text()


def test_drop_mode_leaves_out_the_last_partial_round_without_a_problem(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        log = Log(tmp_path / f"rank{rank}.log").session(rank=rank, world_size=3, uneven="drop")
        log.hand(1, [rank, 3 + rank, 6 + rank]).hand(2, [rank]).close()
    report = _report(*(tmp_path / f"rank{rank}.log" for rank in (0, 1, 2)))
    assert report.ok, report.text()
    assert report.epochs[0].dropped == 1


def test_padding_past_the_epoch_end_is_counted_apart(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        log = Log(tmp_path / f"rank{rank}.log").session(rank=rank, world_size=3)
        log.hand(1, [rank, 3 + rank, 6 + rank, 9 + rank]).hand(2, [rank]).close()
    report = _report(*(tmp_path / f"rank{rank}.log" for rank in (0, 1, 2)))
    assert report.ok, report.text()
    assert report.epochs[0].padded == 2


def test_the_reference_run_must_match_each_rank(tmp_path: Path) -> None:
    job = _ranked_job(tmp_path / "job", resumed=True)
    clean = []
    for rank in (0, 1):
        log = Log(tmp_path / f"ref{rank}.log").session(rank=rank, world_size=2)
        log.hand(1, [rank, 2 + rank, 4 + rank, 6 + rank, 8 + rank]).hand(2, [rank, 2 + rank])
        clean.append(log.close().path)
    report = _report(*job, reference=tuple(clean))
    assert report.ok, report.text()
    assert any("equal the reference" in note for note in report.notes)
    other = Log(tmp_path / "other.log").session(rank=1, world_size=2)
    other.hand(1, [1, 3], keys=[1001, 5]).close()
    mismatch = _report(*job, reference=(clean[0], other.path))
    assert any("rank 1: step 1" in problem for problem in mismatch.problems), mismatch.text()


# -- damaged input ---------------------------------------------------------------------------------
def test_a_torn_last_record_is_tolerated_and_counted(tmp_path: Path) -> None:
    log = Log(tmp_path / "a.log").session().hand(1, list(range(10))).hand(2, list(range(10)))
    log.hand(3, [0])
    whole = log.path.read_bytes()
    log.path.write_bytes(whole[:-7])  # SIGKILL in the middle of the last write
    sessions = read_log(log.path)
    assert sessions[0].torn and len(sessions[0].handouts) == 2
    # A restarted trainer appends its own session after the torn record.
    log.raw(b"\n").session().hand(3, list(range(10))).close()
    sessions = read_log(log.path)
    assert [s.torn for s in sessions] == [True, False]
    assert _report(log.path).torn == 1


def test_a_record_cut_to_a_shorter_number_is_caught_by_its_checksum(tmp_path: Path) -> None:
    log = Log(tmp_path / "a.log").session().hand(1, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    line = log.path.read_bytes().splitlines(keepends=True)[-1]
    text, crc = line.rsplit(b" #", 1)
    shortened = text.replace(b"1009]", b"100]") + b" #" + crc  # parses, with its old checksum
    log.path.write_bytes(log.path.read_bytes()[:-len(line)] + shortened)
    assert read_log(log.path)[0].torn


def test_damage_before_the_last_record_is_bad_input(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    log = Log(tmp_path / "a.log").session().hand(1, [0, 1])
    log.raw(b"H 2 0 1 2:1:1 [1002] #00000000\n").hand(1, [3])
    with pytest.raises(AuditLogError, match=r"a.log:4: a damaged record"):
        read_log(log.path)
    assert cli.main(["audit", str(log.path)]) == 2
    assert "only a session's last record can be torn" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"epoch position\n1 2\n"])
def test_a_file_that_is_not_an_audit_log_is_bad_input(tmp_path: Path, content: bytes,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "not.log"
    path.write_bytes(content)
    assert cli.main(["audit", str(path)]) == 2
    assert "expected a feedmux audit log" in capsys.readouterr().err
    assert cli.main(["audit", str(tmp_path / "absent.log")]) == 2


def test_a_malformed_record_with_a_good_checksum_is_bad_input(tmp_path: Path) -> None:
    log = Log(tmp_path / "a.log").session()
    log.raw(record_line("H 1 0 1 0:zero:1")).close()
    with pytest.raises(AuditLogError, match="malformed 'H' record"):
        read_log(log.path)


# -- the writer ------------------------------------------------------------------------------------
@dataclass
class _Link:
    server_id: str = "s1"
    epoch_size: int | None = 6
    world_size: int = 0
    uneven: str = ""


class _Links:
    def __init__(self) -> None:
        self.links = [_Link()]


def _tags(epoch: int, positions: list[int]) -> np.ndarray:
    return np.array([[epoch, p] for p in positions], dtype=np.int64)


def test_the_writer_records_each_row_once_whoever_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    log = AuditLog(path, "id", {"rank": None, "addresses": [ADDRESS]}, _Links(),
                   write_through=True)
    samples = [{"id": np.int64(10 + i)} for i in range(4)]
    tags = _tags(1, [0, 1, 2, 3])
    log.begin(0, "s1", tags, samples)
    assert not path.exists()  # nothing handed out: nothing written, not even a header
    guarded = log.guard(lambda: (0, "s1", tags, 0, 2))  # the acknowledging thread: 2 so far
    guarded()
    assert len(read_log(path)[0].handouts) == 1  # written before the server hears of it
    log.upto(4)
    log.upto(4)  # again: nothing new
    log.begin(0, "s1", _tags(1, [4, 5]), [{"id": 14}, {"id": 15}])
    state = {"last_epoch": 1, "last_position": 4, "last_server_id": "s1"}
    assert log.checkpoint(state, 1) is state
    log.close(2, ended=True)
    guarded()  # after the close: ignored
    session, = read_log(path)
    steps = [(h.epoch, p, k) for h in session.handouts
             for p, k in zip(h.positions.tolist(), h.keys or [], strict=True)]
    assert steps == [(1, p, 10 + p) for p in range(6)]
    assert session.checkpoints == [(3, {"resume": None, "last": [1, 4, "s1"]})]
    assert session.closed and session.ended and session.servers == {0: (6, 0, "")}


def test_the_batched_writer_writes_at_the_latest_on_close(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    log = AuditLog(path, None, {}, _Links(), write_through=False)
    log.begin(0, "s1", _tags(2, [0, 1, 2]), [None] * 3)
    log.upto(3)
    assert not path.exists()  # waits for its batch
    log.close(0, ended=False)
    session, = read_log(path)
    assert session.handouts[0].positions.tolist() == [0, 1, 2]
    assert session.handouts[0].keys is None and session.closed and not session.ended


def test_an_epoch_size_learnt_after_the_last_message_is_recorded_at_the_close(
        tmp_path: Path) -> None:
    links = _Links()
    links.links[0].epoch_size = None  # measured by the server after its first epoch
    log = AuditLog(tmp_path / "w.log", None, {}, links, write_through=True)
    log.begin(0, "s1", _tags(1, [0, 1]), [None] * 2)
    links.links[0].epoch_size = 2
    log.close(2, ended=True)
    assert read_log(tmp_path / "w.log")[0].servers == {0: (2, 0, "")}


def test_a_reopened_log_ends_the_torn_record_first(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    path.write_bytes(record_line("feedmux-audit 1 {}") + b"H 1 0 1 0:")
    log = AuditLog(path, None, {}, _Links(), write_through=True)
    log.begin(0, "s1", _tags(1, [0]), [None])
    log.upto(1)
    first, second = read_log(path)
    assert first.torn and second.handouts[0].positions.tolist() == [0]


def test_a_sample_without_the_key_field_is_a_clear_error(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "w.log", "id", {}, _Links(), write_through=True)
    log.begin(0, "s1", _tags(1, [0]), [{"x": 1}])
    with pytest.raises(FeedmuxError, match="expected samples with a field 'id'"):
        log.upto(1)
    log.begin(0, "s1", _tags(1, [1]), [{"id": [1, 2]}])
    with pytest.raises(FeedmuxError, match="expected an int, str or float field, got list"):
        log.upto(1)


def test_a_forked_copy_writes_its_own_session_to_its_own_file(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "w-{pid}.log"), None, {}, _Links(), write_through=False)
    log.begin(0, "s1", _tags(1, [0, 1]), [None] * 2)
    log.upto(2)  # waits for its batch
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit code is the check
        try:
            log.begin(0, "s1", _tags(1, [5]), [None])
            log.close(1, ended=False)
        finally:
            os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    log.close(2, ended=False)
    mine, = read_log(tmp_path / f"w-{os.getpid()}.log")
    theirs, = read_log(tmp_path / f"w-{child}.log")
    assert [h.positions.tolist() for h in mine.handouts] == [[0, 1]]
    assert [h.positions.tolist() for h in theirs.handouts] == [[5]]


def test_stride_runs_cover_their_positions_in_order() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        positions = np.cumsum(rng.integers(0, 4, size=rng.integers(1, 30)))
        runs = stride_runs(positions)
        rebuilt = [start + step * i for start, count, step in runs for i in range(count)]
        assert rebuilt == positions.tolist()


def test_the_loader_option_needs_a_path_for_its_key() -> None:
    from feedmux import RemoteLoader

    with pytest.raises(FeedmuxError, match="audit_key only with audit_log"):
        RemoteLoader("tcp://127.0.0.1:9", audit_key="id")
    assert os.environ.get("FEEDMUX_NEVER_SET") is None


# -- runs, whole epochs, equal steps (the checks the chaos model needs) ---------------------------
def test_a_server_that_begins_its_epochs_again_is_a_new_run_of_its_own(tmp_path: Path) -> None:
    survivor, newcomer = Log(tmp_path / "a.log"), Log(tmp_path / "b.log")
    survivor.session(reliable=True, server="old")
    for epoch in (1, 2, 3):
        survivor.hand(epoch, list(range(10)))
    survivor.hand(4, [0, 1, 2])  # the server restarts here and begins a new run at epoch 1
    survivor._write("S 0 new 10 0 -")
    newcomer.session(reliable=True, server="new", start=survivor._started + 5)
    for epoch in (1, 2, 3, 4):
        survivor.hand(epoch, [0, 1, 2, 3, 4])
        newcomer.hand(epoch, [5, 6, 7, 8, 9])
    survivor.close()
    newcomer.close()
    report = _report(survivor.path, newcomer.path)
    assert report.ok, report.text()
    assert {e.stream for e in report.epochs} == {ADDRESS, f"{ADDRESS} run 2"}
    # the old run's last epoch was cut by the restart: open, not missing
    assert [(e.epoch, e.open) for e in report.epochs if e.stream == ADDRESS][-1] == (4, True)
    # The new run loses a sample in epoch 2: found in the new run, not hidden by the old one.
    newcomer.session(reliable=True, server="new")
    lossy = Log(tmp_path / "lossy.log").session(reliable=True, server="old")
    for epoch in (1, 2, 3):
        lossy.hand(epoch, list(range(10)))
    lossy._write("S 0 new 10 0 -")
    lossy.hand(1, list(range(10))).hand(2, list(range(9))).hand(3, list(range(10)))
    lossy.hand(4, list(range(10))).close()
    report = _report(lossy.path)
    assert [(e.stream, e.epoch, e.missing) for e in report.epochs if e.missing] == [
        (f"{ADDRESS} run 2", 2, [9])], report.text()


def test_a_run_cut_by_a_new_run_is_open_back_to_its_slowest_trainers_last_hand_out(
        tmp_path: Path) -> None:
    # The long chaos mix, seed 13: a free trainer taking batches of 7 a step ran epochs ahead
    # of one taking a sample a step; when a new run cut the old one, the slow one's queue
    # held an epoch far behind the fast one's hand-outs (dropped by design), which the
    # audit took for complete and missing 112 samples.
    fast, slow = Log(tmp_path / "fast.log"), Log(tmp_path / "slow.log")
    fast.session(reliable=True, server="old")
    slow.session(reliable=True, server="old")
    for epoch in (1, 2):
        fast.hand(epoch, [0, 1, 2, 3, 4])
        slow.hand(epoch, [5, 6, 7, 8, 9])
    fast.hand(3, [0, 1, 2, 3, 4])  # 3:5-9 sit in the slow one's queue when the run is cut
    for epoch in (4, 5, 6):
        fast.hand(epoch, list(range(10)))
    for log in (fast, slow):
        log._write("S 0 new 10 0 -")
    for epoch in (1, 2):
        fast.hand(epoch, [0, 1, 2, 3, 4])
        slow.hand(epoch, [5, 6, 7, 8, 9])
    fast.close()
    slow.close()
    report = _report(fast.path, slow.path)
    assert report.ok, report.text()
    old = {e.epoch: e for e in report.epochs if e.stream == ADDRESS}
    assert not old[2].open and old[3].open and old[3].missing == [5, 6, 7, 8, 9]


def test_an_epoch_of_which_nothing_came_is_missing_whole(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    log = Log(tmp_path / "a.log").session(size=4)
    log.hand(1, [0, 1, 2, 3]).hand(3, [0, 1, 2, 3]).hand(4, [0]).close()
    report = _report(log.path)
    assert [(e.epoch, e.hand_outs, e.missing) for e in report.epochs][:2] == [
        (1, 4, []), (2, 0, [0, 1, 2, 3])]
    assert not report.ok
    # The server served 3 epochs and the job is over: the ones never seen are missing too.
    only = Log(tmp_path / "b.log").session(size=4).hand(1, [0, 1, 2, 3])  # no close: killed
    assert _report(only.path).ok
    assert cli.main(["audit", "--epochs", "3", str(only.path)]) == 1
    out = capsys.readouterr().out
    assert "epoch 2 (4 samples): 0 handed out, 4 missing [0, 1, 2, 3]: PROBLEM" in out
    assert "epoch 3 (4 samples): 0 handed out" in out


def test_ranks_that_took_different_steps_in_an_epoch_are_a_problem(tmp_path: Path) -> None:
    zero = Log(tmp_path / "rank0.log").session(rank=0, world_size=2, size=6)
    zero.hand(1, [0, 2, 4]).hand(2, [0, 2, 4]).close(ended=True)
    one = Log(tmp_path / "rank1.log").session(rank=1, world_size=2, size=6)
    one.hand(1, [1, 3, 5]).hand(2, [1, 3])  # killed
    one.session(rank=1, world_size=2, size=6).hand(2, [5]).close(ended=True)  # its successor
    assert _report(zero.path, one.path).ok
    again = Log(tmp_path / "again.log").session(rank=1, world_size=2, size=6)
    again.hand(1, [1, 3, 5]).hand(2, [1])
    again.session(rank=1, world_size=2, size=6).hand(1, [1, 3, 5]).hand(2, [1, 3, 5])
    again.close(ended=True)  # the successor got the whole stream again
    report = _report(zero.path, again.path)
    assert any("epoch 1: the ranks took different numbers of steps (rank 0 3, rank 1 6)"
               in problem for problem in report.problems), report.text()


# -- a rank killed between two writes --------------------------------------------------------------
@dataclass(eq=False)
class _Loader:
    """What ``open_audit`` reads of a ranked ``RemoteLoader``."""

    rank: int
    world_size: int = 2
    client_id: str = "c"
    group: str | None = None
    reliable: bool = False
    hwm: int = 4
    addresses: tuple[str, ...] = (ADDRESS,)


def _ranked_links(size: int) -> _Links:
    links = _Links()
    links.links[0] = _Link(epoch_size=size, world_size=2, uneven="pad")
    return links


def _session(path: Path, rank: int, messages: list[tuple[int, list[int]]], *,
             checkpoint_after: int | None = None, resumed: dict[str, Any] | None = None,
             killed: bool) -> None:
    """One process of rank ``rank`` calling its audit log as ``RemoteLoader`` does: at each
    receive ``upto`` (how far it got in the message before) then ``begin``; the hand-outs
    in between only move the loader's index. Killed: the process is SIGKILLed right after
    handing out every sample of its last message, before anything else reports it."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit (or its SIGKILL) is the check
        try:
            log = open_audit(path, "id", _Loader(rank), _ranked_links(12))
            if resumed is not None:
                log.resumed(resumed)
            used = 0
            for index, (epoch, positions) in enumerate(messages):
                log.upto(used)
                tags = _tags(epoch, positions)
                log.begin(0, "s1", tags, [{"id": np.int64(epoch * 1000 + p)} for p in positions])
                used = len(positions)  # every one handed out: nothing written yet
                if index == 0:
                    log.guard(lambda tags=tags, used=used: (0, "s1", tags, 0, used))()  # a look
                if index == checkpoint_after:
                    last = positions[-1]
                    log.checkpoint({"resume": [[epoch, last - rank + 2, 2]], "last_epoch": epoch,
                                    "last_position": last, "last_server_id": "s1"}, used)
            if killed:
                os.kill(os.getpid(), signal.SIGKILL)
            log.close(used, ended=False)
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL) if killed else (
        os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0), status


@pytest.mark.timeout(60)
def test_a_rank_killed_after_handing_out_its_message_before_writing_it_passes_the_audit(
        tmp_path: Path) -> None:
    """Issue 38: a rank SIGKILLed after handing out the last samples before its job's
    checkpoint, before its log wrote them (its writes are lazy within a message), looked
    behind the checkpoint: "rank 1: step 2 handed out epoch 1 position 9, the reference run
    epoch 1 position 5", though it had trained on 5 and 7. Two ranks, epochs of 12."""
    def rounds(rank: int, starts: list[int]) -> list[int]:
        return [start + rank for start in starts]

    job, reference = tmp_path / "job", tmp_path / "reference"
    for rank in (0, 1):
        # The first process: rank 0 checkpoints after its second message (resume at 8),
        # hands out position 8 and dies; rank 1 dies right after handing out 5 and 7.
        first = [(1, rounds(rank, [0, 2])), (1, rounds(rank, [4, 6]))]
        if rank == 0:
            first.append((1, [8]))
        _session(job / f"rank{rank}.log", rank, first, checkpoint_after=1 if rank == 0 else None,
                 killed=True)
        resume = {"resume": [[1, 8, 2]], "last_epoch": 1, "last_position": 6,
                  "last_server_id": "s1"}
        again = [(1, rounds(rank, [8, 10])), (2, rounds(rank, [0, 2]))]
        _session(job / f"rank{rank}.log", rank, again, resumed=resume, killed=False)
        whole = [(1, rounds(rank, [0, 2])), (1, rounds(rank, [4, 6])), *again]
        _session(reference / f"rank{rank}.log", rank, whole, killed=False)
    logs = [job / f"rank{rank}.log" for rank in (0, 1)]
    one_first, _ = read_log(logs[1])
    assert [h.positions.tolist() for h in one_first.handouts] == [[1, 3]]  # 5, 7 unwritten
    report = _report(*logs, reference=tuple(reference / f"rank{r}.log" for r in (0, 1)))
    assert report.ok, report.text()
    assert [step[1] for step in report.sequences[(ADDRESS, 1)]] == [1, 3, 5, 7, 9, 11, 1, 3]
    assert [step[2] for step in report.sequences[(ADDRESS, 1)][2:4]] == [1005, 1007]
    assert [step[1] for step in report.sequences[(ADDRESS, 0)]] == [0, 2, 4, 6, 8, 10, 0, 2]
