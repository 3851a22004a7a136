"""The harness's :class:`Spawned`: a process it started is never held up by its own output.

A pipe holds 64 KiB; a process whose pipe nobody reads blocks in its next write. A server
logs a line per epoch, so one serving short epochs while the test only waited on a trainer
stopped, mid-stream, after 864 of them: its main thread was blocked in a log write, and
data and control with it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import Spawned

pytestmark = pytest.mark.timeout(60)

#: Bytes each stream writes: four pipes' worth.
WRITTEN = 4 * 65536

_WRITER = f"""
import sys
line = "x" * 99 + "\\n"
for _ in range({WRITTEN} // len(line)):
    sys.stderr.write(line)
    sys.stdout.write(line)
sys.stderr.write("done\\n")
"""


def test_a_process_that_writes_more_than_a_pipe_holds_runs_to_its_end_unread() -> None:
    spawned = Spawned(subprocess.Popen([sys.executable, "-c", _WRITER],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    try:
        # The test reads nothing while it waits: only the process's exit is awaited.
        assert spawned.process.wait(timeout=20) == 0
    finally:
        spawned.kill()
    assert spawned.wait(timeout=10) == 0
    assert spawned.stderr.endswith("done\n")
    assert len(spawned.stderr) == WRITTEN // 100 * 100 + len("done\n")
    assert len(spawned.stdout) == WRITTEN // 100 * 100


def test_a_wait_for_stdout_sees_each_line_as_it_comes_and_fails_at_the_exit() -> None:
    echo = "import sys\nfor line in sys.stdin:\n    print(line.strip().upper(), flush=True)\n"
    spawned = Spawned(subprocess.Popen([sys.executable, "-c", echo], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    assert spawned.process.stdin is not None
    try:
        for count, word in enumerate(["one", "two"], start=1):
            spawned.process.stdin.write(f"{word}\n".encode())
            spawned.process.stdin.flush()
            spawned.wait_for_stdout(lambda text, count=count: text.count("\n") == count,
                                    timeout=20, what=f"answer {count}")
        assert spawned.stdout == "ONE\nTWO\n"
        spawned.process.stdin.close()
        with pytest.raises(AssertionError, match=r"exited .* before a third answer"):
            spawned.wait_for_stdout(lambda text: text.count("\n") == 3, timeout=20,
                                    what="a third answer")
    finally:
        spawned.kill()
    assert spawned.wait(timeout=10) == 0
