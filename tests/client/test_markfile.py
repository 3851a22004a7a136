"""A ranked loader's mark file: what a successor reads, and the files it must not trust."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from feedmux.client import _markfile
from feedmux.client._markfile import MarkFile, describe, mark_path, read_marks
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.timeout(60)

TAGS = np.array([[2, 1], [2, 3], [2, 5], [2, 7]])


def dead_pid() -> int:
    """The pid of a process that ran and was reaped (so it is gone)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def written_by(path: Path, pid: int) -> None:
    """Make the file at ``path`` look written by process ``pid`` (started at an unknown time)."""
    words = memoryview(bytearray(path.read_bytes())).cast("q")
    words[_markfile._PID], words[_markfile._START] = pid, 0
    path.write_bytes(words.obj)


def test_a_successor_reads_the_last_hand_out_of_a_dead_process(tmp_path: Path) -> None:
    path = tmp_path / "mark"
    marks = MarkFile.create(str(path), rank=1, world_size=2, links=1)
    marks.message(0, "s1", TAGS)
    marks.index[0] = 3  # three hand-outs of the message: (2, 5) was the last
    assert describe(str(path)) == ([("s1", 2, 5)], True)
    written_by(path, dead_pid())
    assert read_marks(str(path), rank=1, world_size=2, links=1) == [("s1", 2, 5)]


def test_a_new_message_keeps_the_last_hand_out_of_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "mark"
    marks = MarkFile.create(str(path), rank=0, world_size=1, links=2)
    marks.message(1, "s2", TAGS)
    marks.index[0] = 4
    marks.message(0, "s1", np.array([[1, 0], [1, 1]]))  # nothing of it handed out yet
    assert describe(str(path))[0] == [None, ("s2", 2, 7)]
    marks.index[0] = 1
    assert describe(str(path))[0] == [("s1", 1, 0), ("s2", 2, 7)]
    # A message of another server process on link 1 (its server restarted): the old
    # process's mark means nothing to the new one.
    marks.message(1, "s3", TAGS)
    assert describe(str(path))[0] == [("s1", 1, 0), None]


def test_a_message_larger_than_the_file_grows_it(tmp_path: Path) -> None:
    path = tmp_path / "mark"
    marks = MarkFile.create(str(path), rank=0, world_size=1, links=1)
    index = marks.index  # the loader's view, taken before the file grew
    rows = _markfile.CAPACITY * 3
    tags = np.stack([np.full(rows, 4), np.arange(rows)], axis=1)
    marks.message(0, "s1", tags)
    index[0] = rows - 1
    assert describe(str(path))[0] == [("s1", 4, rows - 2)]


def test_a_live_process_file_is_never_trusted(tmp_path: Path) -> None:
    path = tmp_path / "mark"
    marks = MarkFile.create(str(path), rank=0, world_size=1, links=1)
    marks.message(0, "s1", TAGS)
    marks.index[0] = 1
    assert read_marks(str(path), rank=0, world_size=1, links=1) is None  # this process's
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        written_by(path, sleeper.pid)
        assert read_marks(str(path), rank=0, world_size=1, links=1) is None
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait(timeout=30)
        assert read_marks(str(path), rank=0, world_size=1, links=1) == [("s1", 2, 1)]
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)


def test_a_zombie_or_a_reused_pid_is_a_dead_writer(tmp_path: Path) -> None:
    path = tmp_path / "mark"
    MarkFile.create(str(path), rank=0, world_size=1, links=1).message(0, "s1", TAGS)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Not reaped yet: a zombie once it exits (what a SIGKILLed rank is until its
        # launcher waits for it).
        wait_until(lambda: _state(child.pid) == b"Z", 30, "the child to exit, unreaped")
        written_by(path, child.pid)
        assert describe(str(path))[1] is False
    finally:
        child.wait(timeout=30)
    # A live process whose pid matches but whose start time does not: another process.
    words = memoryview(bytearray(path.read_bytes())).cast("q")
    words[_markfile._PID] = os.getppid()
    words[_markfile._START] = 1
    path.write_bytes(words.obj)
    assert describe(str(path))[1] is False


def test_another_job_s_or_another_user_s_or_a_broken_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "mark"
    MarkFile.create(str(path), rank=1, world_size=2, links=1).message(0, "s1", TAGS)
    written_by(path, dead_pid())
    assert read_marks(str(path), rank=0, world_size=2, links=1) is None  # another rank
    assert read_marks(str(path), rank=1, world_size=4, links=1) is None  # another job size
    assert read_marks(str(path), rank=1, world_size=2, links=2) is None  # other servers
    assert read_marks(str(tmp_path / "none"), rank=1, world_size=2, links=1) is None
    link = tmp_path / "link"
    link.symlink_to(path)
    assert read_marks(str(link), rank=1, world_size=2, links=1) is None  # never followed
    path.write_bytes(path.read_bytes()[:100])
    assert read_marks(str(path), rank=1, world_size=2, links=1) is None  # cut short
    path.write_bytes(b"\0" * 4096)
    assert read_marks(str(path), rank=1, world_size=2, links=1) is None  # not a mark file


def test_a_successor_carries_its_predecessor_s_marks_and_a_clean_close_removes_them(
    tmp_path: Path
) -> None:
    path = tmp_path / "mark"
    successor = MarkFile.create(str(path), rank=0, world_size=1, links=1,
                                carried=[("s1", 2, 5)])
    assert describe(str(path))[0] == [("s1", 2, 5)]  # killed before its first hand-out
    successor.message(0, "s1", np.array([[2, 6], [2, 7]]))
    assert describe(str(path))[0] == [("s1", 2, 5)]
    successor.close()
    assert not path.exists()


def test_the_file_is_named_after_the_job_and_the_user() -> None:
    one = mark_path(["tcp://h:1"], ["tcp://h:2"], "", 1, 2)
    assert one == mark_path(["tcp://h:1"], ["tcp://h:2"], "", 1, 2)
    assert str(os.getuid()) in os.path.basename(one)
    others = {mark_path(["tcp://h:1"], ["tcp://h:2"], "", 0, 2),
              mark_path(["tcp://h:1"], ["tcp://h:2"], "", 1, 3),
              mark_path(["tcp://h:1"], ["tcp://h:2"], "a", 1, 2),
              mark_path(["tcp://h:3"], ["tcp://h:2"], "", 1, 2)}
    assert one not in others and len(others) == 4


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as stat_file:
        return stat_file.read().rsplit(b")", 1)[1].split()[0]
