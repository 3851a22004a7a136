"""``feedmux top`` in a real terminal: a pseudo-terminal, and a tmux pane when tmux is there."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from feedmux.client.remote import RemoteLoader, fetch_stats
from feedmux.server.server import Server
from tests.integration.conftest import ROOT, wait_until

pytestmark = pytest.mark.timeout(90)

SENT = re.compile(r"(\d+) samples sent")


@pytest.fixture
def busy_server() -> Iterator[Server]:
    """An endless server with a trainer taking its samples, so the figures move."""
    server = Server("tests.integration.samplers:numbered", factory_kwargs={"delay": 0.002},
                    bind="tcp://127.0.0.1:0").start()
    stop = threading.Event()
    errors: list[BaseException] = []

    def train() -> None:
        try:
            with RemoteLoader(server.data_address, control=server.control_address,
                              timeout=20) as loader:
                for _ in loader:
                    if stop.is_set():
                        return
        except BaseException as error:  # reported after the join
            errors.append(error)

    trainer = threading.Thread(target=train)
    trainer.start()
    yield server
    stop.set()
    trainer.join(30)
    assert not trainer.is_alive() and not errors
    assert server.stop() is not None


def command(address: str) -> list[str]:
    return [sys.executable, "-m", "feedmux", "top", address, "--interval", "0.3"]


def test_top_in_a_pseudo_terminal_redraws_moving_figures_and_quits_on_q(
    busy_server: Server,
) -> None:
    master, slave = os.openpty()
    process = subprocess.Popen(
        command(busy_server.control_address), stdin=slave, stdout=slave, stderr=slave,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"},
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    try:
        def frames() -> list[str]:
            nonlocal output
            while select.select([master], [], [], 0.05)[0]:
                try:
                    output += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
            return [part for part in output.decode(errors="replace").split("\x1b[2J")
                    if SENT.search(part)]

        def figures_moved() -> bool:
            sent = [int(SENT.search(part).group(1)) for part in frames()]  # type: ignore[union-attr]
            return len(sent) >= 2 and sent[-1] > sent[0] > 0

        wait_until(figures_moved, 30, "two frames of feedmux top with growing figures")
        screen = frames()[-1]
        assert f"at {busy_server.control_address}" in screen
        assert "samples/s" in screen and "sampling" in screen and "trainer " in screen
        assert output.startswith(b"\x1b[?1049h")  # the alternate screen
        os.write(master, b"q")
        assert process.wait(timeout=10) == 0
        frames()
        assert b"\x1b[?1049l" in output  # and back to the shell's screen
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(master)


def test_top_without_a_terminal_prints_plain_lines(busy_server: Server) -> None:
    result = subprocess.run(
        [*command(busy_server.control_address), "--count", "2"], capture_output=True, text=True,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=30, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert len(SENT.findall(result.stdout)) == 2


def test_top_says_which_server_is_unreachable(busy_server: Server) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "feedmux", "top", busy_server.control_address,
         "tcp://127.0.0.1:1", "--count", "1", "--timeout", "0.5"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=30, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "server at tcp://127.0.0.1:1: unreachable (no answer" in result.stdout
    assert SENT.search(result.stdout)


@pytest.mark.skipif(shutil.which("tmux") is None,
                    reason="tmux is not installed: the pseudo-terminal test covers feedmux top")
def test_top_in_a_tmux_pane(busy_server: Server) -> None:
    socket = f"feedmux-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", socket]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TMUX", None)
    shell_command = " ".join(command(busy_server.control_address))
    subprocess.run([*tmux, "new-session", "-d", "-x", "150", "-y", "40", "-c", str(ROOT),
                    shell_command], env=env, check=True, timeout=10)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p"], env=env, capture_output=True,
                                  text=True, timeout=10, check=False).stdout

        seen: list[int] = []

        def figures_moved() -> bool:
            found = SENT.search(screen())
            if found:
                seen.append(int(found.group(1)))
            return len(seen) >= 2 and seen[-1] > seen[0] > 0

        wait_until(figures_moved, 30, "the tmux pane to show growing figures")
        assert "samples/s" in screen()
        subprocess.run([*tmux, "send-keys", "q"], env=env, check=True, timeout=10)

        def session_gone() -> bool:
            return subprocess.run([*tmux, "has-session"], env=env, capture_output=True,
                                  timeout=10, check=False).returncode != 0

        wait_until(session_gone, 10, "feedmux top to quit on q")
    finally:
        subprocess.run([*tmux, "kill-server"], env=env, capture_output=True, timeout=10,
                       check=False)


def test_top_shows_each_ranked_trainer_with_its_rank() -> None:
    server = Server("tests.integration.samplers:numbered", bind="tcp://127.0.0.1:0",
                    control="tcp://127.0.0.1:0", epochs=1, epoch_size=200).start()
    looked = threading.Event()
    errors: list[BaseException] = []
    taken = [0, 0]

    def train(rank: int) -> None:
        try:
            with RemoteLoader(server.data_address, control=server.control_address, timeout=20,
                              rank=rank, world_size=2, client_id=f"ranked-{rank}") as loader:
                for _ in loader:
                    taken[rank] += 1
                    if taken[rank] == 5:
                        looked.wait(30)  # hold the rank (and the server) while top looks
        except BaseException as error:  # reported after the join
            errors.append(error)

    trainers = [threading.Thread(target=train, args=(rank,)) for rank in range(2)]
    for trainer in trainers:
        trainer.start()
    try:
        def both_ranks_in_stats() -> bool:
            stats = fetch_stats(server.control_address, timeout=2.0)
            return all(f"trainer.ranked-{rank}.rank" in stats for rank in range(2))

        wait_until(both_ranks_in_stats, 20, "both ranks in the server's statistics")
        stats = fetch_stats(server.control_address, timeout=2.0)
        assert [stats[f"trainer.ranked-{rank}.rank"] for rank in range(2)] == [0, 1]
        assert stats["world_size"] == 2
        assert stats["rank_messages_kept"] >= 0 and stats["rank_messages_resent"] == 0
        result = subprocess.run(
            [*command(server.control_address), "--count", "1"], capture_output=True, text=True,
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=30, check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "trainer ranked-0: rank 0," in result.stdout
        assert "trainer ranked-1: rank 1," in result.stdout
    finally:
        looked.set()
        for trainer in trainers:
            trainer.join(30)
        exitcode = server.join(timeout=30)
        if exitcode is None:
            server.stop()
    assert not any(trainer.is_alive() for trainer in trainers) and not errors
    assert taken == [100, 100]
    assert exitcode == 0
