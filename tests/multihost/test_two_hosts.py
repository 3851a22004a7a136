"""A server in host A, trainers in host B, over TCP on the veth link between them.

The trainers must get exact epochs, and must not take the shared-memory path: host B's
``/dev/shm`` is not host A's, so the pool the server offers cannot be mapped there. The
same trainer started in host A (the control) does map it, so the test can tell the two.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Spawned
from tests.multihost.hosts import ROOT, TwoHosts, sweep

pytestmark = pytest.mark.timeout(120)

SAMPLER = "tests.integration.samplers:numbered"
EPOCH = 64  # 4 streams x 16
EPOCHS = 2


def serve_in(hosts: TwoHosts, *args: str) -> Spawned:
    """``feedmux serve`` in host A on its link address (port 0), bound."""
    address = hosts.address("a")
    server = Spawned(hosts.python(
        "a", "-m", "feedmux", "serve", SAMPLER, "--bind", f"tcp://{address}:0",
        "--control", f"tcp://{address}:0", *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    server.endpoints()
    return server


def trainer_in(hosts: TwoHosts, host: str, server: Spawned, out: Path,
               *flags: str, **options: Any) -> subprocess.Popen[bytes]:
    """``tests.integration.trainers`` in ``host``, recording into ``out``."""
    return hosts.python(host, "-m", "tests.integration.trainers", server.data,
                        server.control, str(out), *flags, **options)


def records(path: Path) -> list[tuple[int, int]]:
    return [(int(line.split()[0]), int(line.split()[1]))
            for line in path.read_text().splitlines()]


def test_a_trainer_on_another_host_gets_exact_epochs_over_tcp_not_shared_memory(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    # 16 samples of 32 KiB a message: a 512 KiB array frame, above the pool's threshold,
    # so a trainer that maps the pool gets every message as references.
    args = ("--arg", "streams=4", "--arg", "per_stream=16", "--arg", "width=8192",
            "--epochs", str(EPOCHS), "--samples-per-message", "16", "--shm-size", "64")
    seen = {}
    for host in ("b", "a"):
        server = serve_in(hosts, *args)
        assert server.data.startswith(f"tcp://{hosts.address('a')}:")
        out = tmp_path / f"trainer-{host}"
        trainer = trainer_in(hosts, host, server, out, "--views-out", str(out) + ".views")
        assert trainer.wait(timeout=60) == 0
        assert server.wait(timeout=30) == 0, server.stderr
        got = records(out)
        for epoch in range(1, EPOCHS + 1):
            ids = Counter(sample_id for e, sample_id in got if e == epoch)
            assert sorted(ids) == list(range(EPOCH)) and set(ids.values()) == {1}, (
                f"host {host}, epoch {epoch}: not every sample exactly once")
        assert len(got) == EPOCH * EPOCHS
        seen[host] = int(Path(str(out) + ".views").read_text())
    assert seen["b"] == 0, "a trainer on another host received shared-memory views"
    assert seen["a"] > 0, "the same-host control took no shared-memory views"


def test_the_hosts_have_their_own_addresses_and_their_own_dev_shm(hosts: TwoHosts) -> None:
    marker = f"feedmux-hosts-marker-{hosts.names['a']}"
    assert hosts.run("a", ["touch", f"/dev/shm/{marker}"]).returncode == 0
    assert hosts.run("a", ["ls", "/dev/shm"]).stdout.split() == [marker]
    assert hosts.run("b", ["ls", "/dev/shm"]).stdout.split() == []
    assert not Path(f"/dev/shm/{marker}").exists()  # the machine's own is untouched
    shown = hosts.run("b", ["ip", "-o", "-4", "addr", "show"]).stdout
    assert f"{hosts.address('b')}/24" in shown and hosts.address("a") not in shown


def test_what_a_sigkilled_harness_left_is_swept(hosts: TwoHosts, tmp_path: Path) -> None:
    # A harness process SIGKILLed with its hosts made: nothing of it ran its clean-up.
    script = ("import os, signal\nfrom tests.multihost.hosts import TwoHosts\n"
              "h = TwoHosts()\nprint(' '.join(h.names.values()), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -9
    left = done.stdout.split()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=30).stdout
    assert left and all(name in listed for name in left)
    assert set(left) <= set(sweep())
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=30).stdout
    assert not any(name in listed for name in left)
