"""Half-open connections across the link: a trainer that vanished behind it, and one that
only stops reading, must not be told apart by waiting.

**A trainer vanishes.** Two free trainers in host B take one stream from the
server in host A. One of them reaches the server at another address of host A
(:meth:`~tests.multihost.hosts.TwoHosts.alias`); host B then drops whatever goes there
(:meth:`~tests.multihost.hosts.TwoHosts.cut`) and that trainer is SIGKILLed: every
connection of the server to it is half-open (the server is sending to it, with data
unacknowledged; no FIN or RST ever comes), while the other trainer's, on the same link, go
on. Host A's kernel must close all of them within ``HALF_OPEN_TIMEOUT`` of the cut (plus
a heartbeat: a connection quiet at the cut has its first unacknowledged byte within one),
while the server is still serving the other trainer. Without the bound the data
connection was still established and retransmitting when the test gave up, and the
control connections libzmq had dropped (ZMTP heartbeats) still waited for their FIN to be
acknowledged (the kernel's own limit, ``net.ipv4.tcp_retries2``, is about 15 minutes). The
other trainer goes on to the end, with every sample of each epoch handed out once across
the two (the gone trainer's last hand-outs, whose acknowledgements could not cross, may
come again to the other: its last ``hwm`` messages).

**A trainer stops reading.** Linux applies ``TCP_USER_TIMEOUT`` to a receive window that
stays closed as well (tcp(7)). A trainer that reads nothing for longer than the bound (a
long step, a validation pass) must keep its data connection and every sample queued for
it. (The at-most-once plain delivery, gone since, closed a trainer's window with its full
queue, and its data socket went without the bound for it; every trainer now grants credit,
so the server sends no more than its trainer's libzmq takes in.)
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from feedmux._plumbing.sockets import HALF_OPEN_TIMEOUT, HEARTBEAT_INTERVAL
from tests.integration.conftest import Spawned, holds_for, wait_until
from tests.multihost.hosts import TwoHosts
from tests.multihost.test_compression import stats_in_a
from tests.multihost.test_host_faults import TRAINER_HWM, any_port, finished, read, serve_at
from tests.multihost.test_two_hosts import trainer_in

#: Where the server binds so that both of host A's addresses reach it.
ANYWHERE = "tcp://0.0.0.0:0"
#: How long after the cut host A may still hold a connection to the vanished trainer: the
#: bound, counted from the oldest unacknowledged byte, which a connection quiet at the cut
#: gets within a heartbeat (a ZMTP ping, a reliable data heartbeat).
CLOSED_BOUND = HALF_OPEN_TIMEOUT + HEARTBEAT_INTERVAL
#: Added to a bound observed by polling ``ss`` in host A: a loaded machine runs each look
#: (a process started in the namespace) and the kernel's timers late.
MARGIN = 3.0
#: 3 epochs of 2000 samples of 4 KiB, 8 a message: after the cut the other trainer alone
#: needs 25 s at least (``STEP_MS`` a sample), so the stream outlasts the wait for the cut
#: connections to close.
PER_STREAM = 500
EPOCH = 4 * PER_STREAM
EPOCHS = 3
SAMPLES_PER_MESSAGE = 8
STEP_MS = "5"


def at(endpoint: str, address: str) -> str:
    """``endpoint`` (bound on every address) as reached at ``address``."""
    return endpoint.replace("0.0.0.0", address)


def trainer_at(hosts: TwoHosts, server: Spawned, address: str, out: Path,
               *flags: str) -> subprocess.Popen[bytes]:
    """``tests.integration.trainers`` in host B, reaching the server at ``address``."""
    return hosts.python("b", "-m", "tests.integration.trainers", at(server.data, address),
                        at(server.control, address), str(out), *flags, stderr=subprocess.PIPE)


def unacknowledged(line: str) -> int:
    """Bytes of one ``ss`` line not yet acknowledged or not yet sent (its Send-Q)."""
    return int(line.split()[2])


@pytest.mark.timeout(180)
def test_a_vanished_reliable_trainers_connections_close_within_the_bound(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    doomed_address = hosts.alias("a")
    server = serve_at(
        hosts, ANYWHERE, ANYWHERE, "--arg", f"per_stream={PER_STREAM}", "--arg", "width=1024",
        "--epochs", str(EPOCHS), "--samples-per-message", str(SAMPLES_PER_MESSAGE), "--hwm",
        "4", "--min-trainers", "2", "--compress", "off")
    near, far = tmp_path / "survivor", tmp_path / "doomed"
    survivor = trainer_at(hosts, server, hosts.address("a"), near, "--step-ms", STEP_MS)
    doomed = trainer_at(hosts, server, doomed_address, far, "--step-ms", STEP_MS)
    wait_until(lambda: len(read(near)) >= 200 and len(read(far)) >= 200, 60,
               "both trainers at 200 samples")
    # Its data, control and acknowledging connections, each seen by the server's end.
    wait_until(lambda: len(hosts.connections("a", doomed_address)) >= 3, 10,
               "the doomed trainer's three connections")
    hosts.cut("b", doomed_address)
    cut = time.monotonic()
    doomed.kill()
    doomed.wait(timeout=10)
    in_flight = 0
    left: list[str] = []

    def closed() -> bool:
        nonlocal in_flight, left
        left = hosts.connections("a", doomed_address)
        in_flight = max([in_flight, *(unacknowledged(line) for line in left)])
        return not left

    try:
        wait_until(closed, CLOSED_BOUND + MARGIN, "host A to close the vanished trainer's "
                   "connections")
    except AssertionError as error:
        raise AssertionError(f"{error}; still there:\n" + "\n".join(left)) from None
    let_go = time.monotonic() - cut
    running = server.returncode is None and survivor.poll() is None
    assert running, "the stream ended before the check: the server's exit closed them"
    assert in_flight > 0, "no data was in flight to the vanished trainer: not the case tested"
    counted = stats_in_a(hosts, at(server.control, hosts.address("a")), 5)
    assert counted.get("connected_trainers") == 1, counted
    handed_on = len(read(near))
    finished([survivor])
    assert server.wait(timeout=60) == 0, server.stderr
    gone, rest = read(far), read(near)
    assert len(rest) > handed_on, "the other trainer got nothing after the cut"
    print(f"closed {let_go:.1f} s after the cut ({in_flight} bytes were unacknowledged); "
          f"the gone trainer handed out {len(gone)}, the other {len(rest)}")
    for epoch in range(1, EPOCHS + 1):
        ids = Counter(row[1] for row in gone + rest if row[0] == epoch)
        assert sorted(ids) == list(range(EPOCH)), f"epoch {epoch}: samples lost"
    assert len(set(rest)) == len(rest), "the trainer that went on got a sample twice"
    repeated = set(gone) & set(rest)
    last = set(gone[-(TRAINER_HWM + 1) * SAMPLES_PER_MESSAGE:])
    assert repeated <= last, f"repeats not among the gone trainer's last: {repeated - last}"


#: Seconds the paused trainer reads nothing: past the bound, so that a kernel applying it to
#: the closed window would have cut the connection off.
PAUSE = HALF_OPEN_TIMEOUT + 5.0
#: Samples of 16 KiB, 8 a message: what the paused trainer's queue, its kernel's buffer and
#: the server's hold is a small part of the stream, so the server has more for it and its
#: window closes.
PAUSE_PER_STREAM = 100
PAUSE_EPOCH = 4 * PAUSE_PER_STREAM
PAUSE_EPOCHS = 2


@pytest.mark.timeout(150)
def test_a_trainer_that_reads_nothing_past_the_bound_keeps_its_connection(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    server = serve_at(
        hosts, *any_port(hosts), "--arg", f"per_stream={PAUSE_PER_STREAM}", "--arg",
        "width=4096", "--epochs", str(PAUSE_EPOCHS), "--samples-per-message",
        str(SAMPLES_PER_MESSAGE), "--hwm", "4", "--compress", "off")
    out, go = tmp_path / "paused", tmp_path / "go"
    trainer = trainer_in(hosts, "b", server, out, "--hold-after", "40", "--go-file", str(go),
                         stderr=subprocess.PIPE)
    wait_until(lambda: len(read(out)) >= 40, 60, "the trainer's first 40 samples")
    data_port = server.data.rsplit(":", 1)[1]

    def data_connection() -> list[str]:
        return [line for line in hosts.connections("a", hosts.address("b"))
                if line.split()[3].endswith(f":{data_port}")]

    # Every free trainer grants credit now (the one free delivery): the server sends no more
    # than the paused trainer granted, so its kernel may hold no unsent bytes for it; what
    # is checked is that the connection of a trainer that reads nothing is kept.
    wait_until(lambda: len(data_connection()) == 1, 30,
               "the server's data connection to the paused trainer")
    ends = [line.split()[3:5] for line in data_connection()]
    assert holds_for(lambda: [line.split()[3:5] for line in data_connection()] == ends, PAUSE), (
        f"the paused trainer's data connection was closed within {PAUSE:g} s of not reading")
    assert len(read(out)) == 40 and trainer.poll() is None, "the trainer did not pause"
    go.touch()
    finished([trainer])
    assert server.wait(timeout=60) == 0, server.stderr
    rows = read(out)
    for epoch in range(1, PAUSE_EPOCHS + 1):
        ids = Counter(row[1] for row in rows if row[0] == epoch)
        lost = sorted(set(range(PAUSE_EPOCH)) - set(ids))
        assert not lost and set(ids.values()) == {1}, f"epoch {epoch}: lost {lost[:20]}"
